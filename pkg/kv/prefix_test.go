package kv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// cachePrompt allocates blocks for the full blocks of tokens (beyond those
// Lookup found), inserts them and returns every block the caller holds.
func cachePrompt(t *testing.T, c *PrefixCache, tokens []int32) ([]Hash, []BlockID) {
	t.Helper()
	hs := HashBlocks(0, tokens, c.BlockTokens())
	hit := c.Lookup(hs)
	fresh, err := c.Allocate(len(hs) - len(hit))
	if err != nil {
		t.Fatalf("Allocate(%d): %v", len(hs)-len(hit), err)
	}
	ids := append(hit, fresh...)
	if _, err := c.Insert(hs, ids); err != nil {
		t.Fatalf("Insert: %v", err)
	}
	return hs, ids
}

func TestPrefixCacheLookupLongestPrefix(t *testing.T) {
	p := newTestPool(t, 16, 4)
	c := NewPrefixCache(p)
	a := seqTokens(18) // 4 full blocks
	ha, ida := cachePrompt(t, c, a)
	if got := c.Len(); got != 4 {
		t.Fatalf("Len() = %d, want 4", got)
	}

	b := append(append([]int32{}, a[:8]...), 1, 2, 3, 4, 5, 6, 7, 8) // shares 2 blocks
	hb := HashBlocks(0, b, 4)
	if got := c.Match(hb); got != 2 {
		t.Errorf("Match = %d, want 2", got)
	}
	hit := c.Lookup(hb)
	if diff := cmp.Diff(ida[:2], hit); diff != "" {
		t.Errorf("Lookup of a sequence sharing 2 blocks (-want +got):\n%s", diff)
	}
	for i, id := range ida {
		want := 2 // the caller's and the cache's
		if i < 2 {
			want = 3 // and the second caller's
		}
		if got := p.refCount(id); got != want {
			t.Errorf("block %d: %d refs, want %d", i, got, want)
		}
	}
	if got := c.Lookup(HashBlocks(0, []int32{9, 9, 9, 9}, 4)); got != nil {
		t.Errorf("Lookup of an uncached prefix = %v, want nil", got)
	}
	if got := c.Lookup(append([]Hash{12345}, ha...)); got != nil {
		t.Errorf("Lookup whose first block is uncached = %v, want nil", got)
	}

	// Everyone lets go: the blocks stay cached, evictable, not free.
	if err := p.Release(append(hit, ida...)); err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, p, 12)
	if got := c.Evictable(); got != 4 {
		t.Errorf("Evictable() = %d, want 4", got)
	}
	if got := c.Evict(100); got != 4 {
		t.Errorf("Evict(100) = %d, want 4", got)
	}
	checkAccounting(t, p, 16)
	if got := c.Len(); got != 0 {
		t.Errorf("Len() after evicting all = %d", got)
	}
}

func TestPrefixCacheInsertKeepsExistingBlock(t *testing.T) {
	p := newTestPool(t, 8, 4)
	c := NewPrefixCache(p)
	hs := HashBlocks(0, seqTokens(8), 4)
	first, _ := p.Allocate(2)
	if n, err := c.Insert(hs, first); err != nil || n != 2 {
		t.Fatalf("Insert = %d, %v; want 2, nil", n, err)
	}
	// A second computation of the same prefix: its blocks are not adopted.
	second, _ := p.Allocate(2)
	if n, err := c.Insert(hs, second); err != nil || n != 0 {
		t.Fatalf("Insert of cached hashes = %d, %v; want 0, nil", n, err)
	}
	for _, id := range second {
		if got := p.refCount(id); got != 1 {
			t.Errorf("block %d of the duplicate computation holds %d refs, want 1", id, got)
		}
	}
	if diff := cmp.Diff(first, c.Lookup(hs)); diff != "" {
		t.Errorf("Lookup after duplicate insert (-want +got):\n%s", diff)
	}

	// Bad inserts add nothing.
	if _, err := c.Insert(hs, first[:1]); err == nil {
		t.Error("Insert with fewer blocks than hashes succeeded")
	}
	other := HashBlocks(7, seqTokens(8), 4)
	if _, err := c.Insert(other, []BlockID{first[0], 7}); !errors.Is(err, ErrDoubleFree) {
		t.Errorf("Insert of a free block = %v, want ErrDoubleFree", err)
	}
	if got := c.Len(); got != 2 {
		t.Errorf("Len() after failed inserts = %d, want 2", got)
	}
}

