package prefixcache

import (
	"slices"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
)

// Handover is a cache's tiers given to another cache on the same engine
// (Cache.Handover, Cache.Adopt): an elastic worker's role change keeps
// its prefix cache as the new role's, the KV staying in the engine
// sequences it is in, and in the host memory and files it is in. Its
// Entries are the old cache's unpinned engine entries, most recently used
// first, with their block hashes (under the old cache's HashKey, from
// each request's chain root) and provenance tags; its host tier's and
// disk tier's entries travel with it, unexported. Whoever holds a
// Handover owns its engine sequences and its tiers: it adopts them
// (Adopt), or frees the sequences (Seqs) and drops the tiers
// (DropTiers).
type Handover struct {
	// BlockTokens and key are the old cache's: a cache of another block
	// size or key cannot match the hashes, and adopts nothing.
	BlockTokens int
	key         kv.HashKey
	Entries     []Handed
	// tiers holds the old cache's host-tier entries and its disk tier
	// (Host.takeOver); nil: it had none.
	tiers *Host
}

// DropTiers drops the host and disk tiers h holds (the disk tier's
// directory and files are removed), for a Handover nobody adopts.
// Errors: the removal's. h's engine sequences are the caller's to free.
func (h Handover) DropTiers() error {
	if h.tiers == nil {
		return nil
	}
	return h.tiers.disk.clear()
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
// its engine sequence, and every entry out of its host and disk tiers,
// without copying their KV or moving their files, and returns them for
// another cache on the same engine (Adopt); the observers (the cache's,
// the tiers') are told of the blocks removed, as by Drain. Pinned
// entries stay (a peer's export under way). The host and disk tiers take
// no more spills, and Drain leaves the disk tier's directory, which the
// Handover owns now. The caller holds its engine lock, or the engine's
// loop has stopped; it owns the returned sequences and tiers. A nil
// cache hands over nothing.
func (c *Cache) Handover() Handover {
	if c == nil {
		return Handover{}
	}
	// The tiers first, outside the cache's lock (a leaf).
	h := Handover{BlockTokens: c.o.BlockTokens, key: c.o.HashKey, tiers: c.host.takeOver()}
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.spill) // nothing more goes to the host tier
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
// the host tier by Free, as evictions are). h's host-tier entries join
// this cache's host tier (their KV not copied; HostStats.Adopted), older
// than its own, under its budget, and h's disk-tier entries its disk
// tier, their files renamed into its directory; a tier this cache lacks,
// or a cache of another block size or key, drops h's (DropTiers). A
// disk-tier file that cannot move drops its entry (HostStats.Failures).
func (c *Cache) Adopt(h Handover) []engine.SeqID {
	if c == nil || h.BlockTokens != c.o.BlockTokens || h.key != c.o.HashKey {
		_ = h.DropTiers() // a failure is counted in the dropped tier's stats
		return h.Seqs()
	}
	// Before the engine entries: those Adopt evicts go to the host tier
	// (Free) after the older entries handed over.
	_ = c.host.adopt(h.tiers) // failures are counted in the tiers' stats
	var free []engine.SeqID
	// Least recently used first: the last one in is the most recent.
	for _, e := range slices.Backward(h.Entries) {
		free = append(free, c.insert(e.Seq, e.Hashes, e.Tokens, e.Source, true)...)
	}
	return free
}
