package workerrun

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// Test tokens, as the chart's Secret holds them.
const (
	coordToken   = "coordinator-token-for-tests-0123456789"
	prefillToken = "prefill-token-for-tests-0123456789abcd"
)

func writeSecret(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func digestOf(tok string) string {
	d := sha256.Sum256([]byte(tok))
	return "sha256:" + hex.EncodeToString(d[:])
}

// bearerToken is per-RPC credentials sending any authorization value.
type bearerToken string

func (b bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearerToken) RequireTransportSecurity() bool { return false }

// reserveAndGenerate makes the decode worker's two coordinator calls and
// returns their codes.
func reserveAndGenerate(t *testing.T, dc pdservev1.DecodeServiceClient) (reserve, generate codes.Code) {
	t.Helper()
	ctx, cancel := context.WithTimeout(testCtx(t), 20*time.Second)
	defer cancel()
	_, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "probe", Tokens: 8})
	reserve = status.Code(err)
	if err == nil {
		_, _ = dc.Cancel(ctx, &pdservev1.CancelRequest{RequestId: "probe"})
	}
	stream, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "probe-gen", PromptTokens: prompt(4, 1), MaxTokens: 2, LocalPrefill: true, IgnoreEos: true})
	if err == nil {
		_, err = readGenerate(stream, 0)
	}
	return reserve, status.Code(err)
}

// Without TLS, workers with tokens (as the chart mounts them: the
// coordinator's digest, the prefill token or its digest) serve the
// coordinator's token, let the prefill worker push KV with its own, and
// refuse the rest.
func TestTokensBetweenWorkers(t *testing.T) {
	url := startNATS(t)
	coordFile, prefillFile := writeSecret(t, "coordinator.token", coordToken), writeSecret(t, "prefill.token", prefillToken)
	coordDigest, prefillDigest := writeSecret(t, "coordinator.sha256", digestOf(coordToken)), writeSecret(t, "prefill.sha256", digestOf(prefillToken))
	po, do := testOptions(control.RolePrefill, url), testOptions(control.RoleDecode, url)
	po.GRPCAuth = grpcauth.Options{TokenFile: coordDigest, PrefillTokenFile: prefillFile}
	do.GRPCAuth = grpcauth.Options{TokenFile: coordDigest, PrefillTokenFile: prefillDigest}
	pw, dw := startWorker(t, po), startWorker(t, do)

	coord, err := grpcauth.Options{TokenFile: coordFile}.Load(grpcauth.RoleCoordinator, nil)
	if err != nil {
		t.Fatal(err)
	}
	asCoordinator := func(w *Worker) *grpc.ClientConn {
		return dialCreds2(t, w.Addr(), insecure.NewCredentials(), coord.DialOptions()...)
	}
	t.Run("the coordinator's token serves a request", func(t *testing.T) {
		p := prompt(21, 3)
		pc := pdservev1.NewPrefillServiceClient(asCoordinator(pw))
		dc := pdservev1.NewDecodeServiceClient(asCoordinator(dw))
		got, _ := disaggregated(t, testCtx(t), pc, dc, dw.Addr(), "tok-req", p, 6, "zstd")
		if len(got.tokens) != 6 {
			t.Errorf("%d tokens, want 6", len(got.tokens))
		}
	})
	for _, tc := range []struct {
		name string
		opts []grpc.DialOption
		want codes.Code
	}{
		{"no token", nil, codes.Unauthenticated},
		{"a wrong token", []grpc.DialOption{grpc.WithPerRPCCredentials(bearerToken("not-the-coordinator-token-000000"))}, codes.Unauthenticated},
		{"the coordinator's digest as a token", []grpc.DialOption{grpc.WithPerRPCCredentials(bearerToken(digestOf(coordToken)))}, codes.Unauthenticated},
		{"the prefill token", []grpc.DialOption{grpc.WithPerRPCCredentials(bearerToken(prefillToken))}, codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dc := pdservev1.NewDecodeServiceClient(dialCreds2(t, dw.Addr(), insecure.NewCredentials(), tc.opts...))
			if r, g := reserveAndGenerate(t, dc); r != tc.want || g != tc.want {
				t.Errorf("Reserve %v, Generate %v; want %v", r, g, tc.want)
			}
			pc := pdservev1.NewPrefillServiceClient(dialCreds2(t, pw.Addr(), insecure.NewCredentials(), tc.opts...))
			_, err := pc.Release(testCtx(t), &pdservev1.ReleaseRequest{RequestId: "x"})
			if status.Code(err) != tc.want {
				t.Errorf("prefill worker's Release: %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("KV push with the coordinator's token", func(t *testing.T) {
		dc := pdservev1.NewDecodeServiceClient(asCoordinator(dw))
		if _, err := dc.Reserve(testCtx(t), &pdservev1.ReserveRequest{RequestId: "push", Tokens: 8}); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = dc.Cancel(testCtx(t), &pdservev1.CancelRequest{RequestId: "push"}) }()
		d := kvtransfer.NewDialer(kvtransfer.WithGRPCDialOptions(coord.DialOptions()...))
		defer d.Close()
		spec := dw.Engine().Spec()
		_, err := d.Open(testCtx(t), dw.Addr(), kvtransfer.StreamHeader{RequestID: "push", Codec: "none", Layers: spec.Layers, Tokens: 4, TokenBytes: spec.KVTokenBytes(), DType: engine.BF16})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("Open with the coordinator's token: %v, want PERMISSION_DENIED", err)
		}
	})
}

