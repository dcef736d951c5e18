package coordinator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator/flow"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/metrics"
	"github.com/pdserve/pdserve/pkg/router"
	"github.com/pdserve/pdserve/pkg/wire"
)

// The output every scripted decode worker generates (max_tokens 4).
var scripted = []int32{7, 8, 9, 10}

// fakeDecode is a scripted decode worker: Reserve and Cancel keep a set of
// reservations, Generate runs generate (default: stream scripted after
// generated_tokens, then finish). Safe for concurrent use.
type fakeDecode struct {
	pdservev1.UnimplementedDecodeServiceServer
	id, addr string
	generate func(ctx context.Context, req *pdservev1.GenerateRequest, send func(*pdservev1.GenerateResponse) error) error

	mu        sync.Mutex
	reserved  map[string]bool // live reservations
	ever      map[string]bool // every id reserved so far
	generates int
	cancelled int // Generate calls that ended because their caller cancelled them
}

func (d *fakeDecode) Reserve(_ context.Context, req *pdservev1.ReserveRequest) (*pdservev1.ReserveResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reserved[req.GetRequestId()] = true
	d.ever[req.GetRequestId()] = true
	return &pdservev1.ReserveResponse{Blocks: 1}, nil
}

func (d *fakeDecode) Cancel(_ context.Context, req *pdservev1.CancelRequest) (*pdservev1.CancelResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.reserved, req.GetRequestId())
	return &pdservev1.CancelResponse{}, nil
}

func (d *fakeDecode) Generate(req *pdservev1.GenerateRequest, stream grpc.ServerStreamingServer[pdservev1.GenerateResponse]) error {
	d.mu.Lock()
	d.generates++
	d.mu.Unlock()
	gen := d.generate
	if gen == nil {
		gen = streamScripted
	}
	err := gen(stream.Context(), req, stream.Send)
	d.mu.Lock()
	defer d.mu.Unlock()
	if stream.Context().Err() != nil {
		d.cancelled++
	}
	delete(d.reserved, req.GetRequestId()) // the call's end frees the request
	return err
}

// reservedOnce reports whether id was ever reserved here.
func (d *fakeDecode) reservedOnce(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ever[id]
}

func (d *fakeDecode) counts() (generates, cancelled, reserved int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.generates, d.cancelled, len(d.reserved)
}

// streamScripted is a healthy decode worker that has the KV: it streams
// the tokens of scripted after generated_tokens and finishes (with
// remote KV and none generated, from the second: the first is the
// prefill worker's FirstToken).
func streamScripted(_ context.Context, req *pdservev1.GenerateRequest, send func(*pdservev1.GenerateResponse) error) error {
	from := len(req.GetGeneratedTokens())
	if from == 0 && !req.GetLocalPrefill() {
		from = 1
	}
	rest := scripted[from:]
	return send(&pdservev1.GenerateResponse{Tokens: rest, Finish: pdservev1.FinishReason_FINISH_REASON_LENGTH})
}

// waitForKV is a healthy decode worker whose KV never comes: its call
// lasts until the caller ends it.
func waitForKV(ctx context.Context, _ *pdservev1.GenerateRequest, _ func(*pdservev1.GenerateResponse) error) error {
	<-ctx.Done()
	return status.FromContextError(ctx.Err()).Err()
}

// fakePrefill is a scripted prefill worker: the n-th Prefill call (from
// 0) runs prefill(n, ...), the n-th Resend resend(n, ...). Safe for
// concurrent use.
type fakePrefill struct {
	pdservev1.UnimplementedPrefillServiceServer
	prefill func(n int, req *pdservev1.PrefillRequest, send func(*pdservev1.PrefillResponse) error) error
	resend  func(n int, req *pdservev1.ResendRequest) (*pdservev1.ResendResponse, error)

	mu       sync.Mutex
	prefills int
	resends  int
	targets  []string // decode_addr of every Prefill and Resend, in order
	released int
}

func (p *fakePrefill) Prefill(req *pdservev1.PrefillRequest, stream grpc.ServerStreamingServer[pdservev1.PrefillResponse]) error {
	p.mu.Lock()
	n := p.prefills
	p.prefills++
	p.targets = append(p.targets, req.GetDecodeAddr())
	p.mu.Unlock()
	return p.prefill(n, req, stream.Send)
}

