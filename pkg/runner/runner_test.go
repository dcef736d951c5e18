package runner

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/workertest"
	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
)

// script is a Policy that plans the batches it is given, one per step,
// and records what the Runner hands back. Its fields are guarded by mu
// (the test reads them while the loop runs).
type script struct {
	mu       sync.Mutex
	plans    []Batch[string]
	results  []Result
	owners   [][]string
	shutdown int
	done     chan struct{} // closed once every plan was handed back
}

func (p *script) Plan() Batch[string] {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.plans) == 0 {
		return Batch[string]{}
	}
	b := p.plans[0]
	p.plans = p.plans[1:]
	return b
}

func (p *script) Done(_ context.Context, b Batch[string], r Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.results = append(p.results, r)
	p.owners = append(p.owners, append(append([]string(nil), b.PrefillOf...), b.DecodeOf...))
	if len(p.plans) == 0 && p.done != nil {
		close(p.done)
		p.done = nil
	}
}

func (p *script) Shutdown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.shutdown++
}

// TestRunnerSteps: the Runner runs each planned batch on the engine (a
// prompt chunk, then a chunk beside a decode token of the first
// sequence), hands back one output per item with the step's stamps,
// records each step (Observe, Steps), runs Beside while the loop runs,
// and at Stop ends the loop, calls Shutdown once and waits for Beside; a
// second Run fails.
func TestRunnerSteps(t *testing.T) {
	eng := workertest.Engine(t)
	p := workertest.Prompt(8, 1)
	pol := &script{done: make(chan struct{}), plans: []Batch[string]{
		{Prefill: []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, PrefillOf: []string{"a"}},
		{
			Prefill: []engine.PrefillItem{{Seq: 2, Tokens: p[:4], Last: true}}, PrefillOf: []string{"b"},
			Decode: []engine.DecodeItem{{Seq: 1, Token: 3}}, DecodeOf: []string{"a"},
		},
	}}
	stopped, stop := context.WithCancel(context.Background())
	defer stop()
	var observed []int
	besideEnded := make(chan struct{})
	tick := time.Unix(100, 0)
	r := New(eng, Policy[string](pol), batching.NewSignals(), Options{
		Role:    "x",
		Stopped: stopped,
		Observe: func(d time.Duration, n int) {
			if d != time.Second {
				t.Errorf("step observed as %v, want 1s (the fake clock's tick)", d)
			}
			observed = append(observed, n)
		},
		Beside: func(ctx context.Context) { <-ctx.Done(); close(besideEnded) },
		Now:    func() time.Time { tick = tick.Add(time.Second); return tick },
	})
	done := pol.done
	ran := make(chan error, 1)
	go func() { ran <- r.Run(context.Background()) }()
	<-done
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	select {
	case <-besideEnded:
	default:
		t.Error("Run returned before Beside did")
	}
	if pol.shutdown != 1 {
		t.Errorf("Shutdown called %d times, want 1", pol.shutdown)
	}
	if len(pol.results) != 2 {
		t.Fatalf("%d steps handed back, want 2", len(pol.results))
	}
	for i, want := range []struct {
		prefill, decode int
		owners          string
	}{{1, 0, "a"}, {1, 1, "b,a"}} {
		res := pol.results[i]
		if res.Err != nil || len(res.Prefill) != want.prefill || len(res.Decode) != want.decode {
			t.Errorf("step %d: %d+%d outputs, %v; want %d+%d", i, len(res.Prefill), len(res.Decode), res.Err, want.prefill, want.decode)
		}
		if got := strings.Join(pol.owners[i], ","); got != want.owners {
			t.Errorf("step %d: owners %q, want %q", i, got, want.owners)
		}
		if res.End.Sub(res.Start) != time.Second {
			t.Errorf("step %d: stamps %v..%v, want a second apart", i, res.Start, res.End)
		}
	}
	if n, err := eng.Len(1); err != nil || n != 9 {
		t.Errorf("sequence 1 holds %d tokens (%v), want 9: its prompt and the decoded token", n, err)
	}
	times, last := r.Steps()
	if len(times) != 2 || times[0] != 1000 || last != 2 {
		t.Errorf("Steps() = %v, last %d; want two steps of 1000 ms, the last of 2 items", times, last)
	}
	if len(observed) != 2 || observed[0] != 1 || observed[1] != 2 {
		t.Errorf("observed step sizes %v, want [1 2]", observed)
	}
	if err := r.Run(context.Background()); err == nil || err.Error() != "x: Run called twice" {
		t.Errorf("second Run: %v, want x: Run called twice", err)
	}
}

