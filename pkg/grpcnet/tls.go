package grpcnet

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// TLSOptions configure TLS on the gRPC connections between pdserve
// components: the coordinator's calls to workers, and the KV transfers
// from prefill to decode workers. All fields empty: plaintext. The files
// are PEM; Validate reads them to report problems before anything starts,
// and Load reads them again to use them.
//
// Every component uses the same four settings (the Helm chart mounts one
// kubernetes.io/tls Secret into all of them):
//   - a gRPC server (every worker) serves CertFile, and when CAFile is
//     given requires client certificates signed by it (mutual TLS);
//   - a gRPC client (the coordinator, a prefill worker's KV transfer
//     dialer) verifies servers against CAFile, checking ServerName instead
//     of the host it dials, and presents CertFile as its client certificate
//     when one is given.
//
// So the certificate must allow server and client authentication (or name
// no extended key usage), and name ServerName as a DNS name.
type TLSOptions struct {
	// CertFile is this component's certificate, followed by any
	// intermediates (--tls-cert). Needs KeyFile.
	CertFile string
	// KeyFile is the private key of CertFile (--tls-key).
	KeyFile string
	// CAFile holds the CA certificates that sign the peers' certificates
	// (--tls-ca).
	CAFile string
	// ServerName is the name clients verify in a server's certificate in
	// place of the host they dial: workers are dialed by pod IP
	// (--tls-server-name). Empty: the dialed host. Needs CAFile.
	ServerName string
}

// TLSUse says what a component does over gRPC; it decides which TLS
// settings Validate and Load require.
type TLSUse uint8

// TLS uses; combine with |.
const (
	// TLSServe: the component serves gRPC; TLS needs a certificate and key.
	TLSServe TLSUse = 1 << iota
	// TLSDial: the component dials gRPC servers; TLS needs a CA to verify
	// them.
	TLSDial
)

// AddFlags registers --tls-cert, --tls-key, --tls-ca and --tls-server-name
// on fs with o's values as defaults.
func (o *TLSOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.CertFile, "tls-cert", o.CertFile, "PEM certificate (chain) for gRPC between components: served by a worker, presented as client certificate when dialing; needs --tls-key (empty: plaintext gRPC)")
	fs.StringVar(&o.KeyFile, "tls-key", o.KeyFile, "PEM private key of --tls-cert")
	fs.StringVar(&o.CAFile, "tls-ca", o.CAFile, "PEM CA certificates: gRPC clients verify servers against them; a worker given them requires client certificates they sign (mutual TLS)")
	fs.StringVar(&o.ServerName, "tls-server-name", o.ServerName, "name verified in gRPC servers' certificates instead of the dialed host (workers are dialed by IP); needs --tls-ca")
}

// Enabled reports whether any TLS setting is given.
func (o TLSOptions) Enabled() bool {
	return o.CertFile != "" || o.KeyFile != "" || o.CAFile != "" || o.ServerName != ""
}

// Validate checks the settings for a component that does use, and reads
// and checks the files: certificate and key must match, be unexpired, and
// allow the use (server authentication to serve, and then ServerName as a
// name; client authentication to dial); the CA file must hold certificates
// and nothing else. It reports every problem in one error; nil when TLS is
// off.
func (o TLSOptions) Validate(use TLSUse) error {
	_, err := o.load(use, time.Now())
	return err
}

// LogFields returns the settings as zap fields.
func (o TLSOptions) LogFields() []zap.Field {
	return []zap.Field{
		zap.String("tls_cert", o.CertFile), zap.String("tls_key", o.KeyFile),
		zap.String("tls_ca", o.CAFile), zap.String("tls_server_name", o.ServerName),
	}
}

// Load validates the settings for use (see Validate) and returns the
// loaded TLS material, or nil (plaintext) when no setting is given. The
// certificate and key are read again whenever a connection handshakes,
// so a renewed certificate (a Secret updated in place) takes effect for
// new connections without a restart; a pair that fails to load then is
// logged on log and the previous one kept. The CA file is read once:
// replacing the CA needs a restart. Errors: as Validate.
func (o TLSOptions) Load(use TLSUse, log *zap.Logger) (*TLS, error) {
	t, err := o.load(use, time.Now())
	if t != nil {
		t.log = log
		if t.log == nil {
			t.log = zap.NewNop()
		}
	}
	return t, err
}

