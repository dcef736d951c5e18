package kv

import (
	"container/list"
	"errors"
	"fmt"
	"sync"
)

// PrefixCache maps prefix hashes (HashBlocks) to the pool blocks holding
// their KV, so a new request can reuse the blocks of a prompt prefix already
// computed. Each cached entry holds one pool reference on its block; a block
// whose only reference is the cache's is unreferenced and may be evicted,
// least recently used first. Blocks handed out by Lookup carry a reference
// of the caller's, released with Pool.Release (or PrefixCache.Release).
//
// PrefixCache is safe for concurrent use. It takes the pool's lock while
// holding its own, never the reverse.
type PrefixCache struct {
	pool *Pool

	mu      sync.Mutex
	entries map[Hash]*list.Element // of *cacheEntry
	lru     list.List              // front = most recently used
}

type cacheEntry struct {
	hash  Hash
	block BlockID
}

// NewPrefixCache returns an empty cache over the blocks of pool.
func NewPrefixCache(pool *Pool) *PrefixCache {
	return &PrefixCache{pool: pool, entries: make(map[Hash]*list.Element)}
}

// Pool returns the pool the cache's blocks belong to.
func (c *PrefixCache) Pool() *Pool { return c.pool }

// BlockTokens returns the pool's tokens per block.
func (c *PrefixCache) BlockTokens() int { return c.pool.BlockTokens() }

// Lookup returns the blocks of the longest cached prefix of hashes: ids[i]
// holds the KV of the block hashed hashes[i], for i < len(ids). Every
// returned block gets one reference for the caller, who owns the slice and
// must release the references when done. The hit entries become the most
// recently used, earlier blocks of the chain more recent than later ones
// (so a chain is evicted from its tail).
func (c *PrefixCache) Lookup(hashes []Hash) []BlockID {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []BlockID
	for _, h := range hashes {
		el, ok := c.entries[h]
		if !ok {
			break
		}
		ids = append(ids, el.Value.(*cacheEntry).block)
	}
	if len(ids) == 0 {
		return nil
	}
	if err := c.pool.Retain(ids); err != nil {
		// Only a caller that released the cache's own reference gets here:
		// forget the entries whose blocks are free and report a miss.
		c.dropStaleLocked()
		return nil
	}
	for i := len(ids) - 1; i >= 0; i-- {
		c.lru.MoveToFront(c.entries[hashes[i]])
	}
	return ids
}

// Match returns how many leading hashes are cached, without taking
// references or changing the eviction order (for routing decisions).
func (c *PrefixCache) Match(hashes []Hash) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range hashes {
		if _, ok := c.entries[h]; !ok {
			break
		}
		n++
	}
	return n
}

// Insert caches ids[i] as the block of hashes[i]. Hashes already cached keep
// their existing block (and are marked used); the others take one new pool
// reference on their block, so the caller keeps its own. It returns how many
// entries were added. Errors: lengths differ; a block that is not allocated
// (ErrUnknownBlock, ErrDoubleFree): then nothing is added.
func (c *PrefixCache) Insert(hashes []Hash, ids []BlockID) (int, error) {
	if len(hashes) != len(ids) {
		return 0, fmt.Errorf("kv: prefix cache insert: %d hashes, %d blocks", len(hashes), len(ids))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var newIdx []int
	seen := make(map[Hash]bool, len(hashes))
	for i, h := range hashes {
		if _, ok := c.entries[h]; ok || seen[h] {
			continue
		}
		seen[h] = true
		newIdx = append(newIdx, i)
	}
	newIDs := make([]BlockID, len(newIdx))
	for j, i := range newIdx {
		newIDs[j] = ids[i]
	}
	if err := c.pool.Retain(newIDs); err != nil {
		return 0, fmt.Errorf("kv: prefix cache insert: %w", err)
	}
	// Later blocks of a chain first, so earlier ones end up more recent.
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if el, ok := c.entries[h]; ok {
			c.lru.MoveToFront(el)
			continue
		}
		c.entries[h] = c.lru.PushFront(&cacheEntry{hash: h, block: ids[i]})
	}
	return len(newIdx), nil
}

// Evict drops up to n unreferenced entries, least recently used first, and
// frees their blocks. It returns the number of blocks freed.
func (c *PrefixCache) Evict(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.evictLocked(n)
}

func (c *PrefixCache) evictLocked(n int) int {
	freed := 0
	for el := c.lru.Back(); el != nil && freed < n; {
		prev := el.Prev()
		e := el.Value.(*cacheEntry)
		if c.pool.releaseIfSole(e.block) {
			c.lru.Remove(el)
			delete(c.entries, e.hash)
			freed++
		}
		el = prev
	}
	return freed
}

// Allocate takes n blocks from the pool like Pool.Allocate, first evicting
// unreferenced entries when too few blocks are free. When even eviction
// cannot make room it evicts nothing and returns an error wrapping
// ErrPoolExhausted.
func (c *PrefixCache) Allocate(n int) ([]BlockID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids, err := c.pool.Allocate(n)
	if !errors.Is(err, ErrPoolExhausted) {
		return ids, err
	}
	free, evictable := c.pool.Free(), c.evictableLocked()
	if free+evictable < n {
		return nil, fmt.Errorf("kv: allocate %d blocks: %d free and %d evictable of %d: %w",
			n, free, evictable, c.pool.Total(), ErrPoolExhausted)
	}
	c.evictLocked(n - free)
	return c.pool.Allocate(n)
}

// Release drops one reference of each block, as Pool.Release.
func (c *PrefixCache) Release(ids []BlockID) error { return c.pool.Release(ids) }

// dropStaleLocked removes entries whose block holds no reference.
func (c *PrefixCache) dropStaleLocked() {
	for el := c.lru.Front(); el != nil; {
		next := el.Next()
		e := el.Value.(*cacheEntry)
		if c.pool.refCount(e.block) == 0 {
			c.lru.Remove(el)
			delete(c.entries, e.hash)
		}
		el = next
	}
}

// Len returns the number of cached entries.
func (c *PrefixCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Evictable returns the number of cached blocks that only the cache holds:
// blocks an allocation may reclaim. Free() + Evictable() is the capacity a
// worker can offer.
func (c *PrefixCache) Evictable() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.evictableLocked()
}

func (c *PrefixCache) evictableLocked() int {
	n := 0
	for el := c.lru.Front(); el != nil; el = el.Next() {
		if c.pool.refCount(el.Value.(*cacheEntry).block) == 1 {
			n++
		}
	}
	return n
}

// Hashes returns up to max cached hashes, most recently used first (all of
// them when max < 0): a digest of the cache for heartbeats. The caller owns
// the slice.
func (c *PrefixCache) Hashes(max int) []Hash {
	c.mu.Lock()
	defer c.mu.Unlock()
	if max < 0 || max > len(c.entries) {
		max = len(c.entries)
	}
	hs := make([]Hash, 0, max)
	for el := c.lru.Front(); el != nil && len(hs) < max; el = el.Next() {
		hs = append(hs, el.Value.(*cacheEntry).hash)
	}
	return hs
}
