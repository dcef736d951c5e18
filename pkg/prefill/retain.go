package prefill

import (
	"container/list"
	"time"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

// retained is one request's KV held by a retainStore.
type retained struct {
	id       string
	kv       *kvBuf
	first    int32                   // first token; valid when complete
	firstLP  *pdservev1.TokenLogprob // its log-probability, or nil
	complete bool                    // prefill finished: kv holds the whole prompt
	bytes    int64                   // bytes charged against the store's limit
	pins     int                     // users that need kv kept (the prefill itself, a Resend)
	dropped  bool                    // released while pinned: delete at the last unpin
	idle     time.Time               // when its last user let go (it joined the LRU list)
	elem     *list.Element
}

// retainStore bounds and orders the KV a prefill worker holds. Pinned entries
// (being prefilled or sent) are never evicted; unpinned complete ones are
// evicted least recently used first. Not safe for concurrent use: the Server
// guards it with its mutex.
type retainStore struct {
	limit int64
	total int64 // bytes of every entry, pinned or not, including dropped ones still pinned
	m     map[string]*retained
	lru   list.List // unpinned entries; front is the most recently used
}

func newRetainStore(limit int64) *retainStore {
	return &retainStore{limit: limit, m: make(map[string]*retained)}
}

// add inserts a pinned entry charged bytes, replacing any entry of id.
func (s *retainStore) add(id string, kv *kvBuf, bytes int64) *retained {
	s.drop(id)
	e := &retained{id: id, kv: kv, bytes: bytes, pins: 1}
	s.m[id] = e
	s.total += bytes
	return e
}

// get returns the live entry of id, or nil.
func (s *retainStore) get(id string) *retained { return s.m[id] }

// pin marks e in use, so it is not evicted.
func (s *retainStore) pin(e *retained) {
	if e.pins == 0 && e.elem != nil {
		s.lru.Remove(e.elem)
		e.elem = nil
	}
	e.pins++
}

// unpin ends one use of e at now; an entry nobody uses becomes evictable
// (idle since now), or goes away when it was dropped or never completed.
func (s *retainStore) unpin(e *retained, now time.Time) {
	e.pins--
	if e.pins > 0 {
		return
	}
	if e.dropped || !e.complete {
		s.remove(e)
		return
	}
	e.idle = now
	e.elem = s.lru.PushFront(e)
}

// expire removes the unpinned entries idle for ttl or longer at now (the
// least recently used first: the list is in idle order) and returns how
// many went.
func (s *retainStore) expire(now time.Time, ttl time.Duration) int {
	n := 0
	for s.lru.Len() > 0 {
		e := s.lru.Back().Value.(*retained)
		if now.Sub(e.idle) < ttl {
			break
		}
		s.remove(e)
		n++
	}
	return n
}

// resize changes the bytes e is charged.
func (s *retainStore) resize(e *retained, bytes int64) {
	s.total += bytes - e.bytes
	e.bytes = bytes
}

// drop forgets id. Its bytes are freed now, or at the last unpin.
func (s *retainStore) drop(id string) {
	e := s.m[id]
	if e == nil {
		return
	}
	if e.pins > 0 {
		delete(s.m, id)
		e.dropped = true
		return
	}
	s.remove(e)
}

func (s *retainStore) remove(e *retained) {
	if s.m[e.id] == e {
		delete(s.m, e.id)
	}
	if e.elem != nil {
		s.lru.Remove(e.elem)
		e.elem = nil
	}
	s.total -= e.bytes
	e.bytes = 0
}

// makeRoom evicts unpinned entries, least recently used first, until need
// more bytes fit under the limit. It reports whether they fit, or nothing
// is pinned (a lone request is admitted whatever its size).
func (s *retainStore) makeRoom(need int64) bool {
	for s.total+need > s.limit && s.lru.Len() > 0 {
		s.remove(s.lru.Back().Value.(*retained))
	}
	return s.total+need <= s.limit || s.total == 0
}

// evictable returns the number of unpinned entries.
func (s *retainStore) evictable() int { return s.lru.Len() }