func (o TLSOptions) load(use TLSUse, now time.Time) (*TLS, error) {
	if !o.Enabled() {
		return nil, nil
	}
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch {
	case (o.CertFile == "") != (o.KeyFile == ""):
		bad("tls-cert and tls-key must be given together (tls-cert %q, tls-key %q)", o.CertFile, o.KeyFile)
	case o.CertFile == "" && use&TLSServe != 0:
		bad("tls-cert and tls-key are required with tls-ca or tls-server-name: this component serves gRPC, over TLS it needs a certificate")
	}
	if o.CAFile == "" {
		switch {
		case use&TLSDial != 0:
			bad("tls-ca is required with TLS: this component dials other components and verifies their certificates against it")
		case o.ServerName != "":
			bad("tls-server-name %q needs tls-ca: the name is only checked when verifying peers", o.ServerName)
		}
	}
	t := &TLS{certFile: o.CertFile, keyFile: o.KeyFile, serverName: o.ServerName}
	if o.CertFile != "" && o.KeyFile != "" {
		if err := t.loadPair(); err != nil {
			errs = append(errs, err)
		} else if err := checkLeaf(t.cert.Leaf, o, use, now); err != nil {
			errs = append(errs, err)
		}
	}
	if o.CAFile != "" {
		var err error
		if t.pool, err = loadCAs(o.CAFile); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// checkLeaf checks that the certificate suits use.
func checkLeaf(leaf *x509.Certificate, o TLSOptions, use TLSUse, now time.Time) error {
	var errs []error
	if now.After(leaf.NotAfter) {
		errs = append(errs, fmt.Errorf("tls-cert %s expired at %s", o.CertFile, leaf.NotAfter.UTC().Format(time.RFC3339)))
	}
	allows := func(u x509.ExtKeyUsage) bool {
		return len(leaf.ExtKeyUsage) == 0 || slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny) || slices.Contains(leaf.ExtKeyUsage, u)
	}
	if use&TLSServe != 0 {
		if !allows(x509.ExtKeyUsageServerAuth) {
			errs = append(errs, fmt.Errorf("tls-cert %s does not allow server authentication (extended key usage), which a gRPC server needs", o.CertFile))
		}
		if o.ServerName != "" {
			if err := leaf.VerifyHostname(o.ServerName); err != nil {
				errs = append(errs, fmt.Errorf("tls-cert %s is not valid for tls-server-name %q, which clients verify (its names: %s)",
					o.CertFile, o.ServerName, strings.Join(certNames(leaf), ", ")))
			}
		}
	}
	if use&TLSDial != 0 && !allows(x509.ExtKeyUsageClientAuth) {
		errs = append(errs, fmt.Errorf("tls-cert %s does not allow client authentication (extended key usage), which this component needs to present it when dialing", o.CertFile))
	}
	return errors.Join(errs...)
}

func certNames(c *x509.Certificate) []string {
	names := slices.Clone(c.DNSNames)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 {
		names = []string{"none"}
	}
	return names
}

// loadCAs reads a PEM file of CA certificates. Unlike
// x509.CertPool.AppendCertsFromPEM it reports a block that fails to parse.
func loadCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("tls-ca %s: PEM block %d is a %q, want only CERTIFICATE blocks", path, n+1, b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("tls-ca %s: certificate %d: %w", path, n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("tls-ca %s: no PEM certificate found", path)
	}
	return pool, nil
}

// TLS is a component's loaded TLS material: the gRPC server and client
// credentials built from TLSOptions. A nil *TLS means plaintext; its
// methods return plaintext credentials and nil configs. Safe for
// concurrent use.
type TLS struct {
	certFile, keyFile string
	serverName        string
	pool              *x509.CertPool // nil without a CA file
	log               *zap.Logger

	mu              sync.Mutex
	certPEM, keyPEM []byte // what cert was parsed from
	cert            *tls.Certificate
}

// loadPair reads the certificate and key files; when they changed since
// the last load, it parses them and replaces the pair. Errors name the
// files.
func (t *TLS) loadPair() error {
	certPEM, err := os.ReadFile(t.certFile)
	if err != nil {
		return fmt.Errorf("tls-cert: %w", err)
	}
	keyPEM, err := os.ReadFile(t.keyFile)
	if err != nil {
		return fmt.Errorf("tls-key: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cert != nil && bytes.Equal(certPEM, t.certPEM) && bytes.Equal(keyPEM, t.keyPEM) {
		return nil
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err == nil && pair.Leaf == nil { // set unless GODEBUG x509keypairleaf=0
		pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0])
	}
	if err != nil {
		return fmt.Errorf("tls-cert %s, tls-key %s: %w", t.certFile, t.keyFile, err)
	}
	if t.cert != nil && t.log != nil {
		t.log.Info("tls certificate reloaded", zap.String("tls_cert", t.certFile),
			zap.Time("not_after", pair.Leaf.NotAfter))
	}
	t.cert, t.certPEM, t.keyPEM = &pair, certPEM, keyPEM
	return nil
}

// errNoCert fails the handshakes of a server whose TLS has no certificate
// (loaded without TLSServe).
var errNoCert = errors.New("grpcnet: tls: no certificate configured (tls-cert, tls-key)")

// certificate returns the current pair, reloading it when its files
// changed. A failed reload keeps the previous pair.
func (t *TLS) certificate() (*tls.Certificate, error) {
	if t.certFile == "" {
		return nil, errNoCert
	}
	if err := t.loadPair(); err != nil {
		t.log.Warn("tls certificate reload failed; keeping the previous certificate", zap.Error(err))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cert, nil
}

// ServerConfig returns a new TLS configuration for a gRPC server: it
// serves the certificate and, with a CA, requires and verifies client
// certificates (mutual TLS). Nil for a nil t. Handshakes fail when t was
// loaded without a certificate.
func (t *TLS) ServerConfig() *tls.Config {
	if t == nil {
		return nil
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13, // both ends are pdserve components
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return t.certificate()
		},
	}
	if t.pool != nil {
		cfg.ClientCAs = t.pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg
}

// ClientConfig returns a new TLS configuration for a gRPC client: it
// verifies servers against the CA, checking the server name when one is
// set, and presents the certificate, when there is one. Nil for a nil t.
func (t *TLS) ClientConfig() *tls.Config {
	if t == nil {
		return nil
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    t.pool,
		ServerName: t.serverName,
	}
	if t.certFile != "" {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return t.certificate() }
	}
	return cfg
}

// ServerCredentials returns the transport credentials of a gRPC server:
// TLS with ServerConfig, or plaintext for a nil t.
func (t *TLS) ServerCredentials() credentials.TransportCredentials {
	if t == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(t.ServerConfig())
}

// ClientCredentials returns the transport credentials of a gRPC client:
// TLS with ClientConfig, or plaintext for a nil t.
func (t *TLS) ClientCredentials() credentials.TransportCredentials {
	if t == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(t.ClientConfig())
}
