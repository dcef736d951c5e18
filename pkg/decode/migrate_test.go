package decode

import (
	"context"
	"errors"
	"github.com/pdserve/pdserve/pkg/wire"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// gate is a kvtransfer clock's sleep that blocks a paced pull (its KV
// all received) until the test opens it or the pull's context ends;
// entered says a pull is waiting.
type gate struct {
	entered chan struct{}
	open    chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 8), open: make(chan struct{})} }

func (g *gate) sleep(ctx context.Context, _ time.Duration) error {
	g.entered <- struct{}{}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// migrationTarget is a decode worker that pulls migrated sequences with
// a dialer of its own (gated by g when not nil).
func migrationTarget(t testing.TB, g *gate) *testWorker {
	t.Helper()
	return migrationTargetOn(t, newEngine(t), g)
}

// migrationTargetOn is migrationTarget on engine eng.
func migrationTargetOn(t testing.TB, eng engine.Engine, g *gate) *testWorker {
	t.Helper()
	opts := []kvtransfer.DialOption{kvtransfer.WithConnsPerAddr(1)}
	if g != nil {
		opts = append(opts, kvtransfer.WithLinkGbps(1e-3), kvtransfer.WithClock(time.Now, g.sleep))
	}
	d := kvtransfer.NewDialer(opts...)
	t.Cleanup(func() { _ = d.Close() }) // after the Server stopped
	return newWorkerOn(t, eng, smallOptions(), true, func(s *Server) { WithDialer(d)(s) })
}

// migRequest is the request the migration tests run: a local prefill of
// prompt(24), 30 tokens, with sampling s.
func migRequest(id string, s *pdservev1.Sampling) *pdservev1.GenerateRequest {
	return &pdservev1.GenerateRequest{RequestId: id, PromptTokens: prompt(24, 3), MaxTokens: 30, LocalPrefill: true, IgnoreEos: true, Sampling: s}
}

// pause makes the engine step number at that decodes wait until
// release is closed, saying so on paused.
type pause struct {
	at      int32
	n       atomic.Int32
	paused  chan struct{}
	release chan struct{}
}

func newPause(at int32) *pause {
	return &pause{at: at, paused: make(chan struct{}), release: make(chan struct{})}
}

func (p *pause) step(decodes bool) {
	if decodes && p.n.Add(1) == p.at {
		close(p.paused)
		<-p.release
	}
}

// pausingEngine is the ref engine with a pause (the batch runs every
// step through Step).
type pausingEngine struct {
	*ref.Engine
	*pause
}

func (e *pausingEngine) Step(ctx context.Context, prefill []engine.PrefillItem, decode []engine.DecodeItem, onKV engine.KVFunc) ([]engine.Output, []engine.Output, error) {
	e.pause.step(len(decode) > 0)
	return e.Engine.Step(ctx, prefill, decode, onKV)
}

// pausingLlama is the llama.cpp engine with a pause.
type pausingLlama struct {
	*llamacpp.Engine
	*pause
}

func (e *pausingLlama) Step(ctx context.Context, prefill []engine.PrefillItem, decode []engine.DecodeItem, onKV engine.KVFunc) ([]engine.Output, []engine.Output, error) {
	e.pause.step(len(decode) > 0)
	return e.Engine.Step(ctx, prefill, decode, onKV)
}

// migrationSource is a decode worker whose engine pauses at its decode
// step at (see startMigrated).
func migrationSource(t testing.TB, at int32, edit ...func(*Server)) (*testWorker, *pause) {
	t.Helper()
	p := newPause(at)
	return newWorkerOn(t, &pausingEngine{Engine: newEngine(t), pause: p}, smallOptions(), true, edit...), p
}

// migrateReleasing runs src's MigrateAll and, once src is draining,
// closes release (the engine's pause) so the step it waits in can end;
// it returns what MigrateAll returned.
func migrateReleasing(ctx context.Context, src *testWorker, release chan struct{}) (int, error) {
	type res struct {
		n   int
		err error
	}
	done := make(chan res, 1)
	go func() {
		n, err := src.s.MigrateAll(ctx)
		done <- res{n, err}
	}()
	for !src.s.Stats().Draining {
		runtime.Gosched()
	}
	close(release)
	r := <-done
	return r.n, r.err
}

// startMigrated runs req on src, migrates it (MigrateAll) while the
// engine waits in its decode step e.at (so it cannot finish before) and
// returns the tokens its stream carried, which ended with the migrated
// event and no finish.
func startMigrated(t testing.TB, src *testWorker, e *pause, req *pdservev1.GenerateRequest) []int32 {
	t.Helper()
	ctx := testCtx(t)
	stream, err := src.client.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	<-e.paused
	if n, err := migrateReleasing(ctx, src, e.release); err != nil || n != 1 {
		t.Fatalf("MigrateAll: %d moved, %v", n, err)
	}
	var toks []int32
	migrated := false
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("source stream: %v", err)
		}
		if migrated {
			t.Fatal("an event after the migrated one")
		}
		toks = append(toks, ev.GetTokens()...)
		if ev.GetFinishReason() != "" {
			t.Fatalf("the source finished the choice (%q)", ev.GetFinishReason())
		}
		migrated = ev.GetMigrated()
	}
	if !migrated {
		t.Fatal("the source stream ended without the migrated event")
	}
	if len(toks) != int(e.at)+1 {
		t.Fatalf("the source streamed %d tokens, want %d", len(toks), e.at+1)
	}
	return toks
}

