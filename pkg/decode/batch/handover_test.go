package batch

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/runner"
)

// hitOutbox records a request's prefix hit and choice 0's tokens.
type hitOutbox struct {
	nopOutbox
	hit    int
	tokens []int32
}

func (o *hitOutbox) PrefixHit(n int, _ prefixcache.HostLoad, _ PeerLoad) { o.hit = n }
func (o *hitOutbox) Token(i int, t int32, _ *engine.TokenLogprob, _ int) bool {
	if i == 0 {
		o.tokens = append(o.tokens, t)
	}
	return true
}

// TestAdoptedCacheCountsAgainstEngineMemory hands a decode batch five
// cached prompts of 64 tokens (another role's cache on the same engine of
// memTokens tokens): the batch keeps the three most recent, which fit,
// frees the rest and reports the cache changed (the service charges its
// pool); a local prompt sharing the most recent one's first six blocks
// forks them and decodes token-exact, in sequences numbered after the
// handed ones, within the engine's memory; at the stop, HandOver gets
// the cache's engine sequences, which the engine still holds.
//
// It fails without the eviction after the adoption, or without the
// adopted entries in the batch's count of the cache's memory (either way
// the engine holds 320 tokens), or when the batch numbers its sequences
// from 1 again (the request prefills in sequence 1).
func TestAdoptedCacheCountsAgainstEngineMemory(t *testing.T) {
	eng := newBoundedEngine(t)
	spec := eng.Spec()
	cache, err := prefixcache.New(prefixcache.Options{MaxTokens: 400, MaxEntries: 6, BlockTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var h prefixcache.Handover
	h.BlockTokens = 8
	prompts := make([][]int32, 5)
	for i := range prompts {
		s := engine.SeqID(i + 1)
		prompts[i] = make([]int32, 64)
		for j := range prompts[i] {
			prompts[i][j] = int32((j*7 + i*31 + 3) % spec.Vocab)
		}
		if _, err := eng.e.Prefill(ctx, []engine.PrefillItem{{Seq: s, Tokens: prompts[i], Last: true}}, nil); err != nil {
			t.Fatal(err)
		}
		eng.live[s] = true
		h.Entries = append(h.Entries, prefixcache.Handed{Seq: s, Hashes: cache.Hashes(0, prompts[i]), Tokens: 64})
	}
	changed := false
	b := New(Config{
		Engine: eng, Cache: cache, EOG: map[int32]bool{},
		MaxBatch: 6, MaxBatchTokens: 32, ChunkTokens: 8, CacheMaxTokens: 400,
		TokenBytes: spec.KVTokenBytes(), MemTokens: memTokens, MemSeqs: memSeqs,
		Signals: batching.NewSignals(),
		Report:  func(_ []End, c bool) { changed = changed || c },
	})
	p := policy{b}
	b.Post(Adopt(h))
	p.Plan()
	if tok, n := eng.held(); tok > memTokens || n != 3 || !eng.live[1] || !eng.live[3] || eng.live[4] {
		t.Fatalf("after the adoption the engine holds %d tokens in %v, want at most %d in the three most recent (1, 2, 3)", tok, slices.Sorted(maps.Keys(eng.live)), memTokens)
	}
	if st := cache.Stats(); st.Adopted != 5 || st.Entries != 3 || !changed {
		t.Errorf("cache after the adoption: %+v, reported changed %v; want 5 adopted, 3 entries, changed", st, changed)
	}
	eng.takePeak()

	pr := append(slices.Clone(prompts[0][:48]), 5, 9, 2, 7, 1, 3, 8, 4, 6, 0)
	const maxTokens = 4
	out := &hitOutbox{}
	b.Post(Join(&Request{Key: 1, ID: "r", Prompt: pr, MaxTokens: maxTokens, N: 1, Top: -1, PromptTop: -1, IgnoreEOS: true, Local: true, Hashes: cache.Hashes(0, pr), Out: out}))
	for range 100 {
		rb := p.Plan()
		if rb.Size() == 0 {
			break
		}
		for _, it := range rb.Prefill {
			if it.Seq <= 5 {
				t.Fatalf("the request prefills in sequence %d, a handed one", it.Seq)
			}
		}
		res := runner.Result{Start: time.Now()}
		res.Prefill, res.Decode, res.Err = engine.RunStep(ctx, eng, rb.Prefill, rb.Decode, rb.OnKV)
		res.End = time.Now()
		p.Done(ctx, rb, res)
		if tok, sq := eng.takePeak(); tok > memTokens || sq > memSeqs {
			t.Fatalf("the engine held %d tokens in %d sequences, over its %d in %d", tok, sq, memTokens, memSeqs)
		}
	}
	alone := newBoundedEngine(t)
	want := generate(t, alone, pr, maxTokens)
	if out.hit != 48 {
		t.Errorf("prefix hit %d tokens, want 48 (the handed entry's first six blocks)", out.hit)
	}
	if diff := cmp.Diff(want, out.tokens); diff != "" {
		t.Errorf("tokens (-engine alone +batch):\n%s", diff)
	}

	to := make(chan prefixcache.Handover, 1)
	b.Post(HandOver(to))
	p.Shutdown()
	got := (<-to).Seqs()
	slices.Sort(got)
	if held := slices.Sorted(maps.Keys(eng.live)); len(got) == 0 || !slices.Equal(got, held) {
		t.Errorf("handed over %v, the engine holds %v: want the same", got, held)
	}
}

// generate decodes prompt greedily on e alone: maxTokens tokens.
func generate(t *testing.T, e *boundedEngine, prompt []int32, maxTokens int) []int32 {
	t.Helper()
	ctx := context.Background()
	out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: prompt, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	toks := []int32{out[0].Token}
	for len(toks) < maxTokens {
		o, err := e.Decode(ctx, []engine.DecodeItem{{Seq: 1, Token: toks[len(toks)-1]}})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, o[0].Token)
	}
	return toks
}
