package batch

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/runner"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// boundedEngine is the ref engine that records the most KV tokens and
// sequences it held at once, after every call that changes what it holds
// (a prefill, a decode, a fork, an import, from the batch or the prefix
// cache's tiers). It refuses nothing: the test asserts the bound.
type boundedEngine struct {
	e                *ref.Engine
	live             map[engine.SeqID]bool
	peakTok, peakSeq int
}

var (
	_ engine.Engine = (*boundedEngine)(nil)
	_ engine.Forker = (*boundedEngine)(nil)
)

func newBoundedEngine(t *testing.T) *boundedEngine {
	e, err := ref.New(ref.Options{Preset: "tiny", Seed: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return &boundedEngine{e: e, live: map[engine.SeqID]bool{}}
}

// held returns the KV tokens and sequences the engine holds now.
func (b *boundedEngine) held() (tokens, seqs int) {
	for s := range b.live {
		if n, err := b.e.Len(s); err == nil {
			tokens += n
		}
	}
	return tokens, len(b.live)
}

func (b *boundedEngine) note() {
	t, s := b.held()
	b.peakTok, b.peakSeq = max(b.peakTok, t), max(b.peakSeq, s)
}

// takePeak returns the peaks since the last call and resets them to what
// the engine holds now.
func (b *boundedEngine) takePeak() (tokens, seqs int) {
	tokens, seqs = b.peakTok, b.peakSeq
	b.peakTok, b.peakSeq = b.held()
	return max(tokens, b.peakTok), max(seqs, b.peakSeq)
}

func (b *boundedEngine) Spec() engine.ModelSpec          { return b.e.Spec() }
func (b *boundedEngine) Tokenizer() engine.Tokenizer     { return b.e.Tokenizer() }
func (b *boundedEngine) Len(s engine.SeqID) (int, error) { return b.e.Len(s) }
func (b *boundedEngine) ExportKV(s engine.SeqID, l, start, end int, dst []byte) ([]byte, error) {
	return b.e.ExportKV(s, l, start, end, dst)
}

func (b *boundedEngine) Prefill(ctx context.Context, items []engine.PrefillItem, onKV engine.KVFunc) ([]engine.Output, error) {
	for _, it := range items {
		b.live[it.Seq] = true
	}
	defer b.note()
	return b.e.Prefill(ctx, items, onKV)
}

func (b *boundedEngine) Decode(ctx context.Context, items []engine.DecodeItem) ([]engine.Output, error) {
	defer b.note()
	return b.e.Decode(ctx, items)
}

func (b *boundedEngine) ImportKV(s engine.SeqID, l, start int, data []byte) error {
	b.live[s] = true
	defer b.note()
	return b.e.ImportKV(s, l, start, data)
}

func (b *boundedEngine) Fork(src, dst engine.SeqID, n int) error {
	defer b.note()
	if err := b.e.Fork(src, dst, n); err != nil {
		return err
	}
	b.live[dst] = true
	return nil
}

func (b *boundedEngine) Free(s engine.SeqID) {
	delete(b.live, s)
	b.e.Free(s)
}

// nopOutbox takes every token.
type nopOutbox struct{}

func (nopOutbox) Stamp(vocab.Stamp, time.Time)                     {}
func (nopOutbox) PrefixHit(int, prefixcache.HostLoad, PeerLoad)    {}
func (nopOutbox) Token(int, int32, *engine.TokenLogprob, int) bool { return true }
func (nopOutbox) PromptLogprobs([]engine.TokenLogprob)             {}
func (nopOutbox) ChoiceDone(int, string)                           {}

// Engine memory of the property test: tokens and sequences.
const (
	memTokens = 240
	memSeqs   = 8
)

// TestEngineMemoryBound: random arrivals (local prompts sharing
// prefixes, so they fork from the prefix cache or load from its host
// tier; remote KV, some starting after a prefix pinned at arrival;
// n = 1 or 2), cancels and the service's reclaims of cache entries, run
// step by step against an engine of memTokens tokens and memSeqs
// sequences, with deterministic seeds: after every step boundary and
// every step, the most the engine held never exceeds its memory. At the
// end every request ended once and the engine holds nothing but the
// cache's entries, and nothing after the shutdown. Seed 1 runs again with
// priorities (one request in three interactive, Overtakes 2), which
// reorder the joins.
func TestEngineMemoryBound(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { checkMemoryBound(t, seed, 1000, false) })
	}
	t.Run("priorities-seed1", func(t *testing.T) { checkMemoryBound(t, 1, 500, true) })
}