func TestPrefixCacheEvictsLRUUnreferenced(t *testing.T) {
	p := newTestPool(t, 8, 2)
	c := NewPrefixCache(p)
	hA, idA := cachePrompt(t, c, []int32{1, 1, 2, 2}) // 2 blocks
	_, idB := cachePrompt(t, c, []int32{3, 3, 4, 4})  // 2 blocks
	hC, idC := cachePrompt(t, c, []int32{5, 5})       // 1 block, kept referenced
	if err := p.Release(append(idA, idB...)); err != nil {
		t.Fatal(err)
	}
	c.Lookup(hA) // A is now more recent than B
	if err := p.Release(idA); err != nil {
		t.Fatal(err)
	}
	// Most recent first: A's root, A's tail, C, then B.
	if got := c.Hashes(1); len(got) != 1 || got[0] != hA[0] {
		t.Errorf("Hashes(1) = %v, want A's first block %v", got, hA[0])
	}
	if got := len(c.Hashes(-1)); got != 5 {
		t.Errorf("len(Hashes(-1)) = %d, want 5", got)
	}

	// Evicting two removes B, the least recently used, tail first.
	if got := c.Evict(1); got != 1 {
		t.Fatalf("Evict(1) = %d", got)
	}
	if got := c.Match(HashBlocks(0, []int32{3, 3, 4, 4}, 2)); got != 1 {
		t.Errorf("after evicting one block B matches %d blocks, want 1 (tail evicted first)", got)
	}
	c.Evict(1)
	if got := c.Match(HashBlocks(0, []int32{3, 3, 4, 4}, 2)); got != 0 {
		t.Errorf("B still matches %d blocks", got)
	}
	// C is referenced by its caller: never evicted.
	if got := c.Evict(10); got != 2 {
		t.Errorf("Evict(10) = %d, want 2 (A only)", got)
	}
	if got := c.Match(hC); got != 1 {
		t.Errorf("referenced entry C was evicted")
	}
	if err := p.Release(idC); err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, p, 7)
}

func TestPrefixCacheAllocateEvicts(t *testing.T) {
	p := newTestPool(t, 4, 2)
	c := NewPrefixCache(p)
	_, ids := cachePrompt(t, c, []int32{1, 1, 2, 2, 3, 3}) // 3 cached blocks
	if err := p.Release(ids[2:]); err != nil {             // only the tail is unreferenced
		t.Fatal(err)
	}
	got, err := c.Allocate(2) // 1 free + 1 evictable
	if err != nil {
		t.Fatalf("Allocate(2) with 1 free and 1 evictable: %v", err)
	}
	checkAccounting(t, p, 0)
	if _, err := c.Allocate(1); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("Allocate(1) with nothing evictable = %v, want ErrPoolExhausted", err)
	}
	if err := p.Release(got); err != nil {
		t.Fatal(err)
	}
	// Asking for more than free+evictable evicts nothing.
	if _, err := c.Allocate(3); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("Allocate(3) = %v, want ErrPoolExhausted", err)
	}
	if got := c.Len(); got != 2 {
		t.Errorf("Len() = %d after a failed allocation, want 2", got)
	}
}

func TestPrefixCacheForgetsBlocksFreedBehindItsBack(t *testing.T) {
	p := newTestPool(t, 4, 2)
	c := NewPrefixCache(p)
	hs, ids := cachePrompt(t, c, []int32{1, 1})
	// A buggy caller drops both its own and the cache's reference.
	if err := p.Release(append(ids, ids...)); err != nil {
		t.Fatal(err)
	}
	if got := c.Lookup(hs); got != nil {
		t.Errorf("Lookup of a freed block = %v, want a miss", got)
	}
	if got := c.Len(); got != 0 {
		t.Errorf("stale entry kept: Len() = %d", got)
	}
	checkAccounting(t, p, 4)
}

func TestPrefixCacheConcurrent(t *testing.T) {
	const workers, rounds = 6, 150
	p := newTestPool(t, 48, 2)
	c := NewPrefixCache(p)
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 2))
			for range rounds {
				// A few shared system prompts, then a private suffix.
				tokens := []int32{int32(r.IntN(3)), 0, int32(r.IntN(2)), 0}
				for range r.IntN(8) {
					tokens = append(tokens, int32(r.IntN(1000)))
				}
				hs := HashBlocks(0, tokens, 2)
				hit := c.Lookup(hs)
				fresh, err := c.Allocate(len(hs) - len(hit))
				if errors.Is(err, ErrPoolExhausted) {
					if err := c.Release(hit); err != nil {
						errc <- err
						return
					}
					continue
				}
				if err != nil {
					errc <- err
					return
				}
				ids := append(hit, fresh...)
				if _, err := c.Insert(hs, ids); err != nil {
					errc <- fmt.Errorf("insert: %w", err)
					return
				}
				_ = c.Hashes(4)
				_ = c.Evictable()
				if err := c.Release(ids); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	// Nobody holds anything: every cached block is evictable, and evicting
	// them all empties the pool.
	if got, want := c.Evictable(), c.Len(); got != want {
		t.Errorf("Evictable() = %d, Len() = %d; want equal", got, want)
	}
	c.Evict(c.Len())
	checkAccounting(t, p, 48)
}