// dialCreds2 is dialCreds with more dial options.
func dialCreds2(t *testing.T, addr string, creds credentials.TransportCredentials, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// With mutual TLS and a certificate per role, the coordinator's
// certificate serves a request (the prefill worker pushing KV with its
// own), a client without a certificate is refused in the handshake and
// the prefill worker's certificate cannot call Generate or Reserve.
func TestMutualTLSRoles(t *testing.T) {
	nurl := startNATS(t)
	ca := tlstest.NewCA(t, "pdserve roles CA")
	const coordID, prefillID = "spiffe://pdserve.test/ns/pdserve/sa/coordinator", "prefill.pdserve.test"
	coordCert := ca.Issue(t, tlstest.Leaf{URIs: []*url.URL{tlstest.MustURL(t, coordID)}})
	prefillCert := ca.Issue(t, tlstest.Leaf{DNSNames: []string{serverName, prefillID}})
	// The decode worker's certificate names its role, which the prefill
	// worker checks before it pushes KV (grpcauth.DefaultWorkerIdentities).
	decodeCert := ca.Issue(t, tlstest.Leaf{DNSNames: []string{serverName}, URIs: []*url.URL{tlstest.MustURL(t, "spiffe://pdserve/decode")}})
	opts := func(p tlstest.Pair) grpcnet.TLSOptions {
		return grpcnet.TLSOptions{CertFile: p.CertFile, KeyFile: p.KeyFile, CAFile: ca.CertFile, ServerName: serverName}
	}
	allow := grpcauth.Options{AllowCoordinator: []string{coordID}, AllowPrefill: []string{prefillID}}
	po, do := testOptions(control.RolePrefill, nurl), testOptions(control.RoleDecode, nurl)
	po.TLS, po.GRPCAuth = opts(prefillCert), allow
	do.TLS, do.GRPCAuth = opts(decodeCert), allow
	pw, dw := startWorker(t, po), startWorker(t, do)

	t.Run("a decode worker whose certificate names another role gets no KV", func(t *testing.T) {
		odo := testOptions(control.RoleDecode, nurl)
		odo.TLS, odo.GRPCAuth = opts(prefillCert), allow // a prefill worker's certificate, serving as decode
		odw := startWorker(t, odo)
		creds := clientCreds(t, opts(coordCert))
		pc := pdservev1.NewPrefillServiceClient(dialCreds(t, pw.Addr(), creds))
		dc := pdservev1.NewDecodeServiceClient(dialCreds(t, odw.Addr(), creds))
		ctx := testCtx(t)
		if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "impostor", Tokens: 32, Sequences: 1, PromptTokens: 17}); err != nil {
			t.Fatal(err)
		}
		st, err := pc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "impostor", PromptTokens: prompt(17, 2), DecodeAddr: odw.Addr(), DecodeId: odw.ID()})
		for err == nil {
			_, err = st.Recv()
		}
		if !strings.Contains(err.Error(), "certificate does not name the worker") {
			t.Errorf("prefill to a decode worker with a prefill certificate: %v, want a refused handshake", err)
		}
		_, _ = dc.Cancel(ctx, &pdservev1.CancelRequest{RequestId: "impostor"})
		_, _ = pc.Release(ctx, &pdservev1.ReleaseRequest{RequestId: "impostor"})
	})

	t.Run("the coordinator's certificate serves a request", func(t *testing.T) {
		creds := clientCreds(t, opts(coordCert))
		pc := pdservev1.NewPrefillServiceClient(dialCreds(t, pw.Addr(), creds))
		dc := pdservev1.NewDecodeServiceClient(dialCreds(t, dw.Addr(), creds))
		got, _ := disaggregated(t, testCtx(t), pc, dc, dw.Addr(), "tls-req", prompt(17, 2), 5, "s2")
		if len(got.tokens) != 5 {
			t.Errorf("%d tokens, want 5", len(got.tokens))
		}
	})
	noCert := opts(coordCert)
	noCert.CertFile, noCert.KeyFile = "", ""
	for _, tc := range []struct {
		name string
		o    grpcnet.TLSOptions
		want codes.Code
	}{
		{"no client certificate", noCert, codes.Unavailable},
		{"the prefill worker's certificate", opts(prefillCert), codes.PermissionDenied},
		{"the decode worker's certificate", opts(decodeCert), codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dc := pdservev1.NewDecodeServiceClient(dialCreds(t, dw.Addr(), clientCreds(t, tc.o)))
			if r, g := reserveAndGenerate(t, dc); r != tc.want || g != tc.want {
				t.Errorf("Reserve %v, Generate %v; want %v", r, g, tc.want)
			}
		})
	}
}

