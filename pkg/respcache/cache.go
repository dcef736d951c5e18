package respcache

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Key identifies a response: a digest of everything that determines it.
type Key [32]byte

// Options bound a Cache.
type Options struct {
	// Entries is the most entries held (> 0).
	Entries int
	// MaxBytes is the most bytes held, the sum of the sizes given to Put
	// (≥ 0; 0: no byte bound). A value larger than MaxBytes is not stored.
	MaxBytes int64
	// TTL is how long an entry lives after its Put (> 0).
	TTL time.Duration
}

// Stats is a Cache's occupancy and cumulative removals.
type Stats struct {
	Entries int   // entries held now (expired ones not yet removed included)
	Bytes   int64 // sum of their sizes
	// Evictions counts entries removed to make room (entries or bytes
	// bound), Expirations those removed because their TTL had passed.
	Evictions, Expirations uint64
}

// ErrInvalid is wrapped by New's errors.
var ErrInvalid = errors.New("respcache: invalid options")

// node is one entry, on two intrusive lists: the LRU list (most recent at
// the head) and the insertion list (oldest put at the head), whose order
// is that of expiry since every entry has the same TTL.
type node[V any] struct {
	key                Key
	val                V
	size               int64
	expires            time.Time
	lruPrev, lruNext   *node[V]
	fifoPrev, fifoNext *node[V]
}

// Cache is an LRU of values by Key with a TTL. Safe for concurrent use.
type Cache[V any] struct {
	o Options

	mu    sync.Mutex
	m     map[Key]*node[V]
	lru   list[V] // guarded by mu, as everything below
	fifo  list[V]
	bytes int64
	evict uint64
	exp   uint64
}

// New returns an empty Cache. Errors wrap ErrInvalid: Entries ≤ 0,
// MaxBytes < 0, TTL ≤ 0.
func New[V any](o Options) (*Cache[V], error) {
	if o.Entries <= 0 || o.MaxBytes < 0 || o.TTL <= 0 {
		return nil, fmt.Errorf("%w: entries %d (> 0), max bytes %d (≥ 0), ttl %v (> 0)", ErrInvalid, o.Entries, o.MaxBytes, o.TTL)
	}
	return &Cache[V]{o: o, m: make(map[Key]*node[V]), lru: list[V]{lru: true}}, nil
}

// Get returns the value of k and true when it is held and not expired at
// now, making it the most recently used; otherwise the zero V and false.
// Entries expired at now are removed first.
func (c *Cache[V]) Get(now time.Time, k Key) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(now)
	n, ok := c.m[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.lru.remove(n)
	c.lru.pushFront(n)
	return n.val, true
}

// Put stores v under k at now, with size bytes (≥ 0), replacing what k
// held; it expires at now + TTL. Least recently used entries go until
// the bounds hold. A value of more than MaxBytes is not stored (and k's
// old value is dropped). The cache keeps v: the caller must not change it
// after.
func (c *Cache[V]) Put(now time.Time, k Key, v V, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(now)
	if old, ok := c.m[k]; ok {
		c.drop(old)
	}
	if c.o.MaxBytes > 0 && size > c.o.MaxBytes {
		return
	}
	n := &node[V]{key: k, val: v, size: size, expires: now.Add(c.o.TTL)}
	c.m[k] = n
	c.lru.pushFront(n)
	c.fifo.pushBack(n)
	c.bytes += size
	for len(c.m) > c.o.Entries || c.o.MaxBytes > 0 && c.bytes > c.o.MaxBytes {
		c.drop(c.lru.tail)
		c.evict++
	}
}

// Stats returns the occupancy and the removals so far.
func (c *Cache[V]) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Entries: len(c.m), Bytes: c.bytes, Evictions: c.evict, Expirations: c.exp}
}

// expire removes the entries expired at now, oldest first. Puts are in
// the order of the clock, so the insertion list is in expiry order; a
// clock that went back only delays removals. Called with mu held.
func (c *Cache[V]) expire(now time.Time) {
	for n := c.fifo.head; n != nil && !now.Before(n.expires); n = c.fifo.head {
		c.drop(n)
		c.exp++
	}
}

// drop removes n from the map and both lists. Called with mu held.
func (c *Cache[V]) drop(n *node[V]) {
	delete(c.m, n.key)
	c.lru.remove(n)
	c.fifo.remove(n)
	c.bytes -= n.size
}

// list is an intrusive doubly linked list over one pair of node links.
type list[V any] struct {
	lru        bool // the LRU links, else the insertion links
	head, tail *node[V]
}

func (l *list[V]) links(n *node[V]) (prev, next **node[V]) {
	if l.lru {
		return &n.lruPrev, &n.lruNext
	}
	return &n.fifoPrev, &n.fifoNext
}

func (l *list[V]) pushFront(n *node[V]) {
	prev, next := l.links(n)
	*prev, *next = nil, l.head
	if l.head != nil {
		hp, _ := l.links(l.head)
		*hp = n
	} else {
		l.tail = n
	}
	l.head = n
}

func (l *list[V]) pushBack(n *node[V]) {
	prev, next := l.links(n)
	*prev, *next = l.tail, nil
	if l.tail != nil {
		_, tn := l.links(l.tail)
		*tn = n
	} else {
		l.head = n
	}
	l.tail = n
}

func (l *list[V]) remove(n *node[V]) {
	prev, next := l.links(n)
	if *prev != nil {
		_, pn := l.links(*prev)
		*pn = *next
	} else if l.head == n {
		l.head = *next
	}
	if *next != nil {
		np, _ := l.links(*next)
		*np = *prev
	} else if l.tail == n {
		l.tail = *prev
	}
	*prev, *next = nil, nil
}
