package prefixcache

import (
	"bufio"
	"bytes"
	"container/list"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
)

// HostAutoDivisor sets the default host tier budget (Options.HostBytes
// Auto): FreeMemory at start, divided by it (a quarter of the free RAM,
// or of the room the memory cgroup's limit leaves).
const HostAutoDivisor = 4

// HostStats are the host tier's counters (since New) and occupancy.
type HostStats struct {
	Lookups   uint64 // Load calls
	Hits      uint64 // loads of at least one block
	HitTokens uint64 // tokens loaded: prefill tokens saved
	Spills    uint64 // engine entries copied in
	// SpillsSkipped counts engine entries not copied in: larger than the
	// budget alone, or held already.
	SpillsSkipped uint64
	Evictions     uint64 // entries dropped for the budget
	Superseded    uint64 // entries dropped for a newer one holding their blocks and more
	// Adopted counts entries taken in from another cache's tier on a
	// role change (Cache.Adopt of a Handover).
	Adopted  uint64
	Failures uint64 // exports or imports the engine refused, files that could not be written or read
	// BadEntries counts disk-tier entries dropped for a bad file: not a
	// regular file, of the wrong size, or failing its checksum (their
	// prefixes were computed instead). 0 for the host tier.
	BadEntries uint64
	// LoadTime is Σ the time loads took (the engine's modeled host-link
	// time on an engine that models it, wall time otherwise).
	LoadTime time.Duration
	Bytes    int64 // KV bytes held now (the model's true size)
	Budget   int64 // the tier's byte budget
	Blocks   int   // distinct block hashes held now
	Entries  int   // entries held now
}

// hostEntry is one sequence's full blocks copied out of the engine.
// Immutable once in the index: Load reads layers and snap without the
// lock.
type hostEntry struct {
	hashes []kv.Hash
	tokens int      // len(hashes) × BlockTokens
	layers [][]byte // per layer, the canonical KV of tokens [0, tokens); nil with snap
	// snap is a Snapshotter's copy of tokens [0, tokens) in place of
	// layers; nil: layers.
	snap  any
	bytes int64 // tokens × the model's KVBytesPerToken
	// ready is when its copy out of the engine ends on a SpillLinked
	// engine (zero: it had when Spill returned).
	ready time.Time
	el    *list.Element
	// source is the engine entry's provenance (entry.source): "" computed
	// by this worker, else the peer a verified pull came from.
	source string
}

// SpillLinked is an engine that models a spill's copy out of the device
// as a DMA beside its compute instead of taking its time (the sim engine,
// at its host link's bandwidth): Spill charges the entry's true size
// (ChargeHostSpill, which returns when the copy ends), and a Load of the
// entry before then waits for the rest (WaitHostSpill, which returns the
// wait, charged to the engine's next step).
type SpillLinked interface {
	ChargeHostSpill(bytes int64) time.Time
	WaitHostSpill(ready time.Time) time.Duration
}

// Snapshotter is an engine that copies a sequence's KV out and back in
// more cheaply than ExportKV and ImportKV over every layer: the sim engine,
// whose KV is a function of content keys it holds (a real engine's copy is
// a DMA of its blocks; the sim engine's ExportKV regenerates the bytes,
// CPU work a real engine does not do). The host tier keeps a snapshot in
// place of the layers' bytes; ExportKV after RestoreKV returns what it did
// before SnapshotKV.
type Snapshotter interface {
	// SnapshotKV returns the KV of seq's first tokens tokens, seq
	// unchanged.
	SnapshotKV(seq engine.SeqID, tokens int) (any, error)
	// RestoreKV creates seq, which the engine does not hold, with the
	// first tokens tokens of snap.
	RestoreKV(seq engine.SeqID, snap any, tokens int) error
	// SnapshotLayerKV appends the canonical KV of layer for all of snap's
	// tokens to dst (what ExportKV returned for them). It reads only snap
	// and what the engine never changes, so it is called without the
	// engine lock, beside the worker's steps.
	SnapshotLayerKV(snap any, layer int, dst []byte) ([]byte, error)
}