func checkMemoryBound(t *testing.T, seed uint64, steps int, prios bool) {
	eng := newBoundedEngine(t)
	src := newBoundedEngine(t) // computes remote KV, as a prefill worker would
	spec := eng.Spec()
	cache, err := prefixcache.New(prefixcache.Options{MaxTokens: 96, MaxEntries: 4, BlockTokens: 8, HostBytes: 1 << 22})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	live := map[uint64]bool{}
	ended := map[uint64]int{}
	var b *Batch
	b = New(Config{
		Engine: eng, Cache: cache, EOG: map[int32]bool{},
		MaxBatch: 6, MaxBatchTokens: 32, ChunkTokens: 8, CacheMaxTokens: 96,
		TokenBytes: spec.KVTokenBytes(), MemTokens: memTokens, MemSeqs: memSeqs,
		Signals: batching.NewSignals(),
		Report: func(es []End, _ bool) {
			for _, e := range es {
				ended[e.Key]++
				delete(live, e.Key)
				if e.Kind == Failed {
					t.Errorf("request %s failed: %v", e.ID, e.Err)
				}
			}
		},
	})
	if prios {
		b.order.Overtakes = 2
	}
	p := policy{b}
	ctx := context.Background()
	prefixes := make([][]int32, 4)
	for i := range prefixes {
		prefixes[i] = make([]int32, 32)
		for j := range prefixes[i] {
			prefixes[i][j] = int32(rng.IntN(spec.Vocab))
		}
	}
	check := func(step int, where string) {
		t.Helper()
		tok, sq := eng.takePeak()
		if tok > memTokens || sq > memSeqs {
			t.Fatalf("step %d (%s): the engine held %d tokens in %d sequences, over its %d in %d (batch load %+v)", step, where, tok, sq, memTokens, memSeqs, b.Load())
		}
	}
	var key uint64
	arrive := func() {
		key++
		pr := slices.Clone(prefixes[rng.IntN(len(prefixes))][:8*(1+rng.IntN(4))])
		for range 1 + rng.IntN(16) {
			pr = append(pr, int32(rng.IntN(spec.Vocab)))
		}
		r := &Request{
			Key: key, ID: fmt.Sprint("r", key), Prompt: pr, MaxTokens: 1 + rng.IntN(8), N: 1 + rng.IntN(2),
			Top: -1, PromptTop: -1, IgnoreEOS: true, Hashes: cache.Hashes(0, pr), Out: nopOutbox{},
		}
		if prios && key%3 != 0 {
			r.Priority = vocab.PriorityBatch
		}
		live[key] = true
		if rng.IntN(3) > 0 {
			r.Local = true
			b.Post(Join(r))
			return
		}
		// Remote KV: the prefill worker skips the prefix pinned here at
		// arrival (a Reserve's pin), or sends it all.
		start := 0
		if rng.IntN(2) == 0 {
			r.Pin = cache.Acquire(r.Hashes, cache.MaxHitBlocks(len(pr)))
			start = r.Pin.Tokens
		}
		x := remoteKV(t, src, pr, start)
		if rng.IntN(2) == 0 {
			b.Post(Join(r))
			b.Post(Arrived(r.Key, x))
		} else {
			b.Post(Arrived(r.Key, x))
			b.Post(Join(r))
		}
	}
	for step := range steps {
		for range rng.IntN(3) {
			switch k := rng.IntN(10); {
			case k < 6:
				arrive()
			case k < 9 && len(live) > 0:
				keys := slices.Sorted(maps.Keys(live))
				b.Post(Cancel(keys[rng.IntN(len(keys))], context.Canceled, rng.IntN(2) == 0))
			default:
				// The service reclaims cache entries for a reservation.
				if x := cache.Reclaim(8 * (1 + rng.IntN(6))); len(x) > 0 {
					b.Post(Reclaimed(x))
				}
			}
		}
		rb := p.Plan()
		check(step, "plan")
		if rb.Size() == 0 {
			continue
		}
		res := runner.Result{Start: time.Now()}
		res.Prefill, res.Decode, res.Err = engine.RunStep(ctx, eng, rb.Prefill, rb.Decode, rb.OnKV)
		res.End = time.Now()
		p.Done(ctx, rb, res)
		check(step, "step")
	}
	for k := range live {
		b.Post(Cancel(k, context.Canceled, true))
	}
	for range 100 {
		rb := p.Plan()
		if rb.Size() == 0 {
			break
		}
		res := runner.Result{}
		res.Prefill, res.Decode, res.Err = engine.RunStep(ctx, eng, rb.Prefill, rb.Decode, rb.OnKV)
		p.Done(ctx, rb, res)
	}
	if len(live) != 0 {
		t.Errorf("%d requests never ended", len(live))
	}
	for k, n := range ended {
		if n != 1 {
			t.Errorf("request %d reported ended %d times", k, n)
		}
	}
	if uint64(len(ended)) != key {
		t.Errorf("%d of %d requests reported ended", len(ended), key)
	}
	if _, n := eng.held(); n != cache.Stats().Entries {
		t.Errorf("idle: the engine holds %d sequences, the prefix cache %d entries", n, cache.Stats().Entries)
	}
	p.Shutdown()
	if tok, n := eng.held(); n != 0 {
		t.Errorf("after the shutdown the engine holds %d tokens in %d sequences", tok, n)
	}
	t.Logf("seed %d: %d requests, %d cache stats %+v", seed, key, len(ended), cache.Stats())
}

// remoteKV is the KV of prompt's tokens [start, len) as a prefill worker
// sends it, one frame per layer, computed on src.
func remoteKV(t *testing.T, src *boundedEngine, prompt []int32, start int) *KV {
	t.Helper()
	const s engine.SeqID = 1
	if _, err := src.Prefill(context.Background(), []engine.PrefillItem{{Seq: s, Tokens: prompt, Last: true}}, nil); err != nil {
		t.Fatal(err)
	}
	defer src.Free(s)
	spec := src.Spec()
	x := &KV{Start: start, Tokens: len(prompt), Layers: make([][]byte, spec.Layers), Ends: make([][]int, spec.Layers)}
	for l := range spec.Layers {
		raw, err := src.ExportKV(s, l, start, len(prompt), nil)
		if err != nil {
			t.Fatal(err)
		}
		x.Layers[l], x.Ends[l] = raw, []int{len(prompt)}
	}
	return x
}