func (p *fakePrefill) Resend(_ context.Context, req *pdservev1.ResendRequest) (*pdservev1.ResendResponse, error) {
	p.mu.Lock()
	n := p.resends
	p.resends++
	p.targets = append(p.targets, req.GetDecodeAddr())
	p.mu.Unlock()
	return p.resend(n, req)
}

// sentTo returns the decode_addr of every Prefill and Resend so far.
func (p *fakePrefill) sentTo() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.targets)
}

func (p *fakePrefill) Release(context.Context, *pdservev1.ReleaseRequest) (*pdservev1.ReleaseResponse, error) {
	p.mu.Lock()
	p.released++
	p.mu.Unlock()
	return &pdservev1.ReleaseResponse{}, nil
}

// prefilled is a prefill worker's successful call: queued, first token
// (scripted[0]), KV acknowledged.
func prefilled(send func(*pdservev1.PrefillResponse) error) error {
	for _, ev := range []*pdservev1.PrefillResponse{
		{Event: &pdservev1.PrefillResponse_Queued{Queued: &pdservev1.PrefillQueued{UnixNano: 1}}},
		{Event: &pdservev1.PrefillResponse_FirstToken{FirstToken: &pdservev1.FirstToken{Token: scripted[0]}}},
		{Event: &pdservev1.PrefillResponse_KvDone{KvDone: &pdservev1.KVDone{BytesRaw: 100, BytesWire: 100}}},
	} {
		if err := send(ev); err != nil {
			return err
		}
	}
	return nil
}

