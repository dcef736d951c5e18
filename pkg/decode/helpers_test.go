package decode

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/workertest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The setup both workers' tests share (see workertest).
var (
	newEngine = workertest.Engine
	testCtx   = workertest.Ctx
	prompt    = workertest.Prompt
)

// reference generates with the engine alone: prefill the whole prompt, then
// decode until maxTokens tokens (EOS ignored).
func reference(t *testing.T, prompt []int32, maxTokens int, s engine.Sampling) []int32 {
	t.Helper()
	e := newEngine(t)
	ctx := context.Background()
	out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: prompt, Sampling: s, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	toks := []int32{out[0].Token}
	for len(toks) < maxTokens {
		out, err := e.Decode(ctx, []engine.DecodeItem{{Seq: 1, Token: toks[len(toks)-1], Sampling: s}})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, out[0].Token)
	}
	return toks
}

// testWorker is a decode Server on a loopback gRPC server.
type testWorker struct {
	s      *Server
	addr   string
	client pdservev1.DecodeServiceClient
	run    func() // starts the scheduler; called by newWorker unless deferred
}

// newWorker starts a Server. With start false the caller starts the
// scheduler with run(), so that requests can pile up first. edit, when
// given, changes the Server before it serves (e.g. a fake clock).
func newWorker(t testing.TB, o Options, start bool, edit ...func(*Server)) *testWorker {
	t.Helper()
	return newWorkerOn(t, newEngine(t), o, start, edit...)
}

// newWorkerOn is newWorker on engine eng.
func newWorkerOn(t testing.TB, eng engine.Engine, o Options, start bool, edit ...func(*Server)) *testWorker {
	t.Helper()
	s, err := New(eng, o, zaptest.NewLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range edit {
		f(s)
	}
	register := func(g grpc.ServiceRegistrar) { s.Register(g) }
	sv := workertest.Serve(t, workertest.Server{Register: register, Run: s.Run, Stop: s.Stop}, start, kvtransfer.GRPCServerOptions()...)
	return &testWorker{s: s, addr: sv.Addr, client: pdservev1.NewDecodeServiceClient(sv.Conn), run: sv.Start}
}

func smallOptions() Options {
	o := DefaultOptions()
	o.KVBlocks = 64
	o.BlockTokens = 16
	o.MaxBatch = 8
	o.ChunkTokens = 8
	o.MaxBatchTokens = 24
	return o
}

// result is what one Generate call streamed.
type result struct {
	tokens  []int32
	reason  string
	batches []int32 // batch_size of each event carrying tokens
	stamps  map[pdservev1.StampKind]int64
	events  int
}

// collect reads a Generate stream to its end.
func collect(stream grpc.ServerStreamingClient[pdservev1.GenerateResponse]) (result, error) {
	r := result{stamps: map[pdservev1.StampKind]int64{}}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return r, nil
		}
		if err != nil {
			return r, err
		}
		r.events++
		r.tokens = append(r.tokens, ev.GetTokens()...)
		if len(ev.GetTokens()) > 0 {
			r.batches = append(r.batches, ev.GetBatchSize())
		}
		for _, s := range ev.GetStamps() {
			r.stamps[s.GetKind()] = s.GetUnixNano()
		}
		if f := wire.FromFinishReason(ev.GetFinish()); f != "" {
			r.reason = f
		}
	}
}

// fakeTimers replaces the Server's reservation timers: a timer fires only
// when the test calls fire, so TTL behaviour is tested without waiting.
// Safe for concurrent use.
type fakeTimers struct {
	mu     sync.Mutex
	timers []*fakeTimer
}

type fakeTimer struct {
	ft      *fakeTimers
	f       func()
	stopped bool
	fired   bool
}

// install makes s use ft for its timers.
func (ft *fakeTimers) install(s *Server) {
	s.afterFunc = func(_ time.Duration, f func()) timer {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		t := &fakeTimer{ft: ft, f: f}
		ft.timers = append(ft.timers, t)
		return t
	}
}

// Stop implements timer.
func (t *fakeTimer) Stop() bool {
	t.ft.mu.Lock()
	defer t.ft.mu.Unlock()
	active := !t.stopped && !t.fired
	t.stopped = true
	return active
}

// armed returns the number of timers neither stopped nor fired.
func (ft *fakeTimers) armed() int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	n := 0
	for _, t := range ft.timers {
		if !t.stopped && !t.fired {
			n++
		}
	}
	return n
}

// fire runs every armed timer's function, as if the TTL had passed, and
// returns how many fired. Timers armed by those functions wait for the
// next call.
func (ft *fakeTimers) fire() int {
	ft.mu.Lock()
	var due []*fakeTimer
	for _, t := range ft.timers {
		if !t.stopped && !t.fired {
			t.fired = true
			due = append(due, t)
		}
	}
	ft.mu.Unlock()
	for _, t := range due {
		t.f()
	}
	return len(due)
}
