package grpcauth

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"flag"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Test tokens; each at least MinTokenBytes.
const (
	coordToken   = "coordinator-token-0123456789"
	prefillToken = "prefill-token-0123456789abcd"
)

// fakeWorker serves DecodeService.Reserve and KVTransferService.Push, and
// records the Caller of every call that got through.
type fakeWorker struct {
	pdservev1.UnimplementedDecodeServiceServer
	pdservev1.UnimplementedKVTransferServiceServer

	mu      sync.Mutex
	callers []string
}

func (f *fakeWorker) record(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.callers = append(f.callers, Caller(ctx))
}

func (f *fakeWorker) lastCaller() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.callers) == 0 {
		return ""
	}
	return f.callers[len(f.callers)-1]
}

func (f *fakeWorker) Reserve(ctx context.Context, _ *pdservev1.ReserveRequest) (*pdservev1.ReserveResponse, error) {
	f.record(ctx)
	return &pdservev1.ReserveResponse{}, nil
}

func (f *fakeWorker) Push(s grpc.ClientStreamingServer[pdservev1.PushRequest, pdservev1.PushResponse]) error {
	f.record(s.Context())
	return s.SendAndClose(&pdservev1.PushResponse{})
}

// serve starts a gRPC server on loopback with a's interceptors and extra
// options, serving fakeWorker and health; it stops when the test ends.
func serve(t *testing.T, a *Auth, extra ...grpc.ServerOption) (string, *fakeWorker) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(append(a.ServerOptions(), extra...)...)
	f := &fakeWorker{}
	pdservev1.RegisterDecodeServiceServer(s, f)
	pdservev1.RegisterKVTransferServiceServer(s, f)
	healthpb.RegisterHealthServer(s, health.NewServer())
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Serve(lis) })
	t.Cleanup(func() {
		s.Stop()
		wg.Wait()
	})
	return lis.Addr().String(), f
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return dialRaw(t, addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// calls makes each kind of call on cc and returns their codes.
func calls(t *testing.T, cc *grpc.ClientConn) (reserve, push, healthCode codes.Code) {
	t.Helper()
	ctx := ctxT(t)
	_, err := pdservev1.NewDecodeServiceClient(cc).Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: 1})
	reserve = status.Code(err)
	st, err := pdservev1.NewKVTransferServiceClient(cc).Push(ctx)
	if err == nil {
		_, err = st.CloseAndRecv()
	}
	push = status.Code(err)
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return reserve, push, status.Code(err)
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTokens(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	perRole := Options{TokenFile: writeFile(t, "coord", coordToken+"\n"), PrefillTokenFile: writeFile(t, "prefill", prefillToken)}
	worker, err := perRole.Load(0, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	addr, f := serve(t, worker)

	coord, err := perRole.Load(RoleCoordinator, nil)
	if err != nil {
		t.Fatal(err)
	}
	pre, err := perRole.Load(RolePrefill, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                   string
		opts                   []grpc.DialOption
		reserve, push, healthC codes.Code
		caller                 string
	}{
		{"no token", nil, codes.Unauthenticated, codes.Unauthenticated, codes.OK, ""},
		{"wrong token", []grpc.DialOption{grpc.WithPerRPCCredentials(bearer("Bearer not-the-token-at-all-0000"))}, codes.Unauthenticated, codes.Unauthenticated, codes.OK, ""},
		{"not a bearer token", []grpc.DialOption{grpc.WithPerRPCCredentials(bearer(coordToken))}, codes.Unauthenticated, codes.Unauthenticated, codes.OK, ""},
		{"coordinator token", coord.DialOptions(), codes.OK, codes.PermissionDenied, codes.OK, "token:coordinator"},
		{"prefill token", pre.DialOptions(), codes.PermissionDenied, codes.OK, codes.OK, "token:prefill"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, p, h := calls(t, dial(t, addr, tc.opts...))
			if r != tc.reserve || p != tc.push || h != tc.healthC {
				t.Errorf("Reserve %v, Push %v, Health %v; want %v, %v, %v", r, p, h, tc.reserve, tc.push, tc.healthC)
			}
			if tc.caller != "" && f.lastCaller() != tc.caller {
				t.Errorf("caller %q, want %q", f.lastCaller(), tc.caller)
			}
		})
	}
	// Refusals are logged with the method, the peer and what was
	// presented, and never with a token.
	entries := logs.FilterMessage("grpc call refused").All()
	if len(entries) == 0 {
		t.Fatal("no refusal logged")
	}
	seen := map[string]bool{}
	for _, e := range entries {
		m := e.ContextMap()
		seen[m["presented"].(string)] = true
		if m["method"] == "" || !strings.HasPrefix(m["peer"].(string), "127.0.0.1:") {
			t.Errorf("refusal log %v lacks the method or the peer", m)
		}
		for _, v := range m {
			if s, ok := v.(string); ok && (strings.Contains(s, coordToken) || strings.Contains(s, prefillToken) || strings.Contains(s, "not-the-token")) {
				t.Errorf("refusal log %v holds a token", m)
			}
		}
	}
	for _, want := range []string{"no token", "a wrong token", "a token of role coordinator", "a token of role prefill"} {
		if !seen[want] {
			t.Errorf("no refusal logged as %q (logged: %v)", want, seen)
		}
	}
}