// TestRunnerStepErrors: a prefill-only Runner refuses a batch with decode
// items, without calling the engine; an engine error reaches Done, and
// the loop goes on.
func TestRunnerStepErrors(t *testing.T) {
	eng := workertest.Engine(t)
	pol := &script{done: make(chan struct{}), plans: []Batch[string]{
		{Decode: []engine.DecodeItem{{Seq: 1, Token: 3}}, DecodeOf: []string{"a"}},
		{Prefill: []engine.PrefillItem{{Seq: 1, Tokens: []int32{1, 2}, Last: true}}, PrefillOf: []string{"a"},
			OnKV: func(engine.KVChunk) error { return context.DeadlineExceeded }},
		{Prefill: []engine.PrefillItem{{Seq: 2, Tokens: []int32{1, 2}, Last: true}}, PrefillOf: []string{"b"}},
	}}
	ctx, cancel := context.WithCancel(context.Background())
	r := New(eng, Policy[string](pol), batching.NewSignals(), Options{Role: "x", PrefillOnly: true})
	done := pol.done
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	<-done
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(pol.results) != 3 {
		t.Fatalf("%d steps handed back, want 3", len(pol.results))
	}
	if err := pol.results[0].Err; err == nil || !strings.Contains(err.Error(), "x: 1 decode items in a prefill-only step") {
		t.Errorf("decode items in a prefill-only step: %v", err)
	}
	if err := pol.results[1].Err; err == nil {
		t.Error("a failing KV callback did not fail the step")
	}
	if res := pol.results[2]; res.Err != nil || len(res.Prefill) != 1 {
		t.Errorf("step after the failures: %d outputs, %v; want 1", len(res.Prefill), res.Err)
	}
	if _, err := eng.Len(1); err == nil {
		t.Error("sequence 1 exists after its failed step")
	}
}

// gate is a Policy that plans one single-token decode of sequence 1 per
// step, forever, and counts the steps handed back.
type gate struct {
	mu    sync.Mutex
	steps int
	step  chan struct{} // receives after each step
}

func (g *gate) Plan() Batch[string] {
	return Batch[string]{Decode: []engine.DecodeItem{{Seq: 1, Token: 3}}, DecodeOf: []string{"a"}}
}

func (g *gate) Done(context.Context, Batch[string], Result) {
	g.mu.Lock()
	g.steps++
	g.mu.Unlock()
	select {
	case g.step <- struct{}{}:
	default:
	}
}

func (g *gate) Shutdown() {}

// TestRunnerLockEngine: while a caller holds the engine lock, the loop
// starts no step, and the caller may use the engine; the loop goes on
// once the lock is given back.
func TestRunnerLockEngine(t *testing.T) {
	eng := workertest.Engine(t)
	if _, err := eng.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: []int32{1, 2}, Last: true}}, nil); err != nil {
		t.Fatal(err)
	}
	g := &gate{step: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	r := New(eng, Policy[string](g), batching.NewSignals(), Options{Role: "x"})
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	<-g.step
	r.LockEngine()
	g.mu.Lock()
	held := g.steps
	g.mu.Unlock()
	// Under the lock the loop is between steps (a step's Done is the last
	// thing it does under the lock), so none may come now, and this
	// caller may use the engine (a step beside it would race, which -race
	// reports).
	_, err := eng.Prefill(context.Background(), []engine.PrefillItem{{Seq: 2, Tokens: workertest.Prompt(64, 2), Last: true}}, nil)
	eng.Free(2)
	n, _ := eng.Len(1)
	g.mu.Lock()
	after := g.steps
	g.mu.Unlock()
	r.UnlockEngine()
	if err != nil || after != held {
		t.Errorf("under the engine lock: %d steps then %d (len %d, %v); want none", held, after, n, err)
	}
	<-g.step // the loop goes on
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
