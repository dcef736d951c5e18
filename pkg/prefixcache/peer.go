package prefixcache

import (
	"context"
	"fmt"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
)

// The tiers a prefix is exported from (Exported.Tier, the Pull header's
// tier).
const (
	TierEngine = "engine"
	TierHost   = "host"
	TierDisk   = "disk"
)

// PeerStats count the prefixes a cache's worker pulled from its peers
// and the prefixes it exported to them.
type PeerStats struct {
	Pulls        uint64 // pulls that brought at least one block
	PullFailures uint64 // pulls that failed (the prompt was computed instead)
	// PullsSkipped counts prefixes a peer held that the link model said
	// were faster to compute than to pull.
	PullsSkipped uint64
	// PulledTokens and PulledBytes are what those pulls brought (bytes:
	// the KV's canonical size as received).
	PulledTokens uint64
	PulledBytes  uint64
	// HitTokens is the pulled prompt tokens that started a sequence:
	// prefill tokens saved.
	HitTokens uint64
	PullTime  time.Duration // Σ the pulls' time, the imports' included
	Exports   uint64        // prefixes copied out for a peer
	// ExportTokens is their tokens.
	ExportTokens uint64
	// Verified counts pulls whose spot check (a sampled block recomputed
	// here) matched: their KV may be cached, exported and advertised,
	// tagged with its peer (InsertFrom).
	Verified uint64
	// Rejected counts pulls whose spot check did not match: their KV was
	// dropped, the prompt computed here, the peer no longer pulled from.
	Rejected uint64
	// Unverified counts pulled prefixes used, unchecked, for their own
	// request only: never cached, so never exported nor advertised.
	Unverified uint64
	// CheckTokens is the prompt tokens the spot checks recomputed, and
	// CheckTime the time they took (imports and prefill, under the
	// engine lock).
	CheckTokens uint64
	CheckTime   time.Duration
	// Purged counts cached entries (engine and host tiers) dropped
	// because the peer they came from failed a later spot check
	// (DropSource).
	Purged uint64
}

// Exported is a cached prefix's KV copied out of one tier for a peer.
type Exported struct {
	// Tokens is the prefix: a whole number of blocks, 0 when no tier
	// held enough of it.
	Tokens int
	// Tier is where it was read from: TierEngine, TierHost or TierDisk.
	Tier string
	// Layers holds, per layer, the canonical KV of tokens [0, Tokens) as
	// ExportKV returns it (all K rows, then all V rows).
	Layers [][]byte
}

// Export copies out the longest prefix of hashes, at most maxBlocks
// blocks, that a tier of the cache holds, when it is at least minBlocks
// (≥ 1) blocks, from the tier holding the most of it (engine memory
// first on a tie, then the host tier, then the disk tier): for a peer
// worker that would otherwise compute it. lock takes the worker's engine
// lock and returns the function that releases it; Export holds it for
// each engine call only (one layer's ExportKV from the engine tier's
// pinned entry, or one snapshot of it from a Snapshotter), so that the
// worker's steps go on between layers; a snapshot is rendered without
// it. It changes no entry's recency and counts no lookup:
// a peer's interest is not this worker's. Errors: the engine's, or the
// disk tier's file; nothing is held afterwards either way.
func (c *Cache) Export(eng engine.Engine, lock func() func(), hashes []kv.Hash, minBlocks, maxBlocks int) (Exported, error) {
	if c == nil {
		return Exported{}, nil
	}
	lim := hashes[:min(len(hashes), max(maxBlocks, 0))]
	ne, nh, nd := c.Match(lim), c.host.Match(lim), c.host.Disk().Match(lim)
	best := max(ne, nh, nd)
	if best == 0 || best < minBlocks {
		return Exported{}, nil
	}
	var (
		x   Exported
		err error
	)
	switch best {
	case ne:
		x, err = c.exportEngine(eng, lock, lim[:ne])
	case nh:
		x, err = c.host.export(eng, lim[:nh])
	default:
		x, err = c.host.disk.export(lim[:nd])
	}
	if err != nil || x.Tokens == 0 || x.Tokens < minBlocks*c.o.BlockTokens {
		return Exported{}, err
	}
	c.mu.Lock()
	c.st.Peer.Exports++
	c.st.Peer.ExportTokens += uint64(x.Tokens)
	c.mu.Unlock()
	return x, nil
}