// Host is the host-memory tier of a Cache: the full blocks of engine
// entries the cache evicted, copied out of the engine (ExportKV over every
// layer, or a Snapshotter's snapshot) into host RAM under a byte budget,
// least recently used first out. A prompt whose prefix it holds deeper
// than the engine tier is loaded back into a new engine sequence (ImportKV,
// or RestoreKV) before its prefill continues.
//
// A nil *Host is a tier that is off: it holds nothing and Spill does
// nothing. Spill and Load call the engine they are given: the caller holds
// its engine lock (the worker's scheduler). The index is safe for
// concurrent use; its lock is a leaf and is never held across an engine
// call.
type Host struct {
	budget      int64
	blockTokens int
	now         func() time.Time

	mu  sync.Mutex
	idx chains[*hostEntry] // its obs: told of every hash the tier gains or loses
	st  HostStats
	// disk takes the entries evicted for the budget; nil: none.
	disk *Disk
}

var _ Blocks = (*Host)(nil)

// SetObserver makes o (nil: nobody) the tier's observer from now on, as
// Cache.SetObserver does for the engine tier: told of every block hash the
// tier starts and stops holding, in order, with the tier's lock held (o
// must return quickly and not call the tier). A no-op on a nil tier.
func (h *Host) SetObserver(o Observer) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.idx.obs = o
}

// AppendBlocks appends every block hash the tier holds to dst and returns
// it, calling mark (when not nil) under the lock after gathering them, as
// Cache.AppendBlocks does. A nil tier appends nothing.
func (h *Host) AppendBlocks(dst []uint64, mark func()) []uint64 {
	if h == nil {
		if mark != nil {
			mark()
		}
		return dst
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	dst = h.idx.appendHashes(dst)
	if mark != nil {
		mark()
	}
	return dst
}

// newHost returns a tier of budget bytes (> 0).
func newHost(budget int64, blockTokens int) *Host {
	return &Host{budget: budget, blockTokens: blockTokens, now: time.Now}
}

// Budget returns the tier's byte budget (0 for a nil tier, or one
// whose entries a Handover took).
func (h *Host) Budget() int64 {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.budget
}

// Match returns how many leading hashes the tier holds, changing nothing.
func (h *Host) Match(hashes []kv.Hash) int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.idx.depth(hashes)
}

// Spill copies the first len(hashes) × BlockTokens tokens of engine
// sequence seq, whose blocks hashes are (the caller's slice is kept: it
// must not change), into the tier as its most recently used entry, and
// evicts least recently used entries beyond the budget. It does not free
// seq. A sequence larger than the budget alone, or whose blocks an entry
// holds already (that entry becomes the most recent), is not copied. A
// Snapshotter's sequence is kept as its snapshot, not its layers' bytes;
// on a SpillLinked engine the copy's modeled time is charged as a DMA
// beside the engine's steps, not to them.
// Errors: the engine's (the tier is then unchanged).
func (h *Host) Spill(eng engine.Engine, seq engine.SeqID, hashes []kv.Hash) error {
	return h.spill(eng, seq, hashes, "")
}

