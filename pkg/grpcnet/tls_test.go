package grpcnet

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/credentials"

	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
)

// serverName is the name in the test certificates; they name no IP, so a
// client dialing 127.0.0.1 must verify this name instead.
const serverName = "pdserve-grpc"

// newPKI returns a CA and a certificate it signs for serverName.
func newPKI(t *testing.T, name string) tlstest.PKI { return tlstest.NewPKI(t, name, serverName) }

// pkiOptions are the TLS options of a component using p.
func pkiOptions(p tlstest.PKI) TLSOptions {
	return TLSOptions{CertFile: p.Leaf.CertFile, KeyFile: p.Leaf.KeyFile, CAFile: p.CA.CertFile, ServerName: serverName}
}

func TestTLSOptionsValidate(t *testing.T) {
	pki := newPKI(t, "pdserve test CA")
	ca, good := pki.CA, pki.Leaf
	serverOnly := ca.Issue(t, tlstest.Leaf{DNSNames: []string{serverName}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	clientOnly := ca.Issue(t, tlstest.Leaf{DNSNames: []string{serverName}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	noUsage := ca.Issue(t, tlstest.Leaf{DNSNames: []string{serverName}, Usages: []x509.ExtKeyUsage{}})
	otherName := ca.Issue(t, tlstest.Leaf{DNSNames: []string{"elsewhere"}})
	now := time.Now()
	expired := ca.Issue(t, tlstest.Leaf{DNSNames: []string{serverName}, NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)})
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	tlstest.WriteFile(t, garbage, []byte("not PEM at all\n"))
	missing := filepath.Join(dir, "missing.pem")

	full := func(p tlstest.Pair) TLSOptions {
		return TLSOptions{CertFile: p.CertFile, KeyFile: p.KeyFile, CAFile: ca.CertFile, ServerName: serverName}
	}
	with := func(o TLSOptions, edit func(*TLSOptions)) TLSOptions {
		edit(&o)
		return o
	}
	const (
		worker  = TLSServe
		prefill = TLSServe | TLSDial
		client  = TLSDial
	)
	tests := []struct {
		name    string
		use     TLSUse
		o       TLSOptions
		wantErr []string // substrings; none: valid
	}{
		{name: "no TLS", use: prefill},
		{name: "mutual TLS prefill", use: prefill, o: full(good)},
		{name: "mutual TLS decode", use: worker, o: full(good)},
		{name: "client with certificate", use: client, o: full(good)},
		{name: "client with only a CA", use: client, o: TLSOptions{CAFile: ca.CertFile, ServerName: serverName}},
		{name: "decode worker without CA serves TLS without client certificates", use: worker, o: TLSOptions{CertFile: good.CertFile, KeyFile: good.KeyFile}},
		{name: "certificate without extended key usage", use: prefill, o: full(noUsage)},
		{name: "CA bundle of two certificates", use: prefill, o: with(full(good), func(o *TLSOptions) {
			bundle := filepath.Join(dir, "bundle.pem")
			a, _ := os.ReadFile(ca.CertFile)
			b, _ := os.ReadFile(tlstest.NewCA(t, "second").CertFile)
			tlstest.WriteFile(t, bundle, append(a, b...))
			o.CAFile = bundle
		})},

		{name: "cert without key", use: worker, o: with(full(good), func(o *TLSOptions) { o.KeyFile = "" }),
			wantErr: []string{"tls-cert and tls-key must be given together"}},
		{name: "key without cert", use: client, o: with(full(good), func(o *TLSOptions) { o.CertFile = "" }),
			wantErr: []string{"tls-cert and tls-key must be given together"}},
		{name: "prefill worker without CA", use: prefill, o: TLSOptions{CertFile: good.CertFile, KeyFile: good.KeyFile},
			wantErr: []string{"tls-ca is required"}},
		{name: "client without CA", use: client, o: TLSOptions{CertFile: good.CertFile, KeyFile: good.KeyFile},
			wantErr: []string{"tls-ca is required"}},
		{name: "worker with only a CA", use: worker, o: TLSOptions{CAFile: ca.CertFile},
			wantErr: []string{"tls-cert and tls-key are required"}},
		{name: "server name without CA", use: worker, o: TLSOptions{CertFile: good.CertFile, KeyFile: good.KeyFile, ServerName: serverName},
			wantErr: []string{`tls-server-name "pdserve-grpc" needs tls-ca`}},
		{name: "missing certificate file", use: worker, o: with(full(good), func(o *TLSOptions) { o.CertFile = missing }),
			wantErr: []string{"tls-cert: open " + missing}},
		{name: "missing key file", use: worker, o: with(full(good), func(o *TLSOptions) { o.KeyFile = missing }),
			wantErr: []string{"tls-key: open " + missing}},
		{name: "missing CA file", use: worker, o: with(full(good), func(o *TLSOptions) { o.CAFile = missing }),
			wantErr: []string{"tls-ca: open " + missing}},
		{name: "certificate not PEM", use: worker, o: with(full(good), func(o *TLSOptions) { o.CertFile = garbage }),
			wantErr: []string{"tls-cert " + garbage + ", tls-key " + good.KeyFile}},
		{name: "key of another certificate", use: worker, o: with(full(good), func(o *TLSOptions) { o.KeyFile = serverOnly.KeyFile }),
			wantErr: []string{"private key does not match public key"}},
		{name: "CA file not PEM", use: worker, o: with(full(good), func(o *TLSOptions) { o.CAFile = garbage }),
			wantErr: []string{"tls-ca " + garbage + ": no PEM certificate found"}},
		{name: "CA file holding a key", use: worker, o: with(full(good), func(o *TLSOptions) { o.CAFile = good.KeyFile }),
			wantErr: []string{`PEM block 1 is a "PRIVATE KEY"`}},
		{name: "expired certificate", use: worker, o: full(expired),
			wantErr: []string{"expired at " + expired.Cert.NotAfter.UTC().Format(time.RFC3339)}},
		{name: "certificate for another name", use: worker, o: full(otherName),
			wantErr: []string{`not valid for tls-server-name "pdserve-grpc"`, "its names: elsewhere"}},
		{name: "client-only certificate on a server", use: worker, o: full(clientOnly),
			wantErr: []string{"does not allow server authentication"}},
		{name: "server-only certificate presented by a client", use: prefill, o: full(serverOnly),
			wantErr: []string{"does not allow client authentication"}},
		{name: "every problem at once", use: prefill, o: TLSOptions{CertFile: missing, KeyFile: good.KeyFile, ServerName: serverName},
			wantErr: []string{"tls-ca is required", "tls-cert: open"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate(tc.use)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %+v, want errors %q", tc.o, tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate error %q lacks %q", err, want)
				}
			}
		})
	}

}

