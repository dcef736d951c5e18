package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// fakeWorker is an attacker's gRPC server: it answers health checks
// SERVING (so it looks alive) and records what every other call brings
// (the method and all its metadata), refusing it.
type fakeWorker struct {
	addr string

	mu    sync.Mutex
	calls []capturedCall
}

type capturedCall struct {
	method string
	md     metadata.MD
}

func startFake(t *testing.T, creds credentials.TransportCredentials) *fakeWorker {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeWorker{addr: lis.Addr().String()}
	s := grpc.NewServer(grpc.Creds(creds), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		m, _ := grpc.MethodFromServerStream(ss)
		md, _ := metadata.FromIncomingContext(ss.Context())
		f.mu.Lock()
		f.calls = append(f.calls, capturedCall{method: m, md: md.Copy()})
		f.mu.Unlock()
		return status.Error(codes.Unimplemented, "a fake")
	}))
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, hs)
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Serve(lis) })
	t.Cleanup(func() {
		s.Stop()
		wg.Wait()
	})
	return f
}

func (f *fakeWorker) captured() []capturedCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// forger publishes heartbeats as a shared role user would: for any id of
// the role, saying anything.
type forger struct {
	nc *nats.Conn
}

func newForger(t *testing.T, url, user, password string) *forger {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(user, password))
	if err != nil {
		t.Fatalf("attacker's NATS login as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return &forger{nc: nc}
}

// beat publishes hb every 20 ms until the test ends.
func (f *forger) beat(t *testing.T, hb control.Heartbeat) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			hb.Time = time.Now()
			b, _ := json.Marshal(hb)
			_ = f.nc.Publish(control.HeartbeatSubject(hb.Role, hb.ID), b)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
}

// The attack of issue 25: with the shared decode role's NATS password, a
// peer registers decode--evil at its own gRPC listener with a huge
// kv_blocks_free. Whatever it receives is worth nothing against the real
// workers (every credential is signed for decode--evil, one method and a
// short expiry, and used once), and the users routed to it are served by
// failover, none gets a 500. Forged limits change nothing for the other
// workers' requests: max_seq_len 1 is refused outright, and a worker
// advertising a short context takes only what fits it while /v1/models
// keeps the real workers' limit.
func TestStolenRolePasswordCapturesNothing(t *testing.T) {
	const decodeUser, decodePassword = "decode", "shared-decode-password-0123"
	cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) {
		o.NATSUsers = append(o.NATSUsers, control.NATSUser{User: decodeUser, Password: decodePassword, Role: control.RoleDecode})
	}})
	var realDecode, realPrefill *workerrun.Worker
	for _, w := range cl.c.Workers() {
		switch w.Role() {
		case control.RoleDecode:
			realDecode = w
		case control.RolePrefill:
			realPrefill = w
		}
	}
	real, _ := cl.c.Membership().Get(realDecode.ID())
	modelsBefore := listModels(t, cl.url)

	evil, short := startFake(t, insecure.NewCredentials()), startFake(t, insecure.NewCredentials())
	f := newForger(t, cl.c.NATSURL(), decodeUser, decodePassword)
	forged := func(id, addr string, maxSeqLen int) control.Heartbeat {
		return control.Heartbeat{ID: id, Role: string(control.RoleDecode), GRPCAddr: addr, Model: real.Model, MaxSeqLen: maxSeqLen,
			KVBlocksFree: 1 << 20, KVBlocksTotal: 1 << 20, HashKeyID: clusterHashKey.ID()}
	}
	f.beat(t, forged("decode--evil", evil.addr, real.MaxSeqLen))
	f.beat(t, forged("decode--tiny", evil.addr, 1))
	f.beat(t, forged("decode--short", short.addr, 32))
	// Plaintext: the fakes answer health checks, so they are admitted
	// (unverified, as the docs say); only TLS keeps them out.
	waitFor(t, 10*time.Second, func() error {
		var ids []string
		for _, hb := range cl.c.Membership().Members(control.RoleDecode) {
			ids = append(ids, hb.ID)
		}
		if !slices.Contains(ids, "decode--evil") || !slices.Contains(ids, "decode--short") {
			return fmt.Errorf("decode members %v: the forged workers are not routable yet", ids)
		}
		return nil
	})
	if _, ok := cl.c.Membership().Get("decode--tiny"); ok {
		t.Error("a heartbeat with max_seq_len 1 made decode--tiny a member")
	}

	// 20 users; the router prefers the fakes' free KV. Each prompt and
	// its max_tokens exceed decode--short's 32 tokens.
	for i := range 20 {
		prompt := fmt.Sprintf("user %02d asks a question long enough for forty tokens", i)
		if r := complete(context.Background(), t, cl.url, request{Prompt: prompt, MaxTokens: 4, IgnoreEOS: true}); len(r.Tokens) != 4 {
			t.Fatalf("user %d: %d tokens, want 4", i, len(r.Tokens))
		}
	}
	if diff := listModels(t, cl.url); diff != modelsBefore {
		t.Errorf("/v1/models changed under forged heartbeats: %s, before %s", diff, modelsBefore)
	}
	if n := len(short.captured()); n != 0 {
		t.Errorf("decode--short (max_seq_len 32) got %d calls for requests longer than its context", n)
	}

	calls := evil.captured()
	if len(calls) == 0 {
		t.Fatal("no call reached decode--evil: the test shows nothing")
	}
	var creds []string
	for _, c := range calls {
		if v := c.md.Get("authorization"); len(v) > 0 {
			t.Errorf("%s brought a static token to decode--evil", c.method)
		}
		creds = append(creds, c.md.Get("pdserve-credential")...)
	}
	if len(creds) == 0 {
		t.Fatal("the coordinator's calls carried no signed credential")
	}
	t.Logf("decode--evil captured %d calls, %d credentials", len(calls), len(creds))

	// What it captured, against the real workers.
	dial := func(addr string) *grpc.ClientConn {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	dc, pc := pdservev1.NewDecodeServiceClient(dial(realDecode.Addr())), pdservev1.NewPrefillServiceClient(dial(realPrefill.Addr()))
	for i, cred := range creds {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "pdserve-credential", cred), 10*time.Second)
		_, rerr := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: fmt.Sprint("stolen-", i), Tokens: 8, Sequences: 1, PromptTokens: 4})
		var perr error
		if st, err := pc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: fmt.Sprint("stolen-", i), PromptTokens: []int32{1, 2, 3}, DecodeAddr: evil.addr}); err != nil {
			perr = err
		} else {
			_, perr = st.Recv()
		}
		cancel()
		if status.Code(rerr) != codes.Unauthenticated || status.Code(perr) != codes.Unauthenticated {
			t.Errorf("captured credential %d: Reserve on the real decode worker %v, Prefill on the real prefill worker %v; want UNAUTHENTICATED", i, rerr, perr)
		}
	}
}

