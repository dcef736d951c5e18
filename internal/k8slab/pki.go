package k8slab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certSpec is one certificate signed by the lab's CA.
type certSpec struct {
	name   string   // file stem under pki/: NAME.crt, NAME.key
	cn     string   // subject common name (the Kubernetes user)
	orgs   []string // subject organisations (the Kubernetes groups)
	dns    []string
	ips    []net.IP
	server bool
	client bool
}

func certSpecs(nodeIP net.IP) []certSpec {
	lo := net.ParseIP("127.0.0.1")
	return []certSpec{
		{name: "apiserver", cn: "kube-apiserver", server: true,
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + ClusterDNS, "localhost"},
			ips: []net.IP{lo, nodeIP, net.ParseIP(APIServiceIP)}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}, client: true},
		{name: "apiserver-etcd-client", cn: "kube-apiserver-etcd-client", client: true},
		{name: "etcd-server", cn: "etcd", server: true, dns: []string{"localhost"}, ips: []net.IP{lo}},
		{name: "admin", cn: "kubernetes-admin", orgs: []string{"system:masters"}, client: true},
		{name: "controller-manager", cn: "system:kube-controller-manager", client: true},
		{name: "scheduler", cn: "system:kube-scheduler", client: true},
		{name: "kubelet-client", cn: "system:node:" + NodeName, orgs: []string{"system:nodes"}, client: true},
		{name: "kubelet-server", cn: NodeName, server: true, dns: []string{NodeName}, ips: []net.IP{nodeIP}},
		{name: "kube-proxy", cn: "system:kube-proxy", client: true},
		{name: "kwok", cn: "kwok-controller", orgs: []string{"system:masters"}, client: true},
	}
}

// ensurePKI writes the CA, every certificate and the service-account key
// pair under dir, keeping what already exists (so a second Up reuses them).
func ensurePKI(dir string, nodeIP net.IP) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("k8slab: pki: %w", err)
	}
	caCert, caKey, err := loadOrCreateCA(dir)
	if err != nil {
		return fmt.Errorf("k8slab: pki: ca: %w", err)
	}
	for _, s := range certSpecs(nodeIP) {
		if exists(filepath.Join(dir, s.name+".crt")) && exists(filepath.Join(dir, s.name+".key")) {
			continue
		}
		if err := issue(dir, s, caCert, caKey); err != nil {
			return fmt.Errorf("k8slab: pki: %s: %w", s.name, err)
		}
	}
	if !exists(filepath.Join(dir, "sa.key")) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		if err := writeKey(filepath.Join(dir, "sa.key"), key); err != nil {
			return fmt.Errorf("k8slab: pki: sa: %w", err)
		}
		pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
			return fmt.Errorf("k8slab: pki: sa: %w", err)
		}
	}
	return nil
}

func loadOrCreateCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	crtPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if exists(crtPath) && exists(keyPath) {
		return loadPair(crtPath, keyPath)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "pdserve-k8s-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(1, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(crtPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func issue(dir string, s certSpec, ca *x509.Certificate, caKey *ecdsa.PrivateKey) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: s.cn, Organization: s.orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     ca.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		DNSNames:     s.dns,
		IPAddresses:  s.ips,
	}
	if s.server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if s.client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, s.name+".key"), key); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, s.name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

func loadPair(crtPath, keyPath string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	crtPEM, err := os.ReadFile(crtPath)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(crtPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	return cert, key, err
}
