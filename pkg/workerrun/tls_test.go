package workerrun

import (
	"context"
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
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
)

// serverName is the name in the test certificates; they name no IP, so a
// client dialing 127.0.0.1 must verify this name instead.
const serverName = "pdserve-grpc"

// newPKI returns a CA and a certificate it signs for serverName.
func newPKI(t *testing.T, name string) tlstest.PKI { return tlstest.NewPKI(t, name, serverName) }

// pkiOptions are the TLS options of a component using p.
func pkiOptions(p tlstest.PKI) grpcnet.TLSOptions {
	return grpcnet.TLSOptions{CertFile: p.Leaf.CertFile, KeyFile: p.Leaf.KeyFile, CAFile: p.CA.CertFile, ServerName: serverName}
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
func clientCreds(t *testing.T, o grpcnet.TLSOptions) credentials.TransportCredentials {
	t.Helper()
	tc, err := o.Load(grpcnet.TLSDial, zaptest.NewLogger(t))
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

	run := func(t *testing.T, tlsOpts grpcnet.TLSOptions, creds credentials.TransportCredentials) []int32 {
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
		got, _ := disaggregated(t, ctx, pc, dc, dw.Addr(), "req", p, maxTokens, "zstd")
		if _, err := pc.Release(ctx, &pdservev1.ReleaseRequest{RequestId: "req"}); err != nil {
			t.Fatal(err)
		}
		return got.tokens
	}
	var plain, mtls []int32
	t.Run("plaintext", func(t *testing.T) { plain = run(t, grpcnet.TLSOptions{}, insecure.NewCredentials()) })
	t.Run("mutual TLS", func(t *testing.T) { mtls = run(t, pkiOptions(pki), clientCreds(t, pkiOptions(pki))) })
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
	do.TLS = pkiOptions(pki)
	dw := startWorker(t, do)

	health := func(t *testing.T, creds credentials.TransportCredentials) error {
		ctx, cancel := context.WithTimeout(testCtx(t), 20*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(dialCreds(t, dw.Addr(), creds)).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	noCert := pkiOptions(pki)
	noCert.CertFile, noCert.KeyFile = "", ""
	otherCA := pkiOptions(pki)
	otherCA.CertFile, otherCA.KeyFile = rogue.Leaf.CertFile, rogue.Leaf.KeyFile
	noName := pkiOptions(pki)
	noName.ServerName = ""
	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"plaintext client", insecure.NewCredentials()},
		{"client without a certificate", clientCreds(t, noCert)},
		{"client certificate from another CA", clientCreds(t, otherCA)},
		{"server verified as its IP, which the certificate lacks", clientCreds(t, noName)},
		{"server verified against another CA", clientCreds(t, pkiOptions(rogue))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := health(t, tc.creds)
			t.Logf("refused: %v", err)
			if status.Code(err) != codes.Unavailable {
				t.Errorf("health check: %v, want UNAVAILABLE", err)
			}
		})
	}
	if err := health(t, clientCreds(t, pkiOptions(pki))); err != nil {
		t.Fatalf("valid client refused: %v", err)
	}

	t.Run("prefill worker trusting another CA", func(t *testing.T) {
		po := testOptions(control.RolePrefill, url)
		po.TLS = pkiOptions(rogue)
		pw := startWorker(t, po)
		ctx := testCtx(t)
		p := prompt(12, 1)
		dc := pdservev1.NewDecodeServiceClient(dialCreds(t, dw.Addr(), clientCreds(t, pkiOptions(pki))))
		pc := pdservev1.NewPrefillServiceClient(dialCreds(t, pw.Addr(), clientCreds(t, pkiOptions(rogue))))
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

// The worker's Options check TLS for their role (moved from
// grpcnet's TestTLSOptionsValidate).
func TestTLSOptionsByRole(t *testing.T) {
	good := newPKI(t, "pdserve test CA").Leaf
	// A prefill worker dials, a decode worker does not.
	for _, tc := range []struct {
		name    string
		o       Options
		wantErr string
	}{
		{"prefill", NewPrefillOptions(), "tls-ca is required"},
		{"decode", NewDecodeOptions(), ""},
	} {
		t.Run("options/"+tc.name, func(t *testing.T) {
			tc.o.TLS = grpcnet.TLSOptions{CertFile: good.CertFile, KeyFile: good.KeyFile}
			err := tc.o.Validate()
			if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate: %v, want error %q", err, tc.wantErr)
			}
		})
	}
}