// One shared token (no prefill token) grants both roles; a worker may hold
// only its digest.
func TestSharedTokenAndDigest(t *testing.T) {
	shared := Options{TokenFile: writeFile(t, "tok", coordToken)}
	// sha256 of coordToken.
	digest := Options{TokenFile: writeFile(t, "digest", "sha256:"+hexDigest(coordToken))}
	worker, err := digest.Load(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, worker)
	for _, present := range []Role{RoleCoordinator, RolePrefill} {
		c, err := shared.Load(present, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, p, _ := calls(t, dial(t, addr, c.DialOptions()...))
		if r != codes.OK || p != codes.OK {
			t.Errorf("shared token sent as %v: Reserve %v, Push %v; want OK, OK", present, r, p)
		}
	}
}

// A decode worker (present 0) sends the prefill token on its KV pulls
// when it holds the token itself, nothing when it holds only the digest,
// and never a shared token, which would grant the coordinator's role:
// Reserve refused, Push allowed only with the prefill token.
func TestDecodeWorkerSends(t *testing.T) {
	server, err := Options{TokenFile: writeFile(t, "c", "sha256:"+hexDigest(coordToken)), PrefillTokenFile: writeFile(t, "p", "sha256:"+hexDigest(prefillToken))}.Load(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, server)
	for _, tc := range []struct {
		name    string
		o       Options
		reserve codes.Code
		push    codes.Code
	}{
		{"the prefill token itself", Options{TokenFile: writeFile(t, "c", "sha256:"+hexDigest(coordToken)), PrefillTokenFile: writeFile(t, "p", prefillToken)}, codes.PermissionDenied, codes.OK},
		{"the prefill token's digest", Options{TokenFile: writeFile(t, "c", "sha256:"+hexDigest(coordToken)), PrefillTokenFile: writeFile(t, "p", "sha256:"+hexDigest(prefillToken))}, codes.Unauthenticated, codes.Unauthenticated},
		{"one shared token itself", Options{TokenFile: writeFile(t, "c", coordToken)}, codes.Unauthenticated, codes.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			decode, err := tc.o.Load(0, nil)
			if err != nil {
				t.Fatal(err)
			}
			r, p, _ := calls(t, dial(t, addr, decode.DialOptions()...))
			if r != tc.reserve || p != tc.push {
				t.Errorf("Reserve %v, Push %v; want %v, %v", r, p, tc.reserve, tc.push)
			}
		})
	}
}

