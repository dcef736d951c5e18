package prefixcache

import (
	"slices"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
)

// Handover is the engine tier of a cache given to another cache on the
// same engine (Cache.Handover, Cache.Adopt): an elastic worker's role
// change keeps its prefix cache as the new role's, the KV staying in the
// engine sequences it is in. Its entries are the old cache's unpinned
// ones, most recently used first, with their block hashes (under the old
// cache's HashKey, from each request's chain root) and provenance tags.
// Whoever holds a Handover owns its engine sequences: it adopts or frees
// them (Seqs).
type Handover struct {
	// BlockTokens and key are the old cache's: a cache of another block
	// size or key cannot match the hashes, and adopts nothing.
	BlockTokens int
	key         kv.HashKey
	Entries     []Handed
}

// Handed is one entry of a Handover: an engine sequence whose first
// len(Hashes) × BlockTokens KV tokens are the prompt blocks Hashes, Tokens
// KV tokens in all, its KV from Source (see InsertFrom).
type Handed struct {
	Seq    engine.SeqID
	Hashes []kv.Hash
	Tokens int
	Source string
}

// Seqs returns the engine sequences h holds (nil for none).
func (h Handover) Seqs() []engine.SeqID {
	var s []engine.SeqID
	for _, e := range h.Entries {
		s = append(s, e.Seq)
	}
	return s
}

// MaxSeq returns the largest engine sequence id h holds (0: none): a
// batch that adopts h numbers its new sequences after it.
func (h Handover) MaxSeq() engine.SeqID {
	var m engine.SeqID
	for _, e := range h.Entries {
		m = max(m, e.Seq)
	}
	return m
}

// Handover takes every unpinned entry out of the cache, without freeing
// its engine sequence, and returns them for another cache on the same
// engine (Adopt); the Observer is told of the blocks removed, as by
// Drain. Pinned entries stay (a peer's export under way); the host and
// disk tiers stay too (Drain empties them). The caller holds its engine
// lock, or the engine's loop has stopped; it owns the returned sequences.
// A nil cache hands over nothing.
func (c *Cache) Handover() Handover {
	if c == nil {
		return Handover{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := Handover{BlockTokens: c.o.BlockTokens, key: c.o.HashKey}
	for el := c.lru.Front(); el != nil; {
		e := el.Value.(*entry)
		el = el.Next()
		if e.pins == 0 {
			h.Entries = append(h.Entries, Handed{Seq: e.seq, Hashes: e.hashes, Tokens: e.tokens, Source: e.source})
			c.dropLocked(e)
		}
	}
	return h
}

// Adopt takes h's entries in, keeping their recency order, tags and
// hashes, as if each was inserted (InsertFrom; they count in
// Stats.Adopted, not Inserts), and returns the engine sequences the
// caller must Free under its engine lock: all of h's when the cache is
// off or hashes with another block size or key, else those that exceed
// MaxTokens alone or add nothing, the entries they supersede, and the
// least recently used unpinned entries beyond the bounds (copied into
// the host tier by Free, as evictions are).
func (c *Cache) Adopt(h Handover) []engine.SeqID {
	if c == nil || h.BlockTokens != c.o.BlockTokens || h.key != c.o.HashKey {
		return h.Seqs()
	}
	var free []engine.SeqID
	// Least recently used first: the last one in is the most recent.
	for _, e := range slices.Backward(h.Entries) {
		free = append(free, c.insert(e.Seq, e.Hashes, e.Tokens, e.Source, true)...)
	}
	return free
}
