package workerrun

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
	"google.golang.org/grpc/credentials/insecure"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/workertest"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCtx ends with the test, or after 60 s so a stuck stream fails.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startNATS runs an embedded NATS server for the test.
func startNATS(t testing.TB) string {
	t.Helper()
	s, url, err := control.StartEmbedded("127.0.0.1:-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return url
}

// newEngine and prompt are the workers' shared test engine and prompts.
var (
	newEngine = workertest.Engine
	prompt    = workertest.Prompt
)

// testOptions returns options for a worker of role on loopback ports.
func testOptions(role control.Role, natsURL string) Options {
	o := NewDecodeOptions()
	if role == control.RolePrefill {
		o = NewPrefillOptions()
	}
	o.Role = role
	o.GRPCAddr = "127.0.0.1:0"
	o.MetricsAddr = "127.0.0.1:0"
	o.NATSURL = natsURL
	o.HeartbeatInterval = 20 * time.Millisecond
	// The tests' workers are this process's, over plaintext: they may
	// pull from each other (TestPullsUnverified covers the rule).
	o.PeersInProcess = true
	o.DrainTimeout = 10 * time.Second
	o.KVConns = 1
	o.Engine.Threads = 1
	o.Prefill.ChunkTokens = 8
	o.Prefill.MaxBatchTokens = 32
	o.Decode.KVBlocks = 64
	o.Decode.MaxBatch = 8
	o.Decode.ChunkTokens = 8
	o.Decode.MaxBatchTokens = 32
	return o
}

// startWorker starts a worker and stops it when the test ends.
func startWorker(t testing.TB, o Options) *Worker {
	t.Helper()
	w, err := Start(testCtx(t), o, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			t.Errorf("stop %s: %v", w.ID(), err)
		}
	})
	return w
}

// dial returns a connection to a worker, closed when the test ends.
func dial(t testing.TB, w *Worker) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(w.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// reference generates greedily with the engine alone, EOS ignored.
func reference(t *testing.T, p []int32, maxTokens int) []int32 {
	t.Helper()
	return referenceOn(t, newEngine(t), p, maxTokens)
}

// referenceOn generates greedily on e alone, EOS ignored.
func referenceOn(t *testing.T, e engine.Engine, p []int32, maxTokens int) []int32 {
	t.Helper()
	ctx := context.Background()
	out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	toks := []int32{out[0].Token}
	for len(toks) < maxTokens {
		out, err := e.Decode(ctx, []engine.DecodeItem{{Seq: 1, Token: toks[len(toks)-1]}})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, out[0].Token)
	}
	return toks
}

// genResult is what a Generate stream delivered.
type genResult struct {
	tokens  []int32
	reason  string
	batches []int32 // batch_size of events with tokens
	stamps  map[pdservev1.StampKind]int64
}

// readGenerate reads a Generate stream until it ends, or until it delivered
// at least stopAfter tokens (0: to the end).
func readGenerate(stream grpc.ServerStreamingClient[pdservev1.GenerateResponse], stopAfter int) (genResult, error) {
	r := genResult{stamps: map[pdservev1.StampKind]int64{}}
	for stopAfter == 0 || len(r.tokens) < stopAfter {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return r, nil
		}
		if err != nil {
			return r, err
		}
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
	return r, nil
}

// readPrefill reads a Prefill stream to its end and returns its first
// token and KV-done events.
func readPrefill(stream grpc.ServerStreamingClient[pdservev1.PrefillResponse]) (*pdservev1.FirstToken, *pdservev1.KVDone, error) {
	var first *pdservev1.FirstToken
	var done *pdservev1.KVDone
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return first, done, nil
		}
		if err != nil {
			return first, done, err
		}
		if ev.GetFirstToken() != nil {
			first = ev.GetFirstToken()
		}
		if ev.GetKvDone() != nil {
			done = ev.GetKvDone()
		}
	}
}

// gatedEngine wraps an engine for failure tests: once gate is armed, the
// prefill calls after the first prefillFree ones, the decode steps after the
// first decodeFree ones and the KV imports after the first importFree ones
// wait until the gate opens or their step is cancelled (imports ignore
// cancellation: they wait for the gate). It
// counts the sequences alive in the engine. Embedding the interface hides
// the engine's Stepper, so steps go through Prefill and Decode.
type gatedEngine struct {
	engine.Engine

	mu          sync.Mutex
	prefillFree int // prefill calls let through before the gate applies; -1: no gate
	decodeFree  int // decode calls let through before the gate applies; -1: no gate
	importFree  int // ImportKV calls let through; -1: no gate
	prefills    int
	decodes     int
	imports     int
	gate        chan struct{}
	openOnce    sync.Once
	live        map[engine.SeqID]bool
}

func newGated(e engine.Engine, decodeFree, importFree int) *gatedEngine {
	return &gatedEngine{Engine: e, prefillFree: -1, decodeFree: decodeFree, importFree: importFree, gate: make(chan struct{}), live: map[engine.SeqID]bool{}}
}

// open opens the gate; it may be called more than once.
func (g *gatedEngine) open() { g.openOnce.Do(func() { close(g.gate) }) }

func (g *gatedEngine) counts() (decodes, imports, live int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.decodes, g.imports, len(g.live)
}

func (g *gatedEngine) Prefill(ctx context.Context, batch []engine.PrefillItem, onKV engine.KVFunc) ([]engine.Output, error) {
	g.mu.Lock()
	g.prefills++
	wait := g.prefillFree >= 0 && g.prefills > g.prefillFree
	g.mu.Unlock()
	if wait {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out, err := g.Engine.Prefill(ctx, batch, onKV)
	g.mu.Lock()
	for _, it := range batch {
		if _, lerr := g.Engine.Len(it.Seq); lerr == nil {
			g.live[it.Seq] = true
		}
	}
	g.mu.Unlock()
	return out, err
}

func (g *gatedEngine) Decode(ctx context.Context, batch []engine.DecodeItem) ([]engine.Output, error) {
	g.mu.Lock()
	g.decodes++
	wait := g.decodeFree >= 0 && g.decodes > g.decodeFree
	g.mu.Unlock()
	if wait {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Engine.Decode(ctx, batch)
}

func (g *gatedEngine) ImportKV(seq engine.SeqID, layer, start int, data []byte) error {
	g.mu.Lock()
	g.imports++
	wait := g.importFree >= 0 && g.imports > g.importFree
	g.live[seq] = true
	g.mu.Unlock()
	if wait {
		<-g.gate
	}
	return g.Engine.ImportKV(seq, layer, start, data)
}

func (g *gatedEngine) Free(seq engine.SeqID) {
	g.mu.Lock()
	delete(g.live, seq)
	g.mu.Unlock()
	g.Engine.Free(seq)
}

// forkingGated is a gatedEngine that forks sequences when its engine
// does (engine.Forker), counting the forks among the live sequences.
type forkingGated struct{ *gatedEngine }

func (f forkingGated) Fork(src, dst engine.SeqID, n int) error {
	fk, ok := f.Engine.(engine.Forker)
	if !ok {
		return errors.New("the engine does not fork")
	}
	if err := fk.Fork(src, dst, n); err != nil {
		return err
	}
	f.mu.Lock()
	f.live[dst] = true
	f.mu.Unlock()
	return nil
}