// transferFailed is the status a prefill worker ends a call with when its
// KV transfer to addr failed with code.
func transferFailed(code codes.Code, addr string) error {
	st := status.Newf(code, "prefill: kv transfer to %s failed", addr)
	st, err := st.WithDetails(&errdetails.ErrorInfo{Reason: wire.ErrorReasonKVTransfer, Domain: wire.ErrorDomain})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// serve registers the services register adds on a loopback gRPC server and
// returns its address.
func serve(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	register(g)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return lis.Addr().String()
}

// testBackend is a backend over scripted workers: decode workers decode-0,
// decode-1, ... (the router prefers them in that order: each has fewer
// free blocks than the one before) and one prefill worker.
type testBackend struct {
	b       *backend
	decodes []*fakeDecode
	pre     *fakePrefill
}

func newTestBackend(t *testing.T, pre *fakePrefill, decodes ...*fakeDecode) *testBackend {
	t.Helper()
	now := time.Now()
	members := control.NewMembership(time.Hour)
	for i, d := range decodes {
		d.id, d.reserved, d.ever = fmt.Sprint("decode-", i), map[string]bool{}, map[string]bool{}
		d.addr = serve(t, func(g *grpc.Server) { pdservev1.RegisterDecodeServiceServer(g, d) })
		members.Observe(control.Heartbeat{ID: d.id, Role: string(control.RoleDecode), GRPCAddr: d.addr,
			KVBlocksFree: 1000 - i, KVBlocksTotal: 1000, Time: now}, now)
	}
	paddr := serve(t, func(g *grpc.Server) { pdservev1.RegisterPrefillServiceServer(g, pre) })
	members.Observe(control.Heartbeat{ID: "prefill-0", Role: string(control.RolePrefill), GRPCAddr: paddr, Time: now}, now)
	cs := plainConns()
	t.Cleanup(cs.closeAll)
	return &testBackend{
		b: &backend{
			mode: ModeDisaggregated, policy: PolicyPrefill, codec: "none",
			log: zaptest.NewLogger(t), members: members, conns: cs, now: time.Now,
			router:  router.New(router.Config{}),
			metrics: metrics.New(prometheus.NewRegistry(), metrics.SLO{}),
		},
		decodes: decodes, pre: pre,
	}
}

// complete runs one request (max_tokens 4, ignore_eos) and returns the
// tokens emitted, the finish reason, the trace and the error.
func (tb *testBackend) complete(t *testing.T) ([]int32, string, *budget.Trace, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr := &budget.Trace{RequestID: "req-1", Arrival: time.Now(), PromptTokens: 3}
	req := &frontend.Request{ID: "req-1", Prompt: []int32{1, 2, 3}, MaxTokens: len(scripted), IgnoreEOS: true, Trace: tr, N: 1, Logprobs: -1, PromptLogprobs: -1}
	var got []int32
	finishes, err := tb.b.Complete(ctx, req, func(o frontend.Output) error {
		got = append(got, o.Tokens...)
		return nil
	})
	return got, strings.Join(finishes, ","), tr, err
}

// checkReserved fails the test unless the decode worker at addr reserved
// for id: KV may be sent to a worker only after its Reserve call returned.
// (The reservation may be gone by now: a worker frees it when its
// Generate call ends.)
func (tb *testBackend) checkReserved(t *testing.T, addr, id string) {
	t.Helper()
	for _, d := range tb.decodes {
		if d.addr == addr && !d.reservedOnce(id) {
			t.Errorf("kv sent to %s before it held a reservation for %s", d.id, id)
		}
	}
}

// The KV transfer to the decode worker fails (it lost the request, or the
// prefill worker cannot reach it) while that worker's Generate call is
// open and healthy. A decode worker waits for KV as long as its call
// lasts, so the coordinator must move the request: before, the prefill's
// "no reservation" error ended the request (or, after the first token,
// the request hung until the decode worker's KV wait timed out).
func TestRecoveryFromFailedTransfer(t *testing.T) {
	tests := []struct {
		name string
		// firstToken: the prefill worker reported the first token (its KV
		// is complete and retained) before the transfer failed.
		firstToken bool
		code       codes.Code
	}{
		{"before the first token, no reservation", false, codes.FailedPrecondition},
		{"before the first token, decode unreachable", false, codes.Unavailable},
		{"after the first token, decode unreachable", true, codes.Unavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var tb *testBackend
			pre := &fakePrefill{
				prefill: func(n int, req *pdservev1.PrefillRequest, send func(*pdservev1.PrefillResponse) error) error {
					tb.checkReserved(t, req.GetDecodeAddr(), req.GetRequestId())
					if n > 0 {
						return prefilled(send)
					}
					if err := send(&pdservev1.PrefillResponse{Event: &pdservev1.PrefillResponse_Queued{Queued: &pdservev1.PrefillQueued{UnixNano: 1}}}); err != nil {
						return err
					}
					if tc.firstToken {
						if err := send(&pdservev1.PrefillResponse{Event: &pdservev1.PrefillResponse_FirstToken{FirstToken: &pdservev1.FirstToken{Token: scripted[0]}}}); err != nil {
							return err
						}
					}
					return transferFailed(tc.code, req.GetDecodeAddr())
				},
				resend: func(_ int, req *pdservev1.ResendRequest) (*pdservev1.ResendResponse, error) {
					tb.checkReserved(t, req.GetDecodeAddr(), req.GetRequestId())
					return &pdservev1.ResendResponse{KvDone: &pdservev1.KVDone{BytesRaw: 100}}, nil
				},
			}
			tb = newTestBackend(t, pre, &fakeDecode{generate: waitForKV}, &fakeDecode{})
			got, finish, tr, err := tb.complete(t)
			if err != nil {
				t.Fatalf("request failed: %v", err)
			}
			if diff := cmp.Diff(scripted, got); diff != "" || finish != "length" {
				t.Errorf("finish %q, tokens (-want +got):\n%s", finish, diff)
			}
			if tr.Recoveries != 1 || tr.DecodeWorker != "decode-1" {
				t.Errorf("recoveries %d on %s, want 1 onto decode-1", tr.Recoveries, tr.DecodeWorker)
			}
			want := []string{tb.decodes[0].addr, tb.decodes[1].addr} // Prefill, then Prefill again or Resend
			if diff := cmp.Diff(want, pre.sentTo()); diff != "" {
				t.Errorf("kv sent to (-want +got):\n%s", diff)
			}
			// The worker sees its call end shortly after the coordinator.
			eventually(t, "decode-0's waiting call cancelled", func() error {
				if generates, cancelled, reserved := tb.decodes[0].counts(); cancelled != generates || reserved != 0 {
					return fmt.Errorf("decode-0: %d of %d Generate calls cancelled, %d reservations left", cancelled, generates, reserved)
				}
				return nil
			})
		})
	}
}

