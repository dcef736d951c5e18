package prefill

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/workertest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The setup both workers' tests share (see workertest).
var (
	newEngine = workertest.Engine
	testCtx   = workertest.Ctx
	prompt    = workertest.Prompt
)

// referenceKV prefills p on an engine alone and returns its first token and
// every layer's KV.
func referenceKV(t *testing.T, p []int32) (int32, [][]byte) {
	t.Helper()
	e := newEngine(t)
	out, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kv := make([][]byte, e.Spec().Layers)
	for l := range kv {
		if kv[l], err = e.ExportKV(1, l, 0, len(p), nil); err != nil {
			t.Fatal(err)
		}
	}
	return out[0].Token, kv
}

// fakeReceiver is a decode worker's transfer endpoint that keeps what it
// receives. begin, when set, may refuse a transfer; gate, when set, holds
// every Write until it is closed or the stream ends.
type fakeReceiver struct {
	begin func(h kvtransfer.StreamHeader) error
	gate  chan struct{}

	mu  sync.Mutex
	got map[string]*received
}

type received struct {
	h         kvtransfer.StreamHeader
	layers    [][]byte // per layer, the canonical KV of all tokens received
	frames    int
	first     int32
	firstLP   *pdservev1.TokenLogprob
	prov      pdservev1.KVProvenance // the commit's
	committed bool
	aborted   bool
}

func (f *fakeReceiver) Begin(ctx context.Context, h kvtransfer.StreamHeader) (kvtransfer.Sink, error) {
	if f.begin != nil {
		if err := f.begin(h); err != nil {
			return nil, err
		}
	}
	r := &received{h: h, layers: make([][]byte, h.Layers)}
	f.mu.Lock()
	if f.got == nil {
		f.got = map[string]*received{}
	}
	f.got[h.RequestID] = r
	f.mu.Unlock()
	return &fakeSink{f: f, r: r, ctx: ctx}, nil
}

func (f *fakeReceiver) get(id string) (received, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.got[id]
	if !ok {
		return received{}, false
	}
	return *r, true
}

type fakeSink struct {
	f   *fakeReceiver
	r   *received
	ctx context.Context
}

func (s *fakeSink) Write(layer, start, end int, raw []byte) error {
	if s.f.gate != nil {
		select {
		case <-s.f.gate:
		case <-s.ctx.Done():
			return s.ctx.Err()
		}
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.r.layers[layer] = appendCanonical(s.r.layers[layer], raw)
	s.r.frames++
	return nil
}

func (s *fakeSink) Commit(c kvtransfer.Commit) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.r.first, s.r.firstLP, s.r.prov, s.r.committed = c.FirstToken, c.FirstLogprob, c.Provenance, true
	return nil
}

func (s *fakeSink) Abort(err error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.r.aborted = true
}

// appendCanonical appends the canonical chunk raw to the canonical KV of a
// layer: both hold all K of their tokens, then all V, so the K halves and
// the V halves are joined separately.
func appendCanonical(layer, raw []byte) []byte {
	if len(layer) == 0 {
		return append([]byte(nil), raw...)
	}
	k := layer[:len(layer)/2]
	v := layer[len(layer)/2:]
	out := make([]byte, 0, len(layer)+len(raw))
	out = append(out, k...)
	out = append(out, raw[:len(raw)/2]...)
	out = append(out, v...)
	return append(out, raw[len(raw)/2:]...)
}

// serveReceiver serves f on a loopback gRPC server and returns its address.
func serveReceiver(t *testing.T, f *fakeReceiver) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(kvtransfer.GRPCServerOptions()...)
	kvtransfer.Register(g, f, engine.BF16) // the tiny preset's kv
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

// testWorker is a prefill Server on a loopback gRPC server.
type testWorker struct {
	s      *Server
	client pdservev1.PrefillServiceClient
	run    func() // starts the scheduler
	addr   string // the gRPC server's
}

func newWorker(t *testing.T, o Options, start bool) *testWorker {
	t.Helper()
	return newWorkerOn(t, newEngine(t), o, start)
}

// newWorkerOn is newWorker on engine eng.
func newWorkerOn(t *testing.T, eng engine.Engine, o Options, start bool) *testWorker {
	t.Helper()
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	t.Cleanup(func() { _ = d.Close() }) // after the Server stopped (Serve's cleanup runs first)
	s, err := New(eng, d, o, zaptest.NewLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	sv := workertest.Serve(t, workertest.Server{Register: s.Register, Run: s.Run, Stop: s.Stop}, start)
	return &testWorker{s: s, client: pdservev1.NewPrefillServiceClient(sv.Conn), run: sv.Start, addr: sv.Addr}
}

func smallOptions() Options {
	o := DefaultOptions()
	o.ChunkTokens = 8
	o.MaxBatchTokens = 32
	o.MaxLivePrefills = 8
	return o
}

// events is what one Prefill call streamed.
type events struct {
	queued *pdservev1.PrefillQueued
	first  *pdservev1.FirstToken
	done   *pdservev1.KVDone
}

// collect reads a Prefill stream to its end.
func collect(stream grpc.ServerStreamingClient[pdservev1.PrefillResponse]) (events, error) {
	var ev events
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return ev, nil
		}
		if err != nil {
			return ev, err
		}
		switch {
		case r.GetQueued() != nil:
			ev.queued = r.GetQueued()
		case r.GetFirstToken() != nil:
			ev.first = r.GetFirstToken()
		case r.GetKvDone() != nil:
			ev.done = r.GetKvDone()
		}
	}
}
