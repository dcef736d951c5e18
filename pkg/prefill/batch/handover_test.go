package batch

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/pdserve/pdserve/internal/workertest"
	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// TestAdoptedCacheCountsAgainstEngineMemory hands a batch five cached
// prompts of 96 tokens (another role's cache on the same engine of 320
// tokens): the batch keeps the three most recent, which fit, and frees
// the rest; a prompt sharing the most recent one's first five blocks
// forks them (token-exact first token) in a sequence numbered after the
// handed ones; at the stop, HandOver gets the cache's engine sequences,
// which the engine still holds, instead of their being freed.
//
// It fails without the eviction after the adoption (the engine holds 480
// tokens), or when the batch numbers its sequences from 1 again (the
// request's prefill lands in a handed sequence).
func TestAdoptedCacheCountsAgainstEngineMemory(t *testing.T) {
	eng := &meteredEngine{Engine: workertest.Engine(t), tokens: 320, seqs: 8, live: map[engine.SeqID]bool{}}
	cache, err := prefixcache.New(prefixcache.Options{MaxTokens: 1000, MaxEntries: 7, BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	// The old role's cache: seqs 1..5, each a 96-token prompt, 1 the most
	// recent.
	var h prefixcache.Handover
	h.BlockTokens = 16
	prompts := make([][]int32, 5)
	for i := range prompts {
		s := engine.SeqID(i + 1)
		prompts[i] = workertest.Prompt(96, int32(40+i))
		if _, err := eng.Engine.Prefill(context.Background(), []engine.PrefillItem{{Seq: s, Tokens: prompts[i], Last: true}}, nil); err != nil {
			t.Fatal(err)
		}
		eng.live[s] = true
		h.Entries = append(h.Entries, prefixcache.Handed{Seq: s, Hashes: cache.Hashes(0, prompts[i]), Tokens: 96})
	}
	b := New(Config{Engine: eng, Cache: cache, MaxBatchTokens: 64, ChunkTokens: 16, MemTokens: eng.tokens, MemSeqs: eng.seqs, Signals: batching.NewSignals()})
	p := policy{b}
	b.Post(Adopt(h))
	p.Plan()
	if tok, n := eng.held(); tok > eng.tokens || n != 3 {
		t.Fatalf("after the adoption the engine holds %d tokens in %d sequences, want at most %d in 3", tok, n, eng.tokens)
	}
	if st := cache.Stats(); st.Adopted != 5 || st.Entries != 3 || !eng.live[1] || !eng.live[3] || eng.live[4] {
		t.Errorf("cache after the adoption: %+v; engine holds %v, want the three most recent (1, 2, 3)", st, eng.live)
	}

	pr := sharing(prompts[0], 90, 80, 7)
	k := &sink{t: t, id: "r", prompt: len(pr), filled: make([]int, b.spec.Layers)}
	b.Post(Join(&Request{Key: 1, ID: k.id, Prompt: pr, Hashes: cache.Hashes(0, pr), Out: k}))
	for step(t, p, eng) {
		if eng.over != "" {
			t.Fatalf("engine overcommitted %s", eng.over)
		}
	}
	want, err := workertest.Engine(t).Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: pr, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if k.ends != 1 || k.end.Kind != Prefilled || k.end.Hits.Prefix != 80 || k.end.Token != want[0].Token {
		t.Errorf("request: %d ends, the last %v with %d prefix tokens, token %d (%v); want one Prefilled with 80 prefix tokens and token %d",
			k.ends, k.end.Kind, k.end.Hits.Prefix, k.end.Token, k.end.Err, want[0].Token)
	}

	to := make(chan prefixcache.Handover, 1)
	b.Post(HandOver(to))
	p.Shutdown()
	got := (<-to).Seqs()
	slices.Sort(got)
	held := slices.Sorted(maps.Keys(eng.live))
	if len(got) == 0 || !slices.Equal(got, held) || slices.ContainsFunc(got, func(s engine.SeqID) bool { return s > 3 && s <= 5 }) {
		t.Errorf("handed over %v, the engine holds %v: want the same, none of the freed 4 and 5", got, held)
	}
}