// A renewed certificate written over the files is served to new
// connections; a broken one is ignored and the previous kept.
func TestTLSCertificateReload(t *testing.T) {
	pki := newPKI(t, "pdserve test CA")
	o := pkiOptions(pki)
	tc, err := o.Load(TLSServe|TLSDial, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	serial := func() string {
		t.Helper()
		c, err := tc.ServerConfig().GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := tc.ClientConfig().GetClientCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		if c != cc {
			t.Errorf("server and client certificates differ")
		}
		return c.Leaf.SerialNumber.String()
	}
	if got, want := serial(), pki.Leaf.Cert.SerialNumber.String(); got != want {
		t.Fatalf("serial %s, want %s", got, want)
	}
	renewed := pki.CA.Issue(t, tlstest.Leaf{DNSNames: []string{serverName}})
	copyFile(t, renewed.CertFile, o.CertFile)
	copyFile(t, renewed.KeyFile, o.KeyFile)
	if got, want := serial(), renewed.Cert.SerialNumber.String(); got != want {
		t.Fatalf("after renewal: serial %s, want %s", got, want)
	}
	tlstest.WriteFile(t, o.KeyFile, []byte("half-written"))
	if got, want := serial(), renewed.Cert.SerialNumber.String(); got != want {
		t.Errorf("after a broken renewal: serial %s, want the previous %s", got, want)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	tlstest.WriteFile(t, to, b)
}

// Nil TLS is plaintext.
func TestNilTLSIsPlaintext(t *testing.T) {
	var tc *TLS
	if tc.ServerConfig() != nil || tc.ClientConfig() != nil {
		t.Error("nil TLS has configs")
	}
	for _, c := range []credentials.TransportCredentials{tc.ServerCredentials(), tc.ClientCredentials()} {
		if p := c.Info().SecurityProtocol; p != "insecure" {
			t.Errorf("nil TLS credentials protocol %q, want insecure", p)
		}
	}
	loaded, err := TLSOptions{}.Load(TLSServe|TLSDial, nil)
	if loaded != nil || err != nil {
		t.Errorf("Load without settings: %v, %v; want nil, nil", loaded, err)
	}
}
