package prefixcache

import (
	"slices"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
)

// TestChainMatch: a lookup matches the entry's chain block by block from
// the root, not the presence of each hash. One known block's hash sent six
// times, hashes out of order, or a later block's hash first match nothing
// beyond the true chain (issue 38: one hash sent six times returned a
// whole 6-block entry). Fails on presence matching.
func TestChainMatch(t *testing.T) {
	c := newCache(t, 1000, 10)
	p := toks(24, 0, 1) // 6 blocks of 4
	h := c.Hashes(0, p)
	c.Insert(1, h, len(p))
	for _, tc := range []struct {
		name   string
		lookup []kv.Hash
		want   int
	}{
		{"the chain", h, 6},
		{"its prefix", h[:3], 3},
		{"block 0 six times", []kv.Hash{h[0], h[0], h[0], h[0], h[0], h[0]}, 1},
		{"block 2 six times", slices.Repeat([]kv.Hash{h[2]}, 6), 0},
		{"reversed", []kv.Hash{h[5], h[4], h[3], h[2], h[1], h[0]}, 0},
		{"a gap", []kv.Hash{h[0], h[2], h[3], h[4], h[5]}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.Match(tc.lookup); got != tc.want {
				t.Errorf("Match = %d, want %d", got, tc.want)
			}
			hit := c.Acquire(tc.lookup, len(tc.lookup))
			defer c.Release(hit)
			if hit.Tokens != tc.want*4 {
				t.Errorf("Acquire hit %d tokens, want %d", hit.Tokens, tc.want*4)
			}
		})
	}
}

// TestChainMatchPicksTheMatchingEntry: of two entries holding a hash, the
// one whose chain matches is the hit, even when the other is newer.
func TestChainMatchPicksTheMatchingEntry(t *testing.T) {
	c := newCache(t, 1000, 10)
	a := c.Hashes(0, toks(12, 0, 1))
	c.Insert(1, a, 12)
	// A forged entry holding a's blocks in another order, newer.
	c.Insert(2, []kv.Hash{a[1], a[0], a[2]}, 12)
	hit := c.Acquire(a, 3)
	defer c.Release(hit)
	if hit.Tokens != 12 || hit.Seq != engine.SeqID(1) {
		t.Errorf("hit %d tokens of seq %d, want 12 of seq 1", hit.Tokens, hit.Seq)
	}
}

// TestHashesKeyedAndRooted: the cache hashes under its key from the
// request's root, so that a partition's prompt misses in another's.
func TestHashesKeyedAndRooted(t *testing.T) {
	key := kv.GenerateHashKey()
	c, err := New(Options{MaxTokens: 1000, MaxEntries: 10, BlockTokens: 4, HashKey: key})
	if err != nil {
		t.Fatal(err)
	}
	p := toks(12, 0, 1)
	rootA, rootB := key.Root("tenant-a"), key.Root("tenant-b")
	if slices.Equal(c.Hashes(rootA, p), kv.HashBlocks(rootA, p, 4)) {
		t.Error("a keyed cache hashes as the public chain")
	}
	c.Insert(1, c.Hashes(rootA, p), 12)
	if got := c.Match(c.Hashes(rootA, p)); got != 3 {
		t.Errorf("same partition: %d blocks, want 3", got)
	}
	if got := c.Match(c.Hashes(rootB, p)); got != 0 {
		t.Errorf("another partition's identical prompt: %d blocks, want 0", got)
	}
}