// Over TLS a forged worker cannot register: the coordinator's handshake
// refuses its certificate (not signed by the CA) before any call, so it
// is never admitted, gets no user and adds no model.
func TestForgedWorkerOverTLSIsNeverAdmitted(t *testing.T) {
	const decodeUser, decodePassword = "decode", "shared-decode-password-0123"
	tlsOpts := tlsOptions(t, "pdserve test CA")
	cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) {
		o.TLS = tlsOpts
		o.NATSUsers = append(o.NATSUsers, control.NATSUser{User: decodeUser, Password: decodePassword, Role: control.RoleDecode})
	}})
	rogue := tlsOptions(t, "rogue CA")
	rt, err := rogue.Load(grpcnet.TLSServe, nil)
	if err != nil {
		t.Fatal(err)
	}
	evil := startFake(t, rt.ServerCredentials())
	var real control.Heartbeat
	for _, hb := range cl.c.Membership().Members(control.RoleDecode) {
		real = hb
	}
	f := newForger(t, cl.c.NATSURL(), decodeUser, decodePassword)
	f.beat(t, control.Heartbeat{ID: "decode--evil", Role: string(control.RoleDecode), GRPCAddr: evil.addr, Model: "evil-model",
		MaxSeqLen: real.MaxSeqLen, KVBlocksFree: 1 << 20, KVBlocksTotal: 1 << 20, HashKeyID: clusterHashKey.ID()})
	waitFor(t, 10*time.Second, func() error {
		if _, ok := cl.c.Membership().Get("decode--evil"); !ok {
			return errors.New("decode--evil's heartbeat not observed yet")
		}
		return nil
	})
	for i := range 10 {
		if r := complete(context.Background(), t, cl.url, request{Prompt: fmt.Sprint("user ", i), MaxTokens: 3, IgnoreEOS: true}); len(r.Tokens) != 3 {
			t.Fatalf("user %d: %d tokens, want 3", i, len(r.Tokens))
		}
	}
	for _, hb := range cl.c.Membership().Members(control.RoleDecode) {
		if hb.ID == "decode--evil" {
			t.Error("decode--evil was admitted over TLS without a certificate of the CA")
		}
	}
	if m := listModels(t, cl.url); strings.Contains(m, "evil-model") {
		t.Errorf("/v1/models lists the forged worker's model: %s", m)
	}
	if n := len(evil.captured()); n != 0 {
		t.Errorf("%d calls reached decode--evil over TLS", n)
	}
}

// listModels returns /v1/models' body.
func listModels(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	var ms []string
	for _, d := range body.Data {
		var m map[string]any
		_ = json.Unmarshal(d, &m)
		delete(m, "created")
		b, _ := json.Marshal(m)
		ms = append(ms, string(b))
	}
	return strings.Join(ms, ",")
}
