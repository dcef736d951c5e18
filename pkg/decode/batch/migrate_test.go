package batch

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/runner"
)

// tokOutbox records choice 0's tokens.
type tokOutbox struct {
	nopOutbox
	toks []int32
}

func (o *tokOutbox) Token(i int, t int32, _ *engine.TokenLogprob, _ int) bool {
	if i == 0 {
		o.toks = append(o.toks, t)
	}
	return true
}

// stepper drives a Batch step by step on its own engine, as its loop
// would, and records its ends.
type stepper struct {
	t    *testing.T
	eng  *boundedEngine
	b    *Batch
	ends []End
}

func newStepper(t *testing.T) *stepper {
	s := &stepper{t: t, eng: newBoundedEngine(t)}
	cache, err := prefixcache.New(prefixcache.Options{MaxTokens: 256, MaxEntries: 4, BlockTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	s.b = New(Config{
		Engine: s.eng, Cache: cache, EOG: map[int32]bool{},
		MaxBatch: 4, MaxBatchTokens: 64, ChunkTokens: 16, CacheMaxTokens: 256,
		TokenBytes: s.eng.Spec().KVTokenBytes(), Signals: batching.NewSignals(),
		Report: func(es []End, _ bool) { s.ends = append(s.ends, es...) },
	})
	return s
}

// step runs one step boundary and, when it has items, one step.
func (s *stepper) step() {
	s.t.Helper()
	p := policy{s.b}
	rb := p.Plan()
	if rb.Size() == 0 {
		return
	}
	res := runner.Result{Start: time.Now()}
	res.Prefill, res.Decode, res.Err = engine.RunStep(context.Background(), s.eng, rb.Prefill, rb.Decode, rb.OnKV)
	res.End = time.Now()
	p.Done(context.Background(), rb, res)
}

// run steps until key ended (at most 200 steps) and returns its End.
func (s *stepper) run(key uint64) End {
	s.t.Helper()
	for range 200 {
		for _, e := range s.ends {
			if e.Key == key {
				return e
			}
		}
		s.step()
	}
	s.t.Fatalf("request %d never ended", key)
	return End{}
}

// engineIdle checks that the engine holds nothing but the prefix cache's
// entries.
func (s *stepper) engineIdle() {
	s.t.Helper()
	if _, n := s.eng.held(); n != len(s.b.cached) {
		s.t.Errorf("the engine holds %d sequences, the prefix cache %d", n, len(s.b.cached))
	}
}

func migrationPrompt() []int32 {
	p := make([]int32, 21)
	for i := range p {
		p[i] = int32(7 + 13*i%200)
	}
	return p
}

// TestMigrationTokenExact: a request runs k tokens on one batch, is
// exported (Export) and joins a second batch on another engine with the
// snapshot (its KV covering the prompt and every token but the last); the
// tokens of both, joined, equal an unmigrated run's, for greedy decoding
// and for seeded sampling with penalties, whose draws depend only on the
// seed and the position and whose counts the snapshot's tokens rebuild.
// Nothing is left in either engine but cache entries. It fails if the
// snapshot's KV missed a token, the target recomputed (or skipped) a
// token of it, the penalties were not rebuilt, or the source kept the
// sequence.
func TestMigrationTokenExact(t *testing.T) {
	cases := []struct {
		name string
		s    engine.Sampling
	}{
		{"greedy", engine.Sampling{}},
		{"seeded", engine.Sampling{Temperature: 0.9, TopP: 0.95, Seed: 11, Penalties: &engine.Penalties{Presence: 0.8, Frequency: 0.5}}},
	}
	const maxTokens = 24
	for _, tc := range cases {
		for _, k := range []int{1, 2, 9} {
			t.Run(tc.name, func(t *testing.T) {
				req := func(key uint64, out Outbox) *Request {
					return &Request{Key: key, ID: "r", Local: true, Prompt: migrationPrompt(), Sampling: tc.s,
						MaxTokens: maxTokens, IgnoreEOS: true, N: 1, Top: -1, PromptTop: -1, Out: out}
				}
				whole := newStepper(t)
				want := &tokOutbox{}
				whole.b.Post(Join(req(1, want)))
				if e := whole.run(1); e.Kind != Finished || len(want.toks) != maxTokens {
					t.Fatalf("unmigrated run: %+v, %d tokens", e, len(want.toks))
				}

				src, dst := newStepper(t), newStepper(t)
				a := &tokOutbox{}
				src.b.Post(Join(req(1, a)))
				for len(a.toks) < k {
					src.step()
				}
				reply := make(chan Exported, 1)
				src.b.Post(Export(1, reply))
				src.step()
				x := <-reply
				if x.Err != nil {
					t.Fatal(x.Err)
				}
				if e := src.run(1); e.Kind != Migrated {
					t.Fatalf("source ended the request %+v, want Migrated", e)
				}
				if !slices.Equal(x.Snap.Tokens, a.toks) || x.Snap.KV.Tokens != len(x.Snap.Prompt)+k-1 {
					t.Fatalf("snapshot tokens %v (KV %d tokens), streamed %v", x.Snap.Tokens, x.Snap.KV.Tokens, a.toks)
				}
				src.engineIdle()

				b := &tokOutbox{}
				r := req(2, b)
				r.Local, r.Generated, r.KV = false, x.Snap.Tokens, x.Snap.KV
				dst.b.Post(Join(r))
				if e := dst.run(2); e.Kind != Finished {
					t.Fatalf("target: %+v", e)
				}
				if got := append(slices.Clone(a.toks), b.toks...); !slices.Equal(got, want.toks) {
					t.Errorf("migrated after %d tokens:\n got %v\nwant %v", k, got, want.toks)
				}
				dst.engineIdle()
			})
		}
	}
}

// TestMigrationRefused: Export of what cannot move now answers why and
// leaves the request running; a snapshot whose KV holds more than the
// prompt and the tokens but the last fails its import.
func TestMigrationRefused(t *testing.T) {
	s := newStepper(t)
	ask := func(key uint64) error {
		reply := make(chan Exported, 1)
		s.b.Post(Export(key, reply))
		s.step()
		return (<-reply).Err
	}
	if err := ask(9); !errors.Is(err, ErrNotRunning) {
		t.Errorf("unknown request: %v, want ErrNotRunning", err)
	}
	two := &tokOutbox{}
	s.b.Post(Join(&Request{Key: 1, ID: "n2", Local: true, Prompt: migrationPrompt(), MaxTokens: 8, IgnoreEOS: true, N: 2, Top: -1, PromptTop: -1, Out: two}))
	for len(two.toks) < 2 {
		s.step()
	}
	if err := ask(1); !errors.Is(err, ErrNotMigratable) {
		t.Errorf("two choices: %v, want ErrNotMigratable", err)
	}
	if e := s.run(1); e.Kind != Finished {
		t.Errorf("the refused request ended %+v, want Finished", e)
	}

	// A KV one token too long for its generated tokens.
	src := newStepper(t)
	a := &tokOutbox{}
	src.b.Post(Join(&Request{Key: 1, ID: "r", Local: true, Prompt: migrationPrompt(), MaxTokens: 8, IgnoreEOS: true, N: 1, Top: -1, PromptTop: -1, Out: a}))
	for len(a.toks) < 3 {
		src.step()
	}
	reply := make(chan Exported, 1)
	src.b.Post(Export(1, reply))
	src.step()
	x := <-reply
	if x.Err != nil {
		t.Fatal(x.Err)
	}
	s.b.Post(Join(&Request{Key: 2, ID: "r", Prompt: migrationPrompt(), MaxTokens: 8, IgnoreEOS: true, N: 1, Top: -1, PromptTop: -1,
		Generated: x.Snap.Tokens[:2], KV: x.Snap.KV, Out: &tokOutbox{}}))
	if e := s.run(2); e.Kind != Failed {
		t.Errorf("a KV past the generated tokens: %+v, want Failed", e)
	}
	s.engineIdle()
}