// A worker with neither a token nor mutual TLS says at start that its
// gRPC is open; one with a token does not.
func TestOpenGRPCWarning(t *testing.T) {
	for _, tc := range []struct {
		name string
		auth grpcauth.Options
		want bool
	}{
		{"nothing configured", grpcauth.Options{}, true},
		{"a token", grpcauth.Options{Token: coordToken}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.WarnLevel)
			o := testOptions(control.RoleDecode, "")
			o.GRPCAuth = tc.auth
			w, err := Start(testCtx(t), o, zap.New(core))
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Kill(); err != nil {
				t.Error(err)
			}
			got := false
			for _, e := range logs.All() {
				got = got || strings.Contains(e.Message, "gRPC is open")
			}
			if got != tc.want {
				t.Errorf("open-gRPC warning logged: %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAuthOptionsValidate(t *testing.T) {
	pki := newPKI(t, "pdserve test CA")
	digest := writeSecret(t, "digest", digestOf(prefillToken))
	for _, tc := range []struct {
		name string
		role control.Role
		edit func(*Options)
		want string // in the error; "" for none
	}{
		{"identities without TLS", control.RoleDecode, func(o *Options) { o.GRPCAuth.AllowPrefill = []string{"prefill.svc"} }, "need mutual TLS"},
		{"identities with mutual TLS", control.RoleDecode, func(o *Options) {
			o.TLS = pkiOptions(pki)
			o.GRPCAuth.AllowPrefill = []string{"prefill.svc"}
		}, ""},
		{"a prefill worker given the prefill digest", control.RolePrefill, func(o *Options) {
			o.GRPCAuth = grpcauth.Options{Token: coordToken, PrefillTokenFile: digest}
		}, "prefill worker sends the token"},
		{"a decode worker given the prefill digest", control.RoleDecode, func(o *Options) {
			o.GRPCAuth = grpcauth.Options{Token: coordToken, PrefillTokenFile: digest}
		}, ""},
		{"keepalive under a second", control.RoleDecode, func(o *Options) { o.Keepalive.Time = time.Millisecond }, "grpc-keepalive-time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions(tc.role, "")
			tc.edit(&o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want an error with %q", err, tc.want)
			}
		})
	}
}