// Nothing configured: every call goes through; the caller is the peer IP.
func TestOpen(t *testing.T) {
	a, err := Options{}.Load(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, f := serve(t, a)
	r, p, h := calls(t, dial(t, addr))
	if r != codes.OK || p != codes.OK || h != codes.OK {
		t.Errorf("open server: Reserve %v, Push %v, Health %v; want OK", r, p, h)
	}
	if got := f.lastCaller(); got != "ip:127.0.0.1" {
		t.Errorf("caller %q, want ip:127.0.0.1", got)
	}
	if got := Caller(context.Background()); got != "" {
		t.Errorf("Caller of an in-process call %q, want empty", got)
	}
}

func TestMutualTLSIdentities(t *testing.T) {
	ca := tlstest.NewCA(t, "grpcauth test CA")
	server := ca.Issue(t, tlstest.Leaf{DNSNames: []string{"worker.test"}})
	coordID := "spiffe://test/ns/pdserve/sa/coordinator"
	coordCert := ca.Issue(t, tlstest.Leaf{URIs: []*url.URL{tlstest.MustURL(t, coordID)}})
	prefillCert := ca.Issue(t, tlstest.Leaf{DNSNames: []string{"Prefill.PDServe.test"}})
	other := ca.Issue(t, tlstest.Leaf{DNSNames: []string{"intruder.test"}})

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	serverPair := loadPair(t, server)
	serverCreds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serverPair}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	})
	clientCreds := func(p *tlstest.Pair) grpc.DialOption {
		cfg := &tls.Config{RootCAs: pool, ServerName: "worker.test", MinVersion: tls.VersionTLS13}
		if p != nil {
			cfg.Certificates = []tls.Certificate{loadPair(t, *p)}
		}
		return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
	}

	t.Run("allowed identities", func(t *testing.T) {
		a, err := Options{AllowCoordinator: []string{coordID}, AllowPrefill: []string{"prefill.pdserve.test"}}.Load(0, nil)
		if err != nil {
			t.Fatal(err)
		}
		addr, f := serve(t, a, grpc.Creds(serverCreds))
		for _, tc := range []struct {
			name                    string
			cert                    *tlstest.Pair
			reserve, push, healthOK codes.Code
			caller                  string // of the last call let through
		}{
			// The worker requires a client certificate: the handshake fails.
			{"no client certificate", nil, codes.Unavailable, codes.Unavailable, codes.Unavailable, ""},
			{"coordinator", &coordCert, codes.OK, codes.PermissionDenied, codes.OK, coordID},
			{"prefill", &prefillCert, codes.PermissionDenied, codes.OK, codes.OK, "prefill.pdserve.test"},
			{"another certificate of the CA", &other, codes.PermissionDenied, codes.PermissionDenied, codes.OK, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r, p, h := calls(t, dialRaw(t, addr, clientCreds(tc.cert)))
				if r != tc.reserve || p != tc.push || h != tc.healthOK {
					t.Errorf("Reserve %v, Push %v, Health %v; want %v, %v, %v", r, p, h, tc.reserve, tc.push, tc.healthOK)
				}
				if tc.caller != "" && f.lastCaller() != tc.caller {
					t.Errorf("caller %q, want %q", f.lastCaller(), tc.caller)
				}
			})
		}
	})
	t.Run("no lists: any certificate of the CA, named by its first name", func(t *testing.T) {
		a, err := Options{}.Load(0, nil)
		if err != nil {
			t.Fatal(err)
		}
		addr, f := serve(t, a, grpc.Creds(serverCreds))
		r, p, _ := calls(t, dialRaw(t, addr, clientCreds(&other)))
		if r != codes.OK || p != codes.OK {
			t.Errorf("Reserve %v, Push %v; want OK", r, p)
		}
		if got := f.lastCaller(); got != "intruder.test" {
			t.Errorf("caller %q, want the certificate's name", got)
		}
	})
	t.Run("token and certificate both required", func(t *testing.T) {
		o := Options{TokenFile: writeFile(t, "tok", coordToken), PrefillTokenFile: writeFile(t, "pre", prefillToken), AllowCoordinator: []string{coordID}}
		a, err := o.Load(0, nil)
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := serve(t, a, grpc.Creds(serverCreds))
		coord, err := o.Load(RoleCoordinator, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			opts []grpc.DialOption
			want codes.Code
		}{
			{"coordinator certificate, no token", []grpc.DialOption{clientCreds(&coordCert)}, codes.Unauthenticated},
			{"coordinator token, prefill certificate", append([]grpc.DialOption{clientCreds(&prefillCert)}, coord.DialOptions()...), codes.PermissionDenied},
			{"both", append([]grpc.DialOption{clientCreds(&coordCert)}, coord.DialOptions()...), codes.OK},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r, _, _ := calls(t, dialRaw(t, addr, tc.opts...))
				if r != tc.want {
					t.Errorf("Reserve %v, want %v", r, tc.want)
				}
			})
		}
	})
}

func hexDigest(tok string) string {
	d := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(d[:])
}