// exportEngine copies out the engine tier's longest prefix of hashes:
// its entry pinned (so that no eviction frees it) while each layer is
// exported under the engine lock. A Snapshotter's entry is snapshotted
// under the lock once and its layers rendered without it: a worker
// whose engine runs step after step (the sim engine holds the lock for
// a step's modeled time, as a GPU is busy for it) then makes the peer
// wait for one step, not one a layer; a GPU's copy out runs beside its
// compute.
func (c *Cache) exportEngine(eng engine.Engine, lock func() func(), hashes []kv.Hash) (Exported, error) {
	// The pin is taken under the engine lock: the worker's scheduler,
	// which holds it while it decides what the engine's memory holds,
	// sees no entry pinned behind its back (a pin it did not count would
	// keep an entry it evicts for a new request's room).
	unlock := lock()
	hit := c.acquire(hashes, len(hashes), false)
	if hit.Tokens == 0 {
		unlock()
		return Exported{}, nil // evicted since Match
	}
	defer c.Release(hit)
	x := Exported{Tokens: hit.Tokens, Tier: TierEngine, Layers: make([][]byte, eng.Spec().Layers)}
	if sn, ok := eng.(Snapshotter); ok {
		snap, err := sn.SnapshotKV(hit.Seq, hit.Tokens)
		unlock()
		if err != nil {
			return Exported{}, fmt.Errorf("prefixcache: snapshot for a peer: %w", err)
		}
		for l := range x.Layers {
			if x.Layers[l], err = sn.SnapshotLayerKV(snap, l, nil); err != nil {
				return Exported{}, fmt.Errorf("prefixcache: render layer %d for a peer: %w", l, err)
			}
		}
		return x, nil
	}
	for l := range x.Layers {
		if l > 0 {
			unlock = lock()
		}
		data, err := eng.ExportKV(hit.Seq, l, 0, hit.Tokens, nil)
		unlock()
		if err != nil {
			return Exported{}, fmt.Errorf("prefixcache: export layer %d for a peer: %w", l, err)
		}
		x.Layers[l] = data
	}
	return x, nil
}

// export copies out the host tier's longest prefix of hashes (its
// entry's bytes, or its snapshot rendered, which needs no engine lock).
func (h *Host) export(eng engine.Engine, hashes []kv.Hash) (Exported, error) {
	h.mu.Lock()
	n := h.idx.depth(hashes)
	if n == 0 {
		h.mu.Unlock()
		return Exported{}, nil
	}
	e := h.idx.newest(hashes[:n])
	h.mu.Unlock()
	// e is immutable: its layers or snapshot are read without the lock,
	// also after an eviction dropped it from the index.
	if e.snap != nil {
		r, err := rendered(eng, e)
		if err != nil {
			return Exported{}, err
		}
		e = r
	}
	m := n * h.blockTokens
	return Exported{Tokens: m, Tier: TierHost, Layers: prefixLayers(e.layers, e.tokens, m)}, nil
}

// export copies out the disk tier's longest prefix of hashes from its
// entry's file, read and checked as for a load (readEntry): a bad entry
// is dropped and counted, an entry whose file is gone dropped.
func (d *Disk) export(hashes []kv.Hash) (Exported, error) {
	d.mu.Lock()
	n := d.idx.depth(hashes)
	if n == 0 {
		d.mu.Unlock()
		return Exported{}, nil
	}
	d.mu.Unlock()
	r, err := d.readEntry(context.Background(), hashes, n)
	if err != nil {
		return Exported{}, fmt.Errorf("prefixcache: disk tier: export for a peer: %w", err)
	}
	if r == nil {
		return Exported{}, nil // dropped since the lookup
	}
	m := min(n, r.depth(hashes)) * d.blockTokens
	return Exported{Tokens: m, Tier: TierDisk, Layers: prefixLayers(r.layers, r.tokens, m)}, nil
}

// prefixLayers returns layers, each the canonical KV of n tokens, cut to
// their first m tokens (new slices when m < n; layers itself otherwise).
func prefixLayers(layers [][]byte, n, m int) [][]byte {
	if m >= n {
		return layers
	}
	out := make([][]byte, len(layers))
	for l, data := range layers {
		out[l] = appendPrefix(nil, data, n, m)
	}
	return out
}