// spill is Spill of an entry tagged with source (entry.source). An entry
// of a peer's KV stays in host memory and is dropped when the tier evicts
// it: the disk tier's files hold no provenance, so they hold only KV this
// worker computed.
func (h *Host) spill(eng engine.Engine, seq engine.SeqID, hashes []kv.Hash, source string) error {
	if h == nil || len(hashes) == 0 {
		return nil
	}
	spec := eng.Spec()
	tokens := len(hashes) * h.blockTokens
	size := int64(tokens) * int64(spec.KVBytesPerToken())
	h.mu.Lock()
	if h.idx.held(hashes) || size > h.budget {
		h.st.SpillsSkipped++
		h.mu.Unlock()
		return nil
	}
	h.mu.Unlock()
	e := &hostEntry{hashes: hashes, tokens: tokens, bytes: size, source: source}
	fail := func(what string, err error) error {
		h.mu.Lock()
		h.st.Failures++
		h.mu.Unlock()
		return fmt.Errorf("prefixcache: host tier: %s of seq %d: %w", what, seq, err)
	}
	if sn, ok := eng.(Snapshotter); ok {
		var err error
		if e.snap, err = sn.SnapshotKV(seq, tokens); err != nil {
			return fail("snapshot", err)
		}
	} else {
		e.layers = make([][]byte, spec.Layers)
		for l := range e.layers {
			var err error
			if e.layers[l], err = eng.ExportKV(seq, l, 0, tokens, nil); err != nil {
				return fail(fmt.Sprintf("export of layer %d", l), err)
			}
		}
	}
	if sl, ok := eng.(SpillLinked); ok {
		e.ready = sl.ChargeHostSpill(size)
	}
	h.mu.Lock()
	evicted := h.insertLocked(e)
	h.mu.Unlock()
	var errs []error
	for _, e := range evicted {
		if e.source != "" {
			continue // a peer's KV: not written to disk (spill)
		}
		if e.snap != nil {
			// The disk tier writes bytes: render the snapshot's.
			var err error
			if e, err = rendered(eng, e); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if err := h.disk.put(e); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rendered returns a copy of e, an entry holding a snapshot, holding its
// layers' bytes instead (eng: the Snapshotter that took it).
func rendered(eng engine.Engine, e *hostEntry) (*hostEntry, error) {
	sn, ok := eng.(Snapshotter)
	if !ok {
		return nil, errors.New("prefixcache: host tier: a snapshot entry on an engine that takes none")
	}
	r := *e
	r.snap, r.el = nil, nil
	r.layers = make([][]byte, eng.Spec().Layers)
	for l := range r.layers {
		var err error
		if r.layers[l], err = sn.SnapshotLayerKV(e.snap, l, nil); err != nil {
			return nil, fmt.Errorf("prefixcache: host tier: render layer %d for the disk tier: %w", l, err)
		}
	}
	return &r, nil
}

// insertLocked adds e as the most recent entry, drops the entries whose
// blocks are a prefix of e's, and evicts for the budget; it returns the
// evicted entries (for the disk tier; nil without one).
func (h *Host) insertLocked(e *hostEntry) []*hostEntry {
	h.st.Spills++
	h.st.Superseded += uint64(len(h.idx.insert(e)))
	evicted := h.idx.evict(h.budget)
	h.st.Evictions += uint64(len(evicted))
	if h.disk == nil {
		return nil
	}
	return evicted
}

// HostLoad is what Load brought back.
type HostLoad struct {
	// Tokens is the prefix loaded: a whole number of blocks, 0 on a miss.
	Tokens int
	// Bytes is its KV size, the model's true size.
	Bytes int64
	// Took is the load's time: the engine's modeled host-link time when
	// it models one (engine.HostLinked, charged to its next step, with
	// the wait for the entry's copy out still under way on a
	// SpillLinked engine), the wall time of the imports otherwise.
	Took time.Duration
	// Disk is set when the prefix was read from the disk tier behind the
	// host tier.
	Disk bool
	// Source is the entry's provenance (Cache.InsertFrom): "" computed
	// here, else the peer a verified pull came from; the disk tier holds
	// only the former.
	Source string
}

// Load imports into seq, a sequence the engine does not hold yet, the
// longest prefix of hashes the tier holds, at most maxBlocks blocks, and
// makes its entry the most recently used; it counts a lookup, and a hit
// when it loaded at least one block. When disk, the disk tier's entry
// read off the engine lock (Cache.ReadDisk; nil: none), holds a longer
// prefix, Load imports it instead (counted in the disk tier's stats): it
// reads no file itself. A miss changes nothing in the engine.
// Errors: the engine's ImportKV or RestoreKV (seq may then hold part of
// the prefix: the caller frees it).
func (h *Host) Load(eng engine.Engine, seq engine.SeqID, hashes []kv.Hash, maxBlocks int, disk *DiskRead) (HostLoad, error) {
	if h == nil {
		return HostLoad{}, nil
	}
	if lim := hashes[:min(len(hashes), max(maxBlocks, 0))]; h.disk != nil && disk.depth(lim) > h.Match(lim) {
		return h.disk.loadRead(eng, seq, disk, hashes, maxBlocks)
	}
	h.mu.Lock()
	h.st.Lookups++
	n := h.idx.depth(hashes[:min(len(hashes), max(maxBlocks, 0))])
	if n == 0 {
		h.mu.Unlock()
		return HostLoad{}, nil
	}
	e := h.idx.newest(hashes[:n])
	h.mu.Unlock()

	m := n * h.blockTokens
	size := e.bytes / int64(e.tokens) * int64(m)
	t0 := h.now()
	if e.snap != nil {
		sn, ok := eng.(Snapshotter)
		if !ok {
			return HostLoad{}, errors.New("prefixcache: host tier: a snapshot entry on an engine that takes none")
		}
		if err := sn.RestoreKV(seq, e.snap, m); err != nil {
			h.mu.Lock()
			h.st.Failures++
			h.mu.Unlock()
			return HostLoad{}, fmt.Errorf("prefixcache: host tier: restore seq %d: %w", seq, err)
		}
	}
	if err := importPrefix(eng, seq, e.layers, e.tokens, m); err != nil {
		h.mu.Lock()
		h.st.Failures++
		h.mu.Unlock()
		return HostLoad{}, fmt.Errorf("prefixcache: host tier: seq %d: %w", seq, err)
	}
	took := h.now().Sub(t0)
	if hl, ok := eng.(engine.HostLinked); ok {
		took = hl.ChargeHostLoad(size)
	}
	if sl, ok := eng.(SpillLinked); ok && !e.ready.IsZero() {
		// Its copy out may not have ended: the load waits for it.
		took += sl.WaitHostSpill(e.ready)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.st.Hits++
	h.st.HitTokens += uint64(m)
	h.st.LoadTime += took
	return HostLoad{Tokens: m, Bytes: size, Took: took, Source: e.source}, nil
}

// dropSource drops every entry of the tier whose KV came from source
// (Cache.DropSource) and returns how many it dropped. A nil tier drops
// nothing.
func (h *Host) dropSource(source string) int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var drop []*hostEntry
	for el := h.idx.lru.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*hostEntry); e.source == source {
			drop = append(drop, e)
		}
	}
	for _, e := range drop {
		h.idx.drop(e)
	}
	return len(drop)
}

// appendPrefix appends to dst the first m of the n tokens of one layer's
// canonical KV (all K rows, then all V rows): K rows [0, m), V rows
// [0, m).
func appendPrefix(dst, data []byte, n, m int) []byte {
	row := len(data) / (2 * n)
	dst = append(dst, data[:m*row]...)
	return append(dst, data[n*row:(n+m)*row]...)
}

// Disk returns the disk tier behind h (nil: none, or a nil tier).
func (h *Host) Disk() *Disk {
	if h == nil {
		return nil
	}
	return h.disk
}

// Stats returns the tier's counters and occupancy (zero for a nil tier).
func (h *Host) Stats() HostStats {
	if h == nil {
		return HostStats{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.st
	st.Bytes, st.Budget, st.Blocks, st.Entries = h.idx.bytes, h.budget, h.idx.blocks(), h.idx.entries()
	return st
}

// MemAvailable returns MemAvailable of /proc/meminfo in bytes. Errors: the
// file cannot be read or has no such line (not Linux).
func MemAvailable() (int64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("prefixcache: free memory: %w", err)
	}
	return memAvailable(data)
}

func memAvailable(meminfo []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil || kb < 0 {
				return 0, fmt.Errorf("prefixcache: free memory: bad MemAvailable %q", f[1])
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("prefixcache: free memory: no MemAvailable in /proc/meminfo")
}
