package kvtransfer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// selfSigned returns a server certificate for 127.0.0.1 and a pool that
// trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "pdserve test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func TestTLS(t *testing.T) {
	verifyNoLeaks(t)
	cert, pool := selfSigned(t)
	r := &fakeReceiver{}
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	addr := startServer(t, r, nil, grpc.Creds(creds))
	h := testShape
	h.Codec = "bf16"
	kv := testKV(h)

	d := NewDialer(WithTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}))
	defer d.Close()
	s, err := d.Open(context.Background(), addr, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := sendAll(s, kv, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(context.Background(), Commit{FirstToken: 3}); err != nil {
		t.Fatal(err)
	}
	layers, _, _, _ := r.onlySink(t).state()
	if !cmp.Equal(kv, layers) {
		t.Error("KV differs after a TLS transfer")
	}

	// A plaintext Dialer cannot talk to the TLS server, nor a TLS Dialer
	// that does not trust its certificate.
	for name, opts := range map[string][]DialOption{
		"plaintext": nil,
		"untrusted": {WithTLS(&tls.Config{MinVersion: tls.VersionTLS13})},
	} {
		pd := NewDialer(opts...)
		_, err := pd.Open(context.Background(), addr, h)
		if code := status.Code(err); code != codes.Unavailable {
			t.Errorf("%s: Open = %v, want Unavailable", name, err)
		}
		if err := pd.Close(); err != nil {
			t.Error(err)
		}
	}
}