// A decode worker fails while the prompt still waits in the prefill
// worker's queue: the transfer to it fails later and nothing is retained,
// so the prompt is prefilled again for another decode worker, reserved
// first. Before, the prefill's transfer error ("no reservation") ended the
// request.
func TestRecoveryBeforeKVCompleted(t *testing.T) {
	var tb *testBackend
	failed := make(chan struct{}) // decode-0's Generate call failed
	pre := &fakePrefill{
		prefill: func(n int, req *pdservev1.PrefillRequest, send func(*pdservev1.PrefillResponse) error) error {
			tb.checkReserved(t, req.GetDecodeAddr(), req.GetRequestId())
			if n > 0 {
				return prefilled(send)
			}
			if err := send(&pdservev1.PrefillResponse{Event: &pdservev1.PrefillResponse_Queued{Queued: &pdservev1.PrefillQueued{UnixNano: 1}}}); err != nil {
				return err
			}
			<-failed // queued until after the decode worker failed
			return transferFailed(codes.FailedPrecondition, req.GetDecodeAddr())
		},
		resend: func(int, *pdservev1.ResendRequest) (*pdservev1.ResendResponse, error) {
			return nil, status.Error(codes.NotFound, "no kv retained")
		},
	}
	dead := &fakeDecode{generate: func(context.Context, *pdservev1.GenerateRequest, func(*pdservev1.GenerateResponse) error) error {
		defer close(failed)
		return status.Error(codes.Unavailable, "decode worker stopping")
	}}
	tb = newTestBackend(t, pre, dead, &fakeDecode{})
	got, finish, tr, err := tb.complete(t)
	if err != nil {
		t.Fatalf("request failed: %v", err)
	}
	if diff := cmp.Diff(scripted, got); diff != "" || finish != "length" {
		t.Errorf("finish %q, tokens (-want +got):\n%s", finish, diff)
	}
	if tr.Recoveries != 1 || tr.DecodeWorker != "decode-1" {
		t.Errorf("recoveries %d on %s, want 1 onto decode-1", tr.Recoveries, tr.DecodeWorker)
	}
	if diff := cmp.Diff([]string{dead.addr, tb.decodes[1].addr}, pre.sentTo()); diff != "" {
		t.Errorf("prefills sent kv to (-want +got):\n%s", diff)
	}
}

// A Resend the new decode worker cannot take moves the request on to the
// next decode worker, reserving there before re-sending. Before, the
// request failed at the first refused Resend.
func TestRecoveryWhenResendFails(t *testing.T) {
	var tb *testBackend
	pre := &fakePrefill{
		prefill: func(_ int, req *pdservev1.PrefillRequest, send func(*pdservev1.PrefillResponse) error) error {
			return prefilled(send)
		},
		resend: func(n int, req *pdservev1.ResendRequest) (*pdservev1.ResendResponse, error) {
			tb.checkReserved(t, req.GetDecodeAddr(), req.GetRequestId())
			if n == 0 {
				return nil, transferFailed(codes.Unavailable, req.GetDecodeAddr())
			}
			return &pdservev1.ResendResponse{KvDone: &pdservev1.KVDone{BytesRaw: 100}}, nil
		},
	}
	// decode-0 streams the token after the first (the prefill worker's),
	// then fails.
	failing := &fakeDecode{generate: func(_ context.Context, _ *pdservev1.GenerateRequest, send func(*pdservev1.GenerateResponse) error) error {
		if err := send(&pdservev1.GenerateResponse{Tokens: scripted[1:2]}); err != nil {
			return err
		}
		return status.Error(codes.Internal, "decode step failed")
	}}
	tb = newTestBackend(t, pre, failing, &fakeDecode{generate: waitForKV}, &fakeDecode{})
	got, finish, tr, err := tb.complete(t)
	if err != nil {
		t.Fatalf("request failed: %v", err)
	}
	if diff := cmp.Diff(scripted, got); diff != "" || finish != "length" {
		t.Errorf("finish %q, tokens (-want +got):\n%s", finish, diff)
	}
	if tr.Recoveries != 2 || tr.DecodeWorker != "decode-2" {
		t.Errorf("recoveries %d on %s, want 2 ending on decode-2", tr.Recoveries, tr.DecodeWorker)
	}
	if diff := cmp.Diff([]string{tb.decodes[0].addr, tb.decodes[1].addr, tb.decodes[2].addr}, pre.sentTo()); diff != "" {
		t.Errorf("kv sent to (-want +got):\n%s", diff)
	}
	eventually(t, "decode-1's waiting call cancelled", func() error {
		if generates, cancelled, reserved := tb.decodes[1].counts(); cancelled != generates || reserved != 0 {
			return fmt.Errorf("decode-1: %d of %d Generate calls cancelled, %d reservations left", cancelled, generates, reserved)
		}
		return nil
	})
}

