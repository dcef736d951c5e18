package prefixcache

import (
	"container/list"
	"slices"

	"github.com/pdserve/pdserve/pkg/kv"
)

// chainEntry is an entry of a tier below the engine: the KV of one chain
// of blocks, its hashes, its size, and its place in the tier's LRU list.
type chainEntry interface {
	comparable
	chainHashes() []kv.Hash
	chainBytes() int64
	chainElem() **list.Element
}

// chains is the index the host and disk tiers share: their entries by each
// block hash of their chains, in LRU order, with their total size. Not
// safe for concurrent use: its tier's lock guards it. obs, when set, is
// told of every hash the index starts and stops holding, in order.
type chains[E chainEntry] struct {
	byHash map[kv.Hash][]E
	lru    list.List // of E; front = most recently used
	bytes  int64
	obs    Observer
}

// chainMatch returns how many leading hashes some entry holds as the
// leading blocks of its own chain, and the newest such entry (byHash
// lists the entries holding each hash in insertion order); 0 and the zero
// E when none. An entry matches only where its chain equals hashes block
// by block from the root: a hash held somewhere else in a chain, sent
// again, or sent out of order matches nothing beyond the true chain.
func chainMatch[E any](byHash map[kv.Hash][]E, chainOf func(E) []kv.Hash, hashes []kv.Hash) (int, E) {
	n := 0
	for _, x := range hashes {
		if len(byHash[x]) == 0 {
			break
		}
		n++
	}
	// Every hash of a true match of k blocks is held, so k ≤ n; the
	// newest entry holding hashes[k-1] at its place k-1 with the same
	// blocks before it is the match (the first one tried, normally).
	for k := n; k > 0; k-- {
		es := byHash[hashes[k-1]]
		for j := len(es) - 1; j >= 0; j-- {
			ch := chainOf(es[j])
			if len(ch) >= k && ch[k-1] == hashes[k-1] && slices.Equal(ch[:k], hashes[:k]) {
				return k, es[j]
			}
		}
	}
	var zero E
	return 0, zero
}

// depth returns how many leading hashes the index holds as a chain
// (chainMatch).
func (c *chains[E]) depth(hashes []kv.Hash) int {
	n, _ := chainMatch(c.byHash, E.chainHashes, hashes)
	return n
}

// newest returns the latest entry whose chain begins with prefix, which
// the index holds (depth(prefix) == len(prefix) > 0), and makes it the
// most recently used.
func (c *chains[E]) newest(prefix []kv.Hash) E {
	_, e := chainMatch(c.byHash, E.chainHashes, prefix)
	c.lru.MoveToFront(*e.chainElem())
	return e
}

// held reports whether the index holds all of hashes (not empty) as a
// chain, making the newest entry holding them the most recently used if
// so.
func (c *chains[E]) held(hashes []kv.Hash) bool {
	if c.depth(hashes) != len(hashes) {
		return false
	}
	c.newest(hashes)
	return true
}

// insert adds e as the most recent entry and drops the entries whose
// blocks are a prefix of e's; it returns those.
func (c *chains[E]) insert(e E) (superseded []E) {
	hashes := e.chainHashes()
	for i := range c.depth(hashes) {
		for _, o := range c.byHash[hashes[i]] {
			if len(o.chainHashes()) == i+1 && slices.Equal(o.chainHashes(), hashes[:i+1]) {
				superseded = append(superseded, o)
			}
		}
	}
	if c.byHash == nil {
		c.byHash = make(map[kv.Hash][]E)
	}
	*e.chainElem() = c.lru.PushFront(e)
	for _, x := range hashes {
		es := c.byHash[x]
		if len(es) == 0 && c.obs != nil {
			c.obs.Stored(x)
		}
		c.byHash[x] = append(es, e)
	}
	c.bytes += e.chainBytes()
	for _, o := range superseded {
		c.drop(o)
	}
	return superseded
}

// evict drops least recently used entries while the index holds more
// than budget bytes, and returns them.
func (c *chains[E]) evict(budget int64) (evicted []E) {
	for el := c.lru.Back(); el != nil && c.bytes > budget; {
		o := el.Value.(E)
		el = el.Prev()
		c.drop(o)
		evicted = append(evicted, o)
	}
	return evicted
}

// drop removes e, which the index holds.
func (c *chains[E]) drop(e E) {
	c.lru.Remove(*e.chainElem())
	for _, x := range e.chainHashes() {
		es := c.byHash[x]
		if i := slices.Index(es, e); i >= 0 {
			es = slices.Delete(es, i, i+1)
		}
		if len(es) == 0 {
			delete(c.byHash, x)
			if c.obs != nil {
				c.obs.Removed(x)
			}
		} else {
			c.byHash[x] = es
		}
	}
	c.bytes -= e.chainBytes()
}

// reset empties the index, telling obs of every hash it held, and returns
// the entries it held, most recent first.
func (c *chains[E]) reset() []E {
	var all []E
	for el := c.lru.Front(); el != nil; el = el.Next() {
		all = append(all, el.Value.(E))
	}
	if c.obs != nil {
		for x := range c.byHash {
			c.obs.Removed(x)
		}
	}
	clear(c.byHash)
	c.lru.Init()
	c.bytes = 0
	return all
}

// appendHashes appends every block hash the index holds to dst.
func (c *chains[E]) appendHashes(dst []uint64) []uint64 {
	dst = slices.Grow(dst, len(c.byHash))
	for x := range c.byHash {
		dst = append(dst, uint64(x))
	}
	return dst
}

// blocks returns how many distinct block hashes the index holds.
func (c *chains[E]) blocks() int { return len(c.byHash) }

// entries returns how many entries the index holds.
func (c *chains[E]) entries() int { return c.lru.Len() }

func (e *hostEntry) chainHashes() []kv.Hash    { return e.hashes }
func (e *hostEntry) chainBytes() int64         { return e.bytes }
func (e *hostEntry) chainElem() **list.Element { return &e.el }
func (e *diskEntry) chainHashes() []kv.Hash    { return e.hashes }
func (e *diskEntry) chainBytes() int64         { return e.bytes }
func (e *diskEntry) chainElem() **list.Element { return &e.el }
