// Package tlstest makes throwaway certificate authorities and certificates
// for tests of pdserve's TLS options: an ECDSA P-256 CA, and leaf
// certificates it signs, written as PEM files into a test's temporary
// directory. Nothing here is fit for production use.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a self-signed certificate authority. Its methods are safe for
// concurrent use.
type CA struct {
	// CertFile is the PEM file of the CA certificate (a --tls-ca value).
	CertFile string
	// Cert is the CA certificate.
	Cert *x509.Certificate

	key    *ecdsa.PrivateKey
	dir    string
	serial atomic.Int64
}

// Pair is a certificate and its key, as PEM files.
type Pair struct {
	CertFile, KeyFile string
	Cert              *x509.Certificate
}

// Leaf describes a certificate to issue. The zero value is a certificate
// for the name "localhost", valid for server and client authentication
// from an hour ago for a day.
type Leaf struct {
	// DNSNames, IPs and URIs are the subject alternative names (URIs:
	// identities such as spiffe://cluster.local/ns/pdserve/sa/prefill).
	// All empty: "localhost".
	DNSNames []string
	IPs      []net.IP
	URIs     []*url.URL
	// Usages are the extended key usages. Nil: server and client auth.
	Usages []x509.ExtKeyUsage
	// NotBefore and NotAfter bound the validity. Zero: an hour ago, a day
	// from now.
	NotBefore, NotAfter time.Time
}

// NewCA makes a CA named name and writes its certificate into a temporary
// directory of tb. It fails tb on error.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key := newKey(tb)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("tlstest: create CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("tlstest: parse CA certificate: %v", err)
	}
	ca := &CA{Cert: cert, key: key, dir: tb.TempDir()}
	ca.serial.Store(1)
	ca.CertFile = filepath.Join(ca.dir, "ca.crt")
	WriteFile(tb, ca.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return ca
}

// Issue signs a certificate for l with a new key and writes both into the
// CA's directory (files named after the serial number). It fails tb on
// error.
func (ca *CA) Issue(tb testing.TB, l Leaf) Pair {
	tb.Helper()
	key := newKey(tb)
	now := time.Now()
	if l.NotBefore.IsZero() {
		l.NotBefore = now.Add(-time.Hour)
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = now.Add(24 * time.Hour)
	}
	if len(l.DNSNames) == 0 && len(l.IPs) == 0 && len(l.URIs) == 0 {
		l.DNSNames = []string{"localhost"}
	}
	if l.Usages == nil {
		l.Usages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	serial := ca.serial.Add(1)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "pdserve test leaf"},
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  l.Usages,
		DNSNames:     l.DNSNames,
		IPAddresses:  l.IPs,
		URIs:         l.URIs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("tlstest: create certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("tlstest: parse certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("tlstest: marshal key: %v", err)
	}
	base := filepath.Join(ca.dir, big.NewInt(serial).String())
	p := Pair{CertFile: base + ".crt", KeyFile: base + ".key", Cert: cert}
	WriteFile(tb, p.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	WriteFile(tb, p.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	return p
}

// PKI is a CA and a certificate it issued for one DNS name, the server
// name a component's peers verify.
type PKI struct {
	CA   *CA
	Leaf Pair
}

// NewPKI returns a new CA named caName and a certificate it issues for
// serverName, for server and client authentication.
func NewPKI(tb testing.TB, caName, serverName string) PKI {
	tb.Helper()
	ca := NewCA(tb, caName)
	return PKI{CA: ca, Leaf: ca.Issue(tb, Leaf{DNSNames: []string{serverName}})}
}

// MustURL parses s as a URI SAN for Leaf.URIs, failing tb on error.
func MustURL(tb testing.TB, s string) *url.URL {
	tb.Helper()
	u, err := url.Parse(s)
	if err != nil {
		tb.Fatalf("tlstest: %v", err)
	}
	return u
}

// WriteFile writes data to path with mode 0600, failing tb on error.
func WriteFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatalf("tlstest: %v", err)
	}
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("tlstest: generate key: %v", err)
	}
	return key
}