func loadPair(t *testing.T, p tlstest.Pair) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dialRaw dials with exactly opts (transport credentials included).
func dialRaw(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func TestOptionsValidate(t *testing.T) {
	good := writeFile(t, "good", coordToken)
	short := writeFile(t, "short", "too-short")
	digest := writeFile(t, "digest", "sha256:"+hexDigest(coordToken))
	badDigest := writeFile(t, "bad-digest", "sha256:abc")
	spaced := writeFile(t, "spaced", "a token with spaces in it")
	for _, tc := range []struct {
		name    string
		o       Options
		present Role
		want    string // substring of the error; "" for none
	}{
		{"nothing", Options{}, RoleCoordinator, ""},
		{"token", Options{TokenFile: good}, RoleCoordinator, ""},
		{"in-memory tokens", Options{Token: coordToken, PrefillToken: prefillToken}, RolePrefill, ""},
		{"digest on a decode worker", Options{TokenFile: digest, PrefillTokenFile: digest}, 0, ""},
		{"digest on the coordinator", Options{TokenFile: digest}, RoleCoordinator, "holds a digest"},
		{"shared digest on a prefill worker", Options{TokenFile: digest}, RolePrefill, "grpc-token-file"},
		{"prefill digest on a prefill worker", Options{TokenFile: digest, PrefillTokenFile: digest}, RolePrefill, "grpc-prefill-token-file"},
		{"missing file", Options{TokenFile: filepath.Join(t.TempDir(), "none")}, 0, "grpc-token-file"},
		{"short token", Options{TokenFile: short}, 0, "at least 16"},
		{"bad digest", Options{TokenFile: badDigest}, 0, "hex digits"},
		{"spaces", Options{TokenFile: spaced}, 0, "printable ASCII"},
		{"prefill token alone", Options{PrefillTokenFile: good}, 0, "needs grpc-token-file"},
		{"identities", Options{AllowCoordinator: []string{"spiffe://td/coord", "coord.svc"}}, 0, ""},
		{"bad identity", Options{AllowPrefill: []string{"prefill worker"}}, 0, "tls-allow-prefill"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate(tc.present)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want an error with %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), coordToken) {
				t.Errorf("error %v shows the token", err)
			}
		})
	}
}

func TestListFlag(t *testing.T) {
	var o Options
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	o.AddFlags(fs, true)
	if err := fs.Parse([]string{"--tls-allow-prefill=a.svc, spiffe://td/b", "--tls-allow-prefill", "c.svc", "--tls-allow-coordinator=spiffe://td/coordinator"}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.AllowPrefill, " "); got != "a.svc spiffe://td/b c.svc" {
		t.Errorf("AllowPrefill %q", got)
	}
	if got := strings.Join(o.AllowCoordinator, " "); got != "spiffe://td/coordinator" {
		t.Errorf("AllowCoordinator %q", got)
	}
	coord := flag.NewFlagSet("c", flag.ContinueOnError)
	o.AddFlags(coord, false)
	if coord.Lookup("tls-allow-prefill") != nil || coord.Lookup("grpc-token-file") == nil {
		t.Error("a client gets only --grpc-token-file")
	}
}

func TestRequired(t *testing.T) {
	for _, tc := range []struct {
		method string
		role   Role
		open   bool
	}{
		{pdservev1.DecodeService_Reserve_FullMethodName, RoleCoordinator, false},
		{pdservev1.DecodeService_Generate_FullMethodName, RoleCoordinator, false},
		{pdservev1.DecodeService_Cancel_FullMethodName, RoleCoordinator, false},
		{pdservev1.PrefillService_Prefill_FullMethodName, RoleCoordinator, false},
		{pdservev1.PrefillService_Resend_FullMethodName, RoleCoordinator, false},
		{pdservev1.PrefillService_Release_FullMethodName, RoleCoordinator, false},
		{pdservev1.KVTransferService_Push_FullMethodName, RolePrefill, false},
		{"/grpc.health.v1.Health/Check", 0, true},
		{"/grpc.health.v1.Health/Watch", 0, true},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", 0, false},
		{"garbage", 0, false},
	} {
		if r, open := Required(tc.method); r != tc.role || open != tc.open {
			t.Errorf("Required(%q) = %v, %v; want %v, %v", tc.method, r, open, tc.role, tc.open)
		}
	}
}
