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

// depth returns how many leading hashes the index holds.
func (c *chains[E]) depth(hashes []kv.Hash) int {
	n := 0
	for _, x := range hashes {
		if len(c.byHash[x]) == 0 {
			break
		}
		n++
	}
	return n
}

// newest returns the latest entry holding x, which the index holds, and
// makes it the most recently used.
func (c *chains[E]) newest(x kv.Hash) E {
	es := c.byHash[x]
	e := es[len(es)-1]
	c.lru.MoveToFront(*e.chainElem())
	return e
}

// held reports whether the index holds all of hashes (not empty), making
// the newest entry holding the last one the most recently used if so.
func (c *chains[E]) held(hashes []kv.Hash) bool {
	if c.depth(hashes) != len(hashes) {
		return false
	}
	c.newest(hashes[len(hashes)-1])
	return true
}

// insert adds e as the most recent entry and drops the entries whose
// blocks are a prefix of e's; it returns those.
func (c *chains[E]) insert(e E) (superseded []E) {
	hashes := e.chainHashes()
	for i := range c.depth(hashes) {
		for _, o := range c.byHash[hashes[i]] {
			if len(o.chainHashes()) == i+1 {
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