// importPrefix imports into seq, a sequence the engine does not hold yet,
// the first m tokens of layers (each the canonical KV of n tokens).
func importPrefix(eng engine.Engine, seq engine.SeqID, layers [][]byte, n, m int) error {
	var buf []byte
	for l, data := range layers {
		if m < n {
			buf = appendPrefix(buf[:0], data, n, m)
			data = buf
		}
		if err := eng.ImportKV(seq, l, 0, data); err != nil {
			return fmt.Errorf("import layer %d: %w", l, err)
		}
	}
	return nil
}

// Pulled is a prompt's prefix KV received from a peer worker
// (kvtransfer's Pull), to start a sequence from instead of computing it.
type Pulled struct {
	// Tokens is the prefix: a whole number of the worker's blocks.
	Tokens int
	// Layers holds, per layer, the canonical KV of tokens [0, Tokens).
	Layers [][]byte
	// Tier is the tier the peer read it from.
	Tier string
	// Took is the time the pull took (the Load's import time is added).
	Took time.Duration
	// Source is the verified identity of the peer it came from (its
	// heartbeat id, which the TLS handshake of the pull checked).
	Source string
	// Verified is set when a spot check recomputed sampled blocks of it
	// here and they matched. Unverified KV serves its own request only:
	// the worker never caches, exports or advertises it.
	Verified bool
}

// Bytes returns the canonical KV bytes p holds.
func (p *Pulled) Bytes() int64 {
	var n int64
	for _, l := range p.Layers {
		n += int64(len(l))
	}
	return n
}

// NotePull counts a pull's outcome in the cache's PeerStats: p when it
// brought at least one block, a failure when err is not nil (p is then
// ignored). A nil cache counts nothing.
func (c *Cache) NotePull(p *Pulled, err error) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil:
		c.st.Peer.PullFailures++
	case p != nil && p.Tokens > 0:
		c.st.Peer.Pulls++
		c.st.Peer.PulledTokens += uint64(p.Tokens)
		c.st.Peer.PulledBytes += uint64(p.Bytes())
		c.st.Peer.PullTime += p.Took
	}
}

// NoteCheck counts a spot check of a pull: ok when its blocks matched,
// the tokens it recomputed and the time it took.
func (c *Cache) NoteCheck(ok bool, tokens int, took time.Duration) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok {
		c.st.Peer.Verified++
	} else {
		c.st.Peer.Rejected++
	}
	c.st.Peer.CheckTokens += uint64(tokens)
	c.st.Peer.CheckTime += took
}

// NoteUnverified counts a pulled prefix that served its request unchecked
// and was not cached.
func (c *Cache) NoteUnverified() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.Peer.Unverified++
}

// NotePullSkipped counts a pull the worker did not make: computing the
// prefix was faster.
func (c *Cache) NotePullSkipped() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.Peer.PullsSkipped++
}

// LoadPulled imports into seq, a sequence the engine does not hold yet,
// the first min(p.Tokens, maxBlocks × BlockTokens) tokens of p and
// returns them (0: nothing to load) with the time the pull and the
// imports took; the tokens count as the cache's peer hit tokens. The
// caller holds the engine lock. Errors: the engine's ImportKV (seq may
// then hold part of the prefix: the caller frees it).
func (c *Cache) LoadPulled(eng engine.Engine, seq engine.SeqID, p *Pulled, maxBlocks int) (int, time.Duration, error) {
	if c == nil || p == nil {
		return 0, 0, nil
	}
	m := min(p.Tokens, max(maxBlocks, 0)*c.o.BlockTokens)
	if m <= 0 {
		return 0, 0, nil
	}
	if len(p.Layers) != eng.Spec().Layers {
		return 0, 0, fmt.Errorf("prefixcache: pulled KV of %d layers for a model of %d", len(p.Layers), eng.Spec().Layers)
	}
	t0 := time.Now()
	if err := importPrefix(eng, seq, p.Layers, p.Tokens, m); err != nil {
		return 0, 0, fmt.Errorf("prefixcache: pulled prefix of seq %d: %w", seq, err)
	}
	took := p.Took + time.Since(t0)
	c.mu.Lock()
	c.st.Peer.HitTokens += uint64(m)
	c.mu.Unlock()
	return m, took, nil
}

// PeerDepth returns how many leading blocks of hashes, at most maxBlocks,
// the cache holds in any tier: a pull of fewer is not worth it.
func (c *Cache) PeerDepth(hashes []kv.Hash, maxBlocks int) int {
	if c == nil {
		return 0
	}
	lim := hashes[:min(len(hashes), max(maxBlocks, 0))]
	return max(c.Match(lim), c.host.Match(lim), c.host.Disk().Match(lim))
}
