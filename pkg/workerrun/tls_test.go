package workerrun

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/workerrun/tlstest"
)

// serverName is the name in the test certificates; they name no IP, so a
// client dialing 127.0.0.1 must verify this name instead.
const serverName = "pdserve-grpc"

// testPKI is a CA, a certificate it signs for serverName, and the TLS
// options of a component using them.
type testPKI struct {
	ca   *tlstest.CA
	leaf tlstest.Pair
}

func newPKI(t *testing.T, name string) testPKI {
	ca := tlstest.NewCA(t, name)
	return testPKI{ca: ca, leaf: ca.Issue(t, tlstest.Leaf{DNSNames: []string{serverName}})}
}

func (p testPKI) options() TLSOptions {
	return TLSOptions{CertFile: p.leaf.CertFile, KeyFile: p.leaf.KeyFile, CAFile: p.ca.CertFile, ServerName: serverName}
}

// dialCreds returns a connection to addr with creds, closed when the test
// ends.
func dialCreds(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// clientCreds loads o as a gRPC client's credentials.
func clientCreds(t *testing.T, o TLSOptions) credentials.TransportCredentials {
	t.Helper()
	tc, err := o.Load(TLSDial, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return tc.ClientCredentials()
}

// A disaggregated request over mutual TLS (coordinator-like client →
// both workers, prefill worker → decode worker for the KV transfer) gives
// the tokens the same request gives over plaintext.
func TestDisaggregatedOverMutualTLS(t *testing.T) {
	url := startNATS(t)
	pki := newPKI(t, "pdserve test CA")
	p := prompt(29, 5)
	const maxTokens = 10

	run := func(t *testing.T, tlsOpts TLSOptions, creds credentials.TransportCredentials) []int32 {
		po, do := testOptions(control.RolePrefill, url), testOptions(control.RoleDecode, url)
		po.TLS, do.TLS = tlsOpts, tlsOpts
		// One certificate for every component: it names no role, so the
		// prefill worker takes any certificate of the CA for its decode
		// peer (TestMutualTLSRoles checks the role).
		po.GRPCAuth.WorkerIdentities = []string{}
		pw, dw := startWorker(t, po), startWorker(t, do)
		pc := pdservev1.NewPrefillServiceClient(dialCreds(t, pw.Addr(), creds))
		dc := pdservev1.NewDecodeServiceClient(dialCreds(t, dw.Addr(), creds))
		ctx := testCtx(t)
		got, first := disaggregated(t, ctx, pc, dc, dw.Addr(), "req", p, maxTokens, "zstd")
		if first != got.tokens[0] {
			t.Errorf("prefill worker's first token %d, decode worker's %d", first, got.tokens[0])
		}
		if _, err := pc.Release(ctx, &pdservev1.ReleaseRequest{RequestId: "req"}); err != nil {
			t.Fatal(err)
		}
		return got.tokens
	}
	var plain, mtls []int32
	t.Run("plaintext", func(t *testing.T) { plain = run(t, TLSOptions{}, insecure.NewCredentials()) })
	t.Run("mutual TLS", func(t *testing.T) { mtls = run(t, pki.options(), clientCreds(t, pki.options())) })
	if len(plain) != maxTokens {
		t.Fatalf("plaintext run gave %d tokens, want %d", len(plain), maxTokens)
	}
	if diff := cmp.Diff(plain, mtls); diff != "" {
		t.Errorf("tokens (-plaintext +mutual TLS):\n%s", diff)
	}
	if diff := cmp.Diff(reference(t, p, maxTokens), mtls); diff != "" {
		t.Errorf("tokens (-engine alone +mutual TLS):\n%s", diff)
	}
}

// A worker serving mutual TLS refuses every client without a valid
// certificate, and a prefill worker refuses to send KV to a decode worker
// whose certificate its CA did not sign.
func TestTLSRefusesInvalidPeers(t *testing.T) {
	url := startNATS(t)
	pki := newPKI(t, "pdserve test CA")
	rogue := newPKI(t, "rogue CA")
	do := testOptions(control.RoleDecode, url)
	do.TLS = pki.options()
	dw := startWorker(t, do)

	health := func(t *testing.T, creds credentials.TransportCredentials) error {
		ctx, cancel := context.WithTimeout(testCtx(t), 20*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(dialCreds(t, dw.Addr(), creds)).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	noCert := pki.options()
	noCert.CertFile, noCert.KeyFile = "", ""
	otherCA := pki.options()
	otherCA.CertFile, otherCA.KeyFile = rogue.leaf.CertFile, rogue.leaf.KeyFile
	noName := pki.options()
	noName.ServerName = ""
	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"plaintext client", insecure.NewCredentials()},
		{"client without a certificate", clientCreds(t, noCert)},
		{"client certificate from another CA", clientCreds(t, otherCA)},
		{"server verified as its IP, which the certificate lacks", clientCreds(t, noName)},
		{"server verified against another CA", clientCreds(t, rogue.options())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := health(t, tc.creds)
			t.Logf("refused: %v", err)
			if status.Code(err) != codes.Unavailable {
				t.Errorf("health check: %v, want UNAVAILABLE", err)
			}
		})
	}
	if err := health(t, clientCreds(t, pki.options())); err != nil {
		t.Fatalf("valid client refused: %v", err)
	}

	t.Run("prefill worker trusting another CA", func(t *testing.T) {
		po := testOptions(control.RolePrefill, url)
		po.TLS = rogue.options()
		pw := startWorker(t, po)
		ctx := testCtx(t)
		p := prompt(12, 1)
		dc := pdservev1.NewDecodeServiceClient(dialCreds(t, dw.Addr(), clientCreds(t, pki.options())))
		pc := pdservev1.NewPrefillServiceClient(dialCreds(t, pw.Addr(), clientCreds(t, rogue.options())))
		if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: int32(len(p) + 4)}); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = dc.Cancel(ctx, &pdservev1.CancelRequest{RequestId: "r"}) }()
		pre, err := pc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "r", PromptTokens: p, DecodeAddr: dw.Addr()})
		if err != nil {
			t.Fatal(err)
		}
		_, done, err := readPrefill(pre)
		t.Logf("prefill: %v", err)
		if err == nil || done != nil {
			t.Errorf("prefill to an untrusted decode worker: kv done %v, error %v; want an error", done, err)
		}
	})
}

func TestTLSOptionsValidate(t *testing.T) {
	pki := newPKI(t, "pdserve test CA")
	ca, good := pki.ca, pki.leaf
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

	// The worker's Options check TLS for their role: a prefill worker
	// dials, a decode worker does not.
	for _, tc := range []struct {
		name    string
		o       Options
		wantErr string
	}{
		{"prefill", NewPrefillOptions(), "tls-ca is required"},
		{"decode", NewDecodeOptions(), ""},
	} {
		t.Run("options/"+tc.name, func(t *testing.T) {
			tc.o.TLS = TLSOptions{CertFile: good.CertFile, KeyFile: good.KeyFile}
			err := tc.o.Validate()
			if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate: %v, want error %q", err, tc.wantErr)
			}
		})
	}
}

// A renewed certificate written over the files is served to new
// connections; a broken one is ignored and the previous kept.
func TestTLSCertificateReload(t *testing.T) {
	pki := newPKI(t, "pdserve test CA")
	o := pki.options()
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
	if got, want := serial(), pki.leaf.Cert.SerialNumber.String(); got != want {
		t.Fatalf("serial %s, want %s", got, want)
	}
	renewed := pki.ca.Issue(t, tlstest.Leaf{DNSNames: []string{serverName}})
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
