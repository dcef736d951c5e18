package ref_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
)

func TestNewOptions(t *testing.T) {
	if diff := cmp.Diff([]string{"small", "tiny"}, ref.Presets()); diff != "" {
		t.Errorf("Presets() (-want +got):\n%s", diff)
	}
	for _, opts := range []ref.Options{{Preset: "huge"}, {Preset: ""}, {Preset: "tiny", Threads: -1}, {Preset: "tiny", MaxSeqLen: -5}} {
		if e, err := ref.New(opts); err == nil {
			e.Close()
			t.Errorf("New(%+v) succeeded, want an error", opts)
		}
	}
	e, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 100, Threads: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	spec, _ := ref.PresetSpec("tiny")
	spec.MaxSeqLen = 100
	if diff := cmp.Diff(spec, e.Spec()); diff != "" {
		t.Errorf("Spec() (-want +got):\n%s", diff)
	}
	if e.Threads() != 3 {
		t.Errorf("Threads() = %d, want 3", e.Threads())
	}
	if got, want := ref.Params(spec), 125504; got != want {
		t.Errorf("Params(tiny) = %d, want %d", got, want)
	}
}

// firstLogits returns the logits after a fixed prompt.
func firstLogits(t *testing.T, e engine.Engine) []float32 {
	t.Helper()
	outs, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: e.Tokenizer().Encode("seed check"), Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), outs[0].Logits...)
}

func TestSeedSelectsWeights(t *testing.T) {
	mk := func(seed uint64) engine.Engine {
		e, err := ref.New(ref.Options{Preset: "tiny", Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		return e
	}
	a, b, c := firstLogits(t, mk(1)), firstLogits(t, mk(1)), firstLogits(t, mk(2))
	if !cmp.Equal(a, b, bitwise) {
		t.Error("two engines with seed 1 give different logits")
	}
	if cmp.Equal(a, c, bitwise) {
		t.Error("seeds 1 and 2 give the same logits")
	}
	for i, v := range a {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 100 {
			t.Fatalf("logit %d = %g: activations out of range", i, v)
		}
	}
}

// TestGreedyNotDegenerate guards the synthetic weights' scaling: greedy
// continuations must vary with the prompt and not repeat one token.
func TestGreedyNotDegenerate(t *testing.T) {
	const steps = 32
	for _, preset := range equivalencePresets() {
		t.Run(preset, func(t *testing.T) {
			e := newEngine(t, preset, 0)
			reqs := lossyPrompts(e)[:4]
			tr := newTraces(reqs)
			prefillAll(t, e, reqs, tr)
			decodeAll(t, e, reqs, tr, steps-1)
			seen := map[string]bool{}
			for _, r := range reqs {
				toks := tr[r.seq].tokens
				distinct := map[int32]bool{}
				for _, id := range toks {
					distinct[id] = true
				}
				if len(distinct) < steps/4 {
					t.Errorf("seq %d: %d distinct tokens in %d greedy tokens %v", r.seq, len(distinct), steps, toks)
				}
				key := fmt.Sprint(toks)
				if seen[key] {
					t.Errorf("seq %d repeats another prompt's continuation %v", r.seq, toks)
				}
				seen[key] = true
			}
		})
	}
}

// TestDecodeAllocations checks the hot path: once KV and scratch have
// grown, a decode step allocates only the returned slice.
func TestDecodeAllocations(t *testing.T) {
	e := newTiny(t, 2)
	ctx := context.Background()
	items := make([]engine.DecodeItem, 4)
	for i := range items {
		outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: engine.SeqID(i), Tokens: e.Tokenizer().Encode("warm up the caches"), Last: true}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		items[i] = engine.DecodeItem{Seq: engine.SeqID(i), Token: outs[0].Token, Sampling: engine.Sampling{Temperature: 0.7, TopP: 0.9, Seed: uint64(i)}}
	}
	step := func() {
		outs, err := e.Decode(ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range outs {
			items[i].Token = o.Token
		}
	}
	step() // grows KV capacity past what the measured steps need
	if allocs := testing.AllocsPerRun(20, step); allocs > 1 {
		t.Errorf("Decode of 4 sequences: %v allocations per step, want ≤ 1", allocs)
	}
}

func TestCloseStopsWorkers(t *testing.T) {
	before := runtime.NumGoroutine()
	e, err := ref.New(ref.Options{Preset: "tiny", Threads: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: []int32{1, 2, 3}, Last: true}}, nil); err != nil {
		t.Fatal(err)
	}
	e.Close()
	e.Close() // idempotent
	_, err = e.Decode(context.Background(), []engine.DecodeItem{{Seq: 1, Token: 4}})
	if !errors.Is(err, ref.ErrClosed) {
		t.Errorf("Decode after Close: %v, want ErrClosed", err)
	}
	if n, err := e.Len(1); err != nil || n != 3 {
		t.Errorf("Len after Close = %d, %v; want 3, nil", n, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Close, %d before New", runtime.NumGoroutine(), before)
		}
		runtime.Gosched()
	}
}