// resume opens the target's Generate for req moved from src after toks.
func resume(ctx context.Context, t testing.TB, dst, src *testWorker, req *pdservev1.GenerateRequest, toks []int32) grpc.ServerStreamingClient[pdservev1.GenerateResponse] {
	t.Helper()
	r := proto.CloneOf(req)
	r.GeneratedTokens = slices.Clone(toks)
	r.MigrateFrom = &pdservev1.PeerPrefix{Addr: src.addr, Id: "src", Role: "decode"}
	r.MigrateCodec = "zstd"
	stream, err := dst.client.Generate(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

// holds returns the migrated sequences w holds.
func holds(w *testWorker) int {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return len(w.s.holds)
}

// migIdle checks that w holds no request, no migrated sequence and every
// KV block free.
func migIdle(t *testing.T, w *testWorker) {
	t.Helper()
	if err := w.s.WaitIdle(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if st := w.s.Stats(); st.KVBlocksFree != st.KVBlocksTotal || st.Requests != 0 {
		t.Errorf("idle worker: %d of %d blocks free, %d requests", st.KVBlocksFree, st.KVBlocksTotal, st.Requests)
	}
}

// TestMigrateTokenExact: a request moved after k tokens from one decode
// worker to another (MigrateAll on the source, Generate with
// migrate_from on the target, which pulls the KV of the prompt and the
// tokens but the last over kvtransfer, zstd) streams, source and target
// joined, the tokens of an unmigrated run: greedy, and seeded sampling
// with penalties. The target imported the KV (kv_done, no prefill), so
// it computed nothing again; the source holds nothing after the pull.
// It fails if the source kept the sequence, the stream lost or repeated
// a token, or the target recomputed the KV.
func TestMigrateTokenExact(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *pdservev1.Sampling
	}{
		{"greedy", nil},
		{"seeded", &pdservev1.Sampling{Temperature: 0.8, TopP: 0.9, Seed: 5, PresencePenalty: 0.5, FrequencyPenalty: 0.3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			ref := newWorker(t, smallOptions(), true)
			stream, err := ref.client.Generate(ctx, migRequest("w", tc.s))
			if err != nil {
				t.Fatal(err)
			}
			want, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}

			src, e := migrationSource(t, 5)
			dst := migrationTarget(t, nil)
			req := migRequest("m", tc.s)
			toks := startMigrated(t, src, e, req)
			got, err := collect(resume(ctx, t, dst, src, req, toks))
			if err != nil {
				t.Fatal(err)
			}
			if all := append(slices.Clone(toks), got.tokens...); !slices.Equal(all, want.tokens) || got.reason != "length" {
				t.Errorf("migrated after %d tokens (%s):\n got %v\nwant %v", len(toks), got.reason, all, want.tokens)
			}
			if _, ok := got.stamps[wire.StampKind(StampKVDone)]; !ok {
				t.Errorf("the target did not import pulled KV (stamps %v)", got.stamps)
			}
			if _, ok := got.stamps[wire.StampKind(StampPrefillStart)]; ok {
				t.Errorf("the target computed the sequence (stamps %v)", got.stamps)
			}
			migIdle(t, src)
			migIdle(t, dst)
		})
	}
}

// TestMigrateSourceGone: the source stops after the migration, before
// the target pulls (so the pull fails, as for a source dead mid-pull):
// the target computes the KV of the prompt and the tokens streamed, as a
// recovery, and goes on token-exact. It fails if a failed pull ended
// the request.
func TestMigrateSourceGone(t *testing.T) {
	ctx := testCtx(t)
	want := unmigrated(ctx, t, migRequest("w", nil))
	src, e := migrationSource(t, 3)
	dst := migrationTarget(t, nil)
	req := migRequest("m", nil)
	toks := startMigrated(t, src, e, req)
	src.s.Stop()
	// The stopping worker drops what it held.
	if err := src.s.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := collect(resume(ctx, t, dst, src, req, toks))
	if err != nil {
		t.Fatal(err)
	}
	if all := append(slices.Clone(toks), got.tokens...); !slices.Equal(all, want.tokens) {
		t.Errorf("after a failed pull:\n got %v\nwant %v", all, want.tokens)
	}
	if _, ok := got.stamps[wire.StampKind(StampPrefillStart)]; !ok {
		t.Errorf("the target did not compute the KV (stamps %v)", got.stamps)
	}
	migIdle(t, dst)
}

// TestMigrateTargetFaults: the target's call ends while its pull is
// under way (the client left, or the target's caller gave up on it:
// ctx cancelled), and a Cancel of the request lands while the pulled KV
// is on its way (it then arrives for a cancelled sequence and is
// dropped). Either target ends holding nothing; a later target still
// finishes the request token-exact. It fails if the target leaked the
// reservation or the pulled KV joined a cancelled request.
func TestMigrateTargetFaults(t *testing.T) {
	ctx := testCtx(t)
	want := unmigrated(ctx, t, migRequest("w", nil))
	src, e := migrationSource(t, 4)
	req := migRequest("m", nil)
	toks := startMigrated(t, src, e, req)

	// 1. The target's call is cancelled mid-pull.
	g := newGate()
	dst := migrationTarget(t, g)
	cctx, cancel := context.WithCancel(ctx)
	s1 := resume(cctx, t, dst, src, req, toks)
	<-g.entered
	cancel()
	if _, err := collect(s1); status.Code(err) != codes.Canceled {
		t.Errorf("cancelled target call: %v, want CANCELED", err)
	}
	migIdle(t, dst)

	// 2. The source sent the KV whole to the first target, so it holds
	// it no more; a Cancel then lands on a second target while its pull
	// waits, and the KV arrives for a cancelled sequence. Run the
	// migration again to have a held sequence.
	src2, e2 := migrationSource(t, 4)
	toks2 := startMigrated(t, src2, e2, req)
	g2 := newGate()
	dst2 := migrationTarget(t, g2)
	s2 := resume(ctx, t, dst2, src2, req, toks2)
	<-g2.entered
	if !dst2.s.CancelRequest("m") {
		t.Fatal("the target does not know the request")
	}
	close(g2.open)
	if _, err := collect(s2); status.Code(err) != codes.Canceled {
		t.Errorf("target call cancelled mid-pull: %v, want CANCELED", err)
	}
	migIdle(t, dst2)

	// A third target finishes the request (computing the KV: the source
	// sent it whole and dropped it).
	dst3 := migrationTarget(t, nil)
	got, err := collect(resume(ctx, t, dst3, src2, req, toks2))
	if err != nil {
		t.Fatal(err)
	}
	if all := append(slices.Clone(toks2), got.tokens...); !slices.Equal(all, want.tokens) {
		t.Errorf("after faults:\n got %v\nwant %v", all, want.tokens)
	}
	migIdle(t, dst3)
	migIdle(t, src)
	migIdle(t, src2)
}

// TestMigrateHoldEnds: a migrated sequence nobody pulls is dropped by a
// Cancel of its id and by its hold time, so WaitIdle returns. It fails
// if a hold outlived both.
func TestMigrateHoldEnds(t *testing.T) {
	var ft fakeTimers
	src, e := migrationSource(t, 2, ft.install)
	startMigrated(t, src, e, migRequest("a", nil))
	if holds(src) != 1 {
		t.Fatalf("holds %d after a migration, want 1", holds(src))
	}
	if !src.s.CancelRequest("a") || holds(src) != 0 {
		t.Errorf("a Cancel left %d holds", holds(src))
	}
	src.s.SetDraining(false)
	e.n.Store(0)
	e.paused, e.release = make(chan struct{}), make(chan struct{})
	startMigrated(t, src, e, migRequest("b", nil))
	ft.fire()
	migIdle(t, src)
}

// TestMigrateLlamaCpp is TestMigrateTokenExact on llama.cpp (a tiny
// random model; its per-sequence state is the KV that moves): greedy and
// seeded, a migrated stream equals the unmigrated one, the target
// imported the pulled KV.
func TestMigrateLlamaCpp(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	path := filepath.Join(t.TempDir(), "tiny-llama.gguf")
	if err := gguf.WriteRandom(path, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 1024, Type: gguf.F32, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	newLlama := func() *llamacpp.Engine {
		eng, err := llamacpp.New(llamacpp.Options{LibDir: lib, Model: path, CtxSize: 1024, MaxSeqs: 8, Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() })
		return eng
	}
	if err := newLlama().Transferable(); err != nil {
		t.Skipf("llama.cpp KV export unavailable: %v", err)
	}
	for _, tc := range []struct {
		name string
		s    *pdservev1.Sampling
	}{
		{"greedy", nil},
		{"seeded", &pdservev1.Sampling{Temperature: 0.8, TopP: 0.9, Seed: 5, PresencePenalty: 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			whole := newWorkerOn(t, newLlama(), smallOptions(), true)
			stream, err := whole.client.Generate(ctx, migRequest("w", tc.s))
			if err != nil {
				t.Fatal(err)
			}
			want, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}
			p := newPause(6)
			src := newWorkerOn(t, &pausingLlama{Engine: newLlama(), pause: p}, smallOptions(), true)
			dst := migrationTargetOn(t, newLlama(), nil)
			req := migRequest("m", tc.s)
			toks := startMigrated(t, src, p, req)
			got, err := collect(resume(ctx, t, dst, src, req, toks))
			if err != nil {
				t.Fatal(err)
			}
			if all := append(slices.Clone(toks), got.tokens...); !slices.Equal(all, want.tokens) {
				t.Errorf("migrated after %d tokens:\n got %v\nwant %v", len(toks), all, want.tokens)
			}
			if _, ok := got.stamps[wire.StampKind(StampKVDone)]; !ok {
				t.Errorf("the target did not import pulled KV (stamps %v)", got.stamps)
			}
			migIdle(t, src)
			migIdle(t, dst)
		})
	}
}

// prefillPause is the ref engine whose first step with prefill items
// waits until release is closed, saying so on paused.
type prefillPause struct {
	*ref.Engine
	once    atomic.Bool
	paused  chan struct{}
	release chan struct{}
}

func (e *prefillPause) Step(ctx context.Context, prefill []engine.PrefillItem, decode []engine.DecodeItem, onKV engine.KVFunc) ([]engine.Output, []engine.Output, error) {
	if len(prefill) > 0 && e.once.CompareAndSwap(false, true) {
		close(e.paused)
		<-e.release
	}
	return e.Engine.Step(ctx, prefill, decode, onKV)
}

// TestMigrateAllMovesWhatStartsLater: MigrateAll while a request is
// still prefilling here (its first chunk in the engine, 2 chunks left,
// no token yet) moves it out once it has its first token instead of
// letting it finish here: MigrateAll counts it, the source's stream ends
// with the migrated event after that token, and the target goes on
// token-exact. So a drain that migrates ends when the last request
// started, not when the longest finished. It fails when MigrateAll
// exports only what runs at the call (0 moved, the source finishes the
// request: finish reason "length").
func TestMigrateAllMovesWhatStartsLater(t *testing.T) {
	ctx := testCtx(t)
	want := unmigrated(ctx, t, migRequest("w", nil))

	e := &prefillPause{Engine: newEngine(t), paused: make(chan struct{}), release: make(chan struct{})}
	src := newWorkerOn(t, e, smallOptions(), true)
	dst := migrationTarget(t, nil)
	req := migRequest("m", nil)
	st, err := src.client.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	<-e.paused
	if n, err := migrateReleasing(ctx, src, e.release); err != nil || n != 1 {
		t.Errorf("MigrateAll: %d moved, %v; want the prefilling request moved", n, err)
	}
	got, err := collect(st)
	if err != nil {
		t.Fatal(err)
	}
	if got.reason != "" || len(got.tokens) == 0 || len(got.tokens) >= int(req.MaxTokens) {
		t.Fatalf("source stream: %d tokens, finish %q; want it moved after its first tokens", len(got.tokens), got.reason)
	}
	rest, err := collect(resume(ctx, t, dst, src, req, got.tokens))
	if err != nil {
		t.Fatal(err)
	}
	if all := append(slices.Clone(got.tokens), rest.tokens...); !slices.Equal(all, want.tokens) || rest.reason != "length" {
		t.Errorf("moved after %d tokens (%s):\n got %v\nwant %v", len(got.tokens), rest.reason, all, want.tokens)
	}
	migIdle(t, src)
	migIdle(t, dst)
}

// unmigrated returns req's run start to finish on a worker of its own:
// what a migrated run of it must equal.
func unmigrated(ctx context.Context, t *testing.T, req *pdservev1.GenerateRequest) result {
	t.Helper()
	stream, err := newWorker(t, smallOptions(), true).client.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	want, err := collect(stream)
	if err != nil {
		t.Fatal(err)
	}
	return want
}
