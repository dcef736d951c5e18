package prefixcache

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
)

func newCache(t *testing.T, tokens, entries int) *Cache {
	t.Helper()
	c, err := New(Options{MaxTokens: tokens, MaxEntries: entries, BlockTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// toks returns n tokens: the first shared of them from seed 0, the rest from seed.
func toks(n, shared int, seed int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		s := seed
		if i < shared {
			s = 0
		}
		p[i] = s*1000 + int32(i)
	}
	return p
}

func TestOff(t *testing.T) {
	o := DefaultOptions()
	o.MaxTokens = 0
	c, err := New(o)
	if err != nil || c != nil {
		t.Fatalf("New(MaxTokens 0) = %v, %v; want a nil cache", c, err)
	}
	if h := c.Acquire(kv.HashBlocks(0, toks(32, 0, 1), 16), 10); h.Tokens != 0 {
		t.Errorf("nil cache hit %d", h.Tokens)
	}
	if got := c.Insert(7, []kv.Hash{1}, 16); !slices.Equal(got, []engine.SeqID{7}) {
		t.Errorf("nil cache Insert = %v, want the sequence back", got)
	}
	c.Release(Hit{})
	if c.Digest(10) != nil || c.Trim() != nil || c.Stats() != (Stats{}) {
		t.Error("nil cache holds something")
	}
}

func TestValidate(t *testing.T) {
	for _, o := range []Options{
		{MaxTokens: -2, MaxEntries: 1, BlockTokens: 4},
		{MaxTokens: 8, BlockTokens: 4}, {MaxTokens: Auto, BlockTokens: 4}, {MaxTokens: 8, MaxEntries: 1},
		DefaultOptions(), // Auto, unresolved
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// TestResolve sizes an Auto cache by the worker's engine memory and keeps
// a size or off as given.
func TestResolve(t *testing.T) {
	for _, tc := range []struct{ max, tokens, want int }{
		{Auto, 4096, 4096}, {Auto, 0, 0}, {Auto, -5, 0}, {0, 4096, 0}, {100, 4096, 100},
	} {
		o := DefaultOptions()
		o.MaxTokens = tc.max
		if got := o.Resolve(tc.tokens).MaxTokens; got != tc.want {
			t.Errorf("Options{MaxTokens: %d}.Resolve(%d).MaxTokens = %d, want %d", tc.max, tc.tokens, got, tc.want)
		}
	}
	if !DefaultOptions().Enabled() {
		t.Error("the default options turn the cache off")
	}
}

// TestShrink gives live sequences the memory and slots of the least
// recently used unpinned entries, never a pinned one.
func TestShrink(t *testing.T) {
	c := newCache(t, 1000, 10)
	for i := range 4 {
		p := toks(8, 0, int32(i+1))
		c.Insert(engine.SeqID(i+1), c.Hashes(0, p), len(p))
	}
	// Recency, oldest first: 1, 2, 3, 4. Pin 1.
	h := c.Acquire(c.Hashes(0, toks(8, 0, 1)), 2)
	if h.Tokens != 8 {
		t.Fatalf("Acquire hit %d tokens, want 8", h.Tokens)
	}
	if got := c.Shrink(9, 0); !slices.Equal(got, []engine.SeqID{2, 3}) {
		t.Errorf("Shrink(9 tokens) freed %v, want [2 3]", got)
	}
	if got := c.Shrink(0, 5); !slices.Equal(got, []engine.SeqID{4}) {
		t.Errorf("Shrink(5 entries) freed %v, want [4] (1 is pinned)", got)
	}
	c.Release(h)
	if got := c.Shrink(0, 1); !slices.Equal(got, []engine.SeqID{1}) {
		t.Errorf("Shrink after Release freed %v, want [1]", got)
	}
	if st := c.Stats(); st.Reclaims != 4 || st.Entries != 0 || st.Tokens != 0 {
		t.Errorf("stats %+v, want 4 reclaims and nothing held", st)
	}
}

// TestAcquirePartialChains looks up prompts sharing 0..all blocks of a
// cached one, block-aligned or not, with and without the cap.
func TestAcquirePartialChains(t *testing.T) {
	c := newCache(t, 1000, 10)
	base := toks(22, 22, 0) // 5 full blocks of 4 and 2 tokens
	if free := c.Insert(1, c.Hashes(0, base), len(base)); len(free) != 0 {
		t.Fatalf("Insert freed %v", free)
	}
	for _, tc := range []struct {
		name      string
		prompt    []int32
		maxBlocks int
		want      int
	}{
		{"none shared", toks(22, 0, 1), 99, 0},
		{"one token shared", toks(22, 1, 1), 99, 0},
		{"one block shared", toks(22, 4, 1), 99, 4},
		{"unaligned 10 shared", toks(22, 10, 1), 99, 8},
		{"all shared, longer", toks(40, 22, 1), 99, 20},
		{"same prompt, capped", base, c.MaxHitBlocks(len(base)), 20},
		{"aligned prompt capped below itself", base[:20], c.MaxHitBlocks(20), 16},
		{"cap 2", toks(40, 22, 1), 2, 8},
		{"cap 0", base, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := c.Acquire(c.Hashes(0, tc.prompt), tc.maxBlocks)
			defer c.Release(h)
			if h.Tokens != tc.want {
				t.Fatalf("hit %d tokens, want %d", h.Tokens, tc.want)
			}
			if h.Tokens > 0 && h.Seq != 1 {
				t.Errorf("hit seq %d, want 1", h.Seq)
			}
		})
	}
	st := c.Stats()
	if st.Lookups != 9 || st.Hits != 6 || st.HitTokens != 4+8+20+20+16+8 || st.Pinned != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestLRUBounds(t *testing.T) {
	tests := []struct {
		name           string
		tokens, entrys int
		inserts        []int32 // seeds of 8-token prompts, seq = seed
		touch          int32   // seed looked up after the inserts but the last (0: none)
		wantFreed      []engine.SeqID
		wantLeft       int
	}{
		{"entries bound evicts oldest", 1000, 2, []int32{1, 2, 3}, 0, []engine.SeqID{1}, 2},
		{"tokens bound evicts oldest", 16, 10, []int32{1, 2, 3}, 0, []engine.SeqID{1}, 2},
		{"a touch saves the oldest", 16, 10, []int32{1, 2, 3}, 1, []engine.SeqID{2}, 2},
		{"one too big is refused", 4, 10, []int32{1}, 0, []engine.SeqID{1}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newCache(t, tc.tokens, tc.entrys)
			var freed []engine.SeqID
			for i, s := range tc.inserts {
				if i == len(tc.inserts)-1 && tc.touch != 0 {
					c.Release(c.Acquire(c.Hashes(0, toks(8, 0, tc.touch)), 9))
				}
				freed = append(freed, c.Insert(engine.SeqID(s), c.Hashes(0, toks(8, 0, s)), 8)...)
			}
			if diff := cmp.Diff(tc.wantFreed, freed); diff != "" {
				t.Errorf("freed (-want +got):\n%s", diff)
			}
			if st := c.Stats(); st.Entries != tc.wantLeft || st.Tokens != 8*tc.wantLeft {
				t.Errorf("left %+v, want %d entries", st, tc.wantLeft)
			}
		})
	}
}

// TestPinnedNeverEvicted fills the cache past its bounds while an entry
// is pinned: every other entry goes, the pinned one stays until released.
func TestPinnedNeverEvicted(t *testing.T) {
	c := newCache(t, 16, 2)
	c.Insert(1, c.Hashes(0, toks(8, 8, 0)), 8)
	h := c.Acquire(c.Hashes(0, toks(12, 8, 9)), 9)
	if h.Seq != 1 || h.Tokens != 8 {
		t.Fatalf("hit %+v", h)
	}
	var freed []engine.SeqID
	for s := int32(2); s < 6; s++ {
		freed = append(freed, c.Insert(engine.SeqID(s), c.Hashes(0, toks(8, 0, s)), 8)...)
	}
	if slices.Contains(freed, 1) {
		t.Fatalf("pinned entry freed: %v", freed)
	}
	if got := c.Match(c.Hashes(0, toks(8, 8, 0))); got != 2 {
		t.Fatalf("pinned entry matched %d blocks", got)
	}
	c.Release(h)
	freed = c.Insert(6, c.Hashes(0, toks(8, 0, 6)), 8)
	if !slices.Contains(freed, 1) {
		t.Errorf("released entry kept past the bounds: freed %v", freed)
	}
}

func TestSupersedeAndDuplicate(t *testing.T) {
	c := newCache(t, 1000, 10)
	short := toks(8, 8, 0)
	long := toks(16, 8, 1)
	c.Insert(1, c.Hashes(0, short), 8)
	if got := c.Insert(2, c.Hashes(0, short), 9); !slices.Equal(got, []engine.SeqID{2}) {
		t.Errorf("duplicate Insert freed %v, want the new sequence", got)
	}
	if got := c.Insert(3, c.Hashes(0, long), 16); !slices.Equal(got, []engine.SeqID{1}) {
		t.Errorf("longer Insert freed %v, want the superseded entry", got)
	}
	// A branch sharing the first blocks keeps the other branch.
	if got := c.Insert(4, c.Hashes(0, toks(16, 8, 2)), 16); len(got) != 0 {
		t.Errorf("branch Insert freed %v", got)
	}
	if h := c.Acquire(c.Hashes(0, short), 9); h.Tokens != 8 {
		t.Errorf("shared prefix hit %d", h.Tokens)
	} else {
		c.Release(h)
	}
	if st := c.Stats(); st.Entries != 2 || st.Superseded != 1 {
		t.Errorf("stats %+v", st)
	}
	for _, s := range c.Drain() {
		if s != 3 && s != 4 {
			t.Errorf("Drain freed %d", s)
		}
	}
	if st := c.Stats(); st.Entries != 0 || st.Tokens != 0 {
		t.Errorf("after Drain %+v", st)
	}
}

// TestDigest checks the order, dedup and bound, and measures the size of
// the digest a heartbeat carries (JSON, as control.Heartbeat is encoded).
func TestDigest(t *testing.T) {
	c := newCache(t, 1<<20, 1000)
	a, b := toks(12, 4, 1), toks(12, 4, 2)
	c.Insert(1, c.Hashes(0, a), 12)
	c.Insert(2, c.Hashes(0, b), 12) // most recent
	ha, hb := c.Hashes(0, a), c.Hashes(0, b)
	want := []uint64{uint64(hb[0]), uint64(hb[1]), uint64(hb[2]), uint64(ha[1]), uint64(ha[2])}
	if diff := cmp.Diff(want, c.Digest(10)); diff != "" {
		t.Errorf("digest (-want +got):\n%s", diff)
	}
	if got := c.Digest(2); len(got) != 2 || got[0] != uint64(hb[0]) {
		t.Errorf("Digest(2) = %v", got)
	}

	// Size of a full default digest.
	big := newCache(t, 1<<30, 1<<20)
	for s := range int32(DefaultDigestHashes / 64) {
		p := toks(64*16, 0, s+10)
		big.Insert(engine.SeqID(s+10), kv.HashBlocks(0, p, 4), len(p))
	}
	d := big.Digest(DefaultDigestHashes)
	if len(d) != DefaultDigestHashes {
		t.Fatalf("digest of %d hashes", len(d))
	}
	js, _ := json.Marshal(struct {
		PrefixDigest []uint64 `json:"prefix_digest"`
	}{d})
	t.Logf("digest of %d hashes: %d bytes of JSON in a heartbeat (%.1f per hash)", len(d), len(js), float64(len(js))/float64(len(d)))
	if len(js) > 21*DefaultDigestHashes+32 {
		t.Errorf("digest of %d bytes exceeds its bound", len(js))
	}
}

func BenchmarkDigest(b *testing.B) {
	c, _ := New(Options{MaxTokens: 1 << 30, MaxEntries: 1 << 20, BlockTokens: 16})
	for s := range int32(64) {
		p := toks(64*16, 0, s+1)
		c.Insert(engine.SeqID(s+1), c.Hashes(0, p), len(p))
	}
	b.ReportAllocs()
	for b.Loop() {
		js, _ := json.Marshal(c.Digest(DefaultDigestHashes))
		b.ReportMetric(float64(len(js)), "bytes/digest")
	}
}

// TestReclaim: Reclaim drops unpinned entries least recently used first
// until enough tokens are freed, never a pinned one, and Reclaimable
// follows the pins.
func TestReclaim(t *testing.T) {
	c := newCache(t, 1000, 10)
	var hashes [][]kv.Hash
	for i := range 4 {
		h := kv.HashBlocks(0, toks(8, 0, int32(i+1)), 4) // 2 blocks, 8 tokens each
		if free := c.Insert(engine.SeqID(i+1), h, 8); len(free) != 0 {
			t.Fatalf("insert %d freed %v", i, free)
		}
		hashes = append(hashes, h)
	}
	pin := c.Acquire(hashes[0], 2) // the oldest becomes the most recent, pinned
	if pin.Tokens != 8 {
		t.Fatalf("hit %d tokens, want 8", pin.Tokens)
	}
	if st := c.Stats(); st.Reclaimable != 24 || st.Tokens != 32 {
		t.Errorf("stats %+v: want 24 of 32 tokens reclaimable", st)
	}
	if got := c.Reclaim(9); !slices.Equal(got, []engine.SeqID{2, 3}) {
		t.Errorf("Reclaim(9) = %v, want the two least recently used unpinned entries 2, 3", got)
	}
	if got := c.Reclaim(100); !slices.Equal(got, []engine.SeqID{4}) {
		t.Errorf("Reclaim(100) = %v, want only the last unpinned entry 4", got)
	}
	if st := c.Stats(); st.Reclaims != 3 || st.Evictions != 0 || st.Entries != 1 || st.Reclaimable != 0 {
		t.Errorf("stats %+v: want 3 reclaims, the pinned entry left, nothing reclaimable", st)
	}
	c.Release(pin)
	if st := c.Stats(); st.Reclaimable != 8 {
		t.Errorf("after Release: %d tokens reclaimable, want 8", st.Reclaimable)
	}
	if got := c.Reclaim(0); got != nil {
		t.Errorf("Reclaim(0) = %v, want nothing", got)
	}
}