// Failures that another decode worker would not fix end the request at
// once with the matching client error, and free the decode worker's
// reservation: a full prefill queue (429), a transfer the decode worker
// refuses as malformed (400), a prefill worker's own failure (503).
func TestPrefillFailuresEndTheRequest(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"prefill queue full", status.Error(codes.ResourceExhausted, "prefill: queue full"), frontend.ErrOverloaded},
		{"malformed transfer", transferFailed(codes.InvalidArgument, "decode"), frontend.ErrInvalid},
		{"prefill worker stopping", status.Error(codes.Unavailable, "prefill: worker stopping"), frontend.ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pre := &fakePrefill{prefill: func(int, *pdservev1.PrefillRequest, func(*pdservev1.PrefillResponse) error) error { return tc.err }}
			tb := newTestBackend(t, pre, &fakeDecode{generate: waitForKV}, &fakeDecode{})
			_, _, tr, err := tb.complete(t)
			if !errors.Is(err, tc.want) {
				t.Errorf("error %v, want one wrapping %v", err, tc.want)
			}
			if tr.Recoveries != 0 {
				t.Errorf("%d recoveries, want none", tr.Recoveries)
			}
			for _, d := range tb.decodes {
				if _, _, reserved := d.counts(); reserved != 0 {
					t.Errorf("%s holds %d reservations after the request ended", d.id, reserved)
				}
			}
			if slices.Contains(pre.sentTo(), tb.decodes[1].addr) {
				t.Errorf("the prompt was sent to a second decode worker: %v", pre.sentTo())
			}
		})
	}
}

// eventually polls f every few milliseconds until it returns nil, failing
// the test with f's last error after 10 s.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// The coordinator never points a prefill worker's retained KV at an
// address that is not a live decode worker's: a recovery whose new decode
// worker left (or a forged target) gets no Resend.
func TestResendOnlyToMembers(t *testing.T) {
	pre := &fakePrefill{}
	tb := newTestBackend(t, pre, &fakeDecode{})
	hbs := tb.b.members.Members(control.RolePrefill)
	r := &run{b: tb.b, ctx: context.Background(), req: &frontend.Request{ID: "req-1", Trace: &budget.Trace{}},
		events: make(chan event, 4)}
	prefill := router.Worker{ID: hbs[0].ID, Addr: hbs[0].GRPCAddr}
	for _, target := range []router.Worker{
		{ID: "decode-9", Addr: "198.18.0.9:7000"},  // not a member
		{ID: "decode-0", Addr: "198.18.0.9:7000"},  // a member's id at another address
		{ID: "decode-x", Addr: tb.decodes[0].addr}, // a member's address under another id
	} {
		if err := r.startResend(flow.Resend{Prefill: prefill, Decode: target}); err == nil {
			t.Errorf("Resend to %+v: no error, want a refusal", target)
		}
	}
	pre.mu.Lock()
	defer pre.mu.Unlock()
	if pre.resends != 0 || r.live != 0 {
		t.Errorf("%d Resend calls made (%d goroutines), want none", pre.resends, r.live)
	}
}
