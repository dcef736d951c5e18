package control

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// KVIndexEntryBytes is what one block of a KVIndex costs in memory, an
// upper bound: a Go map of uint64 keys takes 10 to 36 bytes an entry
// (about 36 just after it doubled), 40 with its bookkeeping. The index's
// byte caps are counted in entries of this size.
const KVIndexEntryBytes = 40

// Defaults of KVIndexOptions: a worker's views may hold 64 MiB (1.6 Mi
// blocks, 26 Mi tokens at 16 tokens a block: more than one GPU's KV and
// its host tier hold today), all workers' 1 GiB: sixteen workers at their
// cap, or 64 at a quarter of it. A larger cluster raises the global cap.
const (
	DefaultKVIndexWorkerMaxBytes = 64 << 20
	DefaultKVIndexMaxBytes       = 1 << 30
)

// DefaultKVIndexMaxBlocks is the per-worker cap of DefaultKVIndexOptions
// in blocks.
const DefaultKVIndexMaxBlocks = DefaultKVIndexWorkerMaxBytes / KVIndexEntryBytes

// KVIndexOptions configure a KVIndex.
type KVIndexOptions struct {
	// MaxBytes caps the memory of every worker's views together (all
	// tiers, snapshots being assembled included), in bytes of
	// KVIndexEntryBytes a block; >= WorkerMaxBytes. A worker that needs
	// room beyond it takes it from the worker holding the most blocks
	// (evicted, counted), or, when it holds the most itself, is left
	// without it.
	MaxBytes int64
	// WorkerMaxBytes caps one worker's views (all its tiers together),
	// as MaxBytes does; >= KVIndexEntryBytes. Blocks beyond it are left
	// out (counted). It also bounds a snapshot's parts, and, as wire
	// bytes, the worker's queue of messages waiting to be applied
	// (WatchKV).
	WorkerMaxBytes int64
	// Admitted reports whether a worker id of role may be indexed: the
	// coordinator's admitted members (see Membership.Admitted). Payloads
	// of other ids are dropped unread and counted; nil: every id.
	Admitted func(role, id string) bool
	// OnStale is told once per stale period, when a worker's view has a
	// gap or no snapshot yet: the caller may ask the worker for one
	// (CmdKVSnapshot). It runs on Apply's goroutine, without locks held,
	// and must not block or call the index; nil: nobody. WatchKV also
	// tells it, from its own goroutine, of a worker whose payloads it
	// dropped as not admitted once the worker is admitted in that role
	// (its first snapshot beat its first heartbeat, or the heartbeat of
	// its new role: an elastic worker's).
	OnStale func(role, id string)
}

// DefaultKVIndexOptions returns the default caps, every id admitted and
// no OnStale.
func DefaultKVIndexOptions() KVIndexOptions {
	return KVIndexOptions{MaxBytes: DefaultKVIndexMaxBytes, WorkerMaxBytes: DefaultKVIndexWorkerMaxBytes}
}

// Validate reports every invalid field in one error.
func (o KVIndexOptions) Validate() error {
	var errs []error
	if o.WorkerMaxBytes < KVIndexEntryBytes {
		errs = append(errs, fmt.Errorf("kv-index-worker-max-bytes %d must hold one block (%d bytes)", o.WorkerMaxBytes, KVIndexEntryBytes))
	}
	if o.MaxBytes < o.WorkerMaxBytes {
		errs = append(errs, fmt.Errorf("kv-index-max-bytes %d must be at least kv-index-worker-max-bytes %d", o.MaxBytes, o.WorkerMaxBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("control: %w", err)
	}
	return nil
}

// KVIndex is the coordinator's view of the blocks every worker's prefix
// cache holds, built from the workers' KV events and snapshots (Apply).
// A worker's view starts at its first snapshot; from then on each events
// batch of the next sequence number is applied. A gap (a batch lost)
// marks the view stale: later batches are still applied (every report is
// a hash's new state, so only the lost batch's hashes may be wrong), and
// the next snapshot replaces it.
//
// Memory: one entry (KVIndexEntryBytes) per block a worker holds, at most
// WorkerMaxBytes a worker and MaxBytes in all; it grows only as hashes
// arrive, whatever counts a message claims. Only admitted ids are
// indexed. Safe for concurrent use.
type KVIndex struct {
	o                        KVIndexOptions
	maxEntries, workerMaxEnt int64

	mu sync.Mutex
	// views are the workers' views by tier (kvTiers: "" the engine
	// tier, KVTierHost, KVTierDisk), then by id.
	views map[string]map[string]*WorkerBlocks
	// entries counts every view's set and pending snapshot, held and
	// reserved; byWorker the same by id.
	entries  int64
	byWorker map[string]int64
	stats    KVIndexStats
}

// KVIndexStats are a KVIndex's counters.
type KVIndexStats struct {
	Bytes int64 // held now: blocks × KVIndexEntryBytes
	// Evicted counts blocks taken out of the largest worker's views to
	// make room under MaxBytes; LeftOut blocks not indexed because their
	// worker was at WorkerMaxBytes or held the most at MaxBytes.
	Evicted, LeftOut uint64
	// NotAdmitted counts payloads of ids not admitted, dropped unread;
	// Refused payloads that did not decode or broke a limit; QueueFull
	// payloads dropped for a full worker queue (WatchKV).
	NotAdmitted, Refused, QueueFull uint64
}

// Stats returns the index's counters.
func (ix *KVIndex) Stats() KVIndexStats {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.stats
	s.Bytes = ix.entries * KVIndexEntryBytes
	return s
}

// NewKVIndex returns an empty index with the default byte caps, except
// that one worker's views hold at most maxBlocks (> 0) blocks; every id
// is admitted. onStale: as KVIndexOptions.OnStale.
func NewKVIndex(maxBlocks int, onStale func(role, id string)) *KVIndex {
	o := DefaultKVIndexOptions()
	o.WorkerMaxBytes = int64(maxBlocks) * KVIndexEntryBytes
	o.MaxBytes = max(o.MaxBytes, o.WorkerMaxBytes)
	o.OnStale = onStale
	ix, _ := NewKVIndexWith(o) // valid by construction for maxBlocks > 0
	return ix
}

// NewKVIndexWith returns an empty index configured by o. Errors: an
// invalid o, wrapped.
func NewKVIndexWith(o KVIndexOptions) (*KVIndex, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	ix := &KVIndex{o: o, maxEntries: o.MaxBytes / KVIndexEntryBytes, workerMaxEnt: o.WorkerMaxBytes / KVIndexEntryBytes,
		views: make(map[string]map[string]*WorkerBlocks, len(kvTiers)), byWorker: map[string]int64{}}
	for _, tier := range kvTiers {
		ix.views[tier] = make(map[string]*WorkerBlocks)
	}
	return ix, nil
}

// WorkerBlocks is one worker's blocks in a KVIndex. Safe for concurrent
// use.
type WorkerBlocks struct {
	mu     sync.RWMutex
	role   string
	set    map[uint64]struct{}
	epoch  uint64
	seq    uint64 // the last batch applied, or the snapshot's
	synced bool   // a snapshot of this epoch was applied
	stale  bool   // a batch was lost since that snapshot
	asked  bool   // onStale was told of this stale period
	absent bool   // not a member at the last Retain
	// dropped: the index let go of the view (Retain, Drop); applying
	// to it changes nothing.
	dropped bool
	// pend gathers a snapshot's parts: of pendSeq, next part pendNext
	// of pendParts; nil when none is under way.
	pend                map[uint64]struct{}
	pendSeq             uint64
	pendNext, pendParts int
	gaps, snapshots     uint64
}

// Match returns how many of hashes, from the first, the worker holds: the
// match stops at the first miss, as the hashes are chained.
func (w *WorkerBlocks) Match(hashes []uint64) int {
	w.mu.RLock()
	defer w.mu.RUnlock()
	n := 0
	for _, h := range hashes {
		if _, ok := w.set[h]; !ok {
			break
		}
		n++
	}
	return n
}

// Has reports whether the worker holds h.
func (w *WorkerBlocks) Has(h uint64) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	_, ok := w.set[h]
	return ok
}

// KVWorkerState is what a KVIndex knows of one worker.
type KVWorkerState struct {
	Role   string // the role of the worker's payloads the view holds
	Blocks int    // blocks held
	Seq    uint64 // the last batch applied (or the snapshot's)
	Synced bool   // a snapshot was applied: Blocks is the cache's
	Stale  bool   // a batch was lost since the last snapshot
	// Gaps and Snapshots count lost-batch detections and snapshots
	// applied since the index first heard of the worker.
	Gaps, Snapshots uint64
}

// State returns what the index knows of the worker.
func (w *WorkerBlocks) State() KVWorkerState {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return KVWorkerState{Role: w.role, Blocks: len(w.set), Seq: w.seq, Synced: w.synced, Stale: w.stale, Gaps: w.gaps, Snapshots: w.snapshots}
}

// Blocks returns the worker id's view, or nil when the index has none
// that a snapshot founded: a caller then falls back on what else it
// knows (the heartbeat's digest). The view stays valid, and current,
// until the worker is dropped.
func (ix *KVIndex) Blocks(id string) *WorkerBlocks { return ix.tierBlocks("", id) }

// HostBlocks returns the view of worker id's host tier (KVTierHost), as
// Blocks does for its engine tier: nil when no snapshot of it founded one
// (the worker has no host tier, or it was not heard of yet).
func (ix *KVIndex) HostBlocks(id string) *WorkerBlocks { return ix.tierBlocks(KVTierHost, id) }

// DiskBlocks returns the view of worker id's disk tier (KVTierDisk), as
// HostBlocks does for its host tier: nil when no snapshot of it founded
// one (the worker has no disk tier, or it was not heard of yet).
func (ix *KVIndex) DiskBlocks(id string) *WorkerBlocks { return ix.tierBlocks(KVTierDisk, id) }

func (ix *KVIndex) tierBlocks(tier, id string) *WorkerBlocks {
	ix.mu.Lock()
	w := ix.views[tier][id]
	ix.mu.Unlock()
	if w == nil {
		return nil
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if !w.synced {
		return nil
	}
	return w
}

// Len returns how many workers the index holds a view of.
func (ix *KVIndex) Len() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(ix.views[""])
}

// Retain drops the view of every worker that member reported absent at
// this call and the one before (two, so that a worker whose first events
// beat its first heartbeat keeps its view).
func (ix *KVIndex) Retain(member func(id string) bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, m := range ix.views {
		for id, w := range m {
			if member(id) {
				w.absent = false
				continue
			}
			if w.absent {
				ix.dropLocked(m, id, w)
				continue
			}
			w.absent = true
		}
	}
}

// Drop forgets the worker id's view at once.
func (ix *KVIndex) Drop(id string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, m := range ix.views {
		if w := m[id]; w != nil {
			ix.dropLocked(m, id, w)
		}
	}
}

// dropLocked deletes view w of id from m and gives back its entries.
func (ix *KVIndex) dropLocked(m map[string]*WorkerBlocks, id string, w *WorkerBlocks) {
	delete(m, id)
	w.mu.Lock()
	n := int64(len(w.set) + len(w.pend))
	w.dropped, w.set, w.pend = true, nil, nil
	w.mu.Unlock()
	ix.chargeLocked(id, -n)
}

// chargeLocked adds n (may be negative) to id's entries and the total.
func (ix *KVIndex) chargeLocked(id string, n int64) {
	ix.entries += n
	if v := ix.byWorker[id] + n; v > 0 {
		ix.byWorker[id] = v
	} else {
		delete(ix.byWorker, id)
	}
}

// ErrNotAdmitted: KV events of a worker id the index does not admit
// (KVIndexOptions.Admitted).
var ErrNotAdmitted = errors.New("control: kv events of a worker not admitted")

// Apply applies one KV payload received from worker id of role (the
// subject's tokens). Errors: ErrNotAdmitted, ErrBadKVMessage (the payload
// is refused and changes nothing), or a view beyond the index's caps (the
// blocks beyond them are left out), wrapped.
func (ix *KVIndex) Apply(role, id string, data []byte) error { return ix.ApplyTier(role, id, "", data) }

// ApplyTier is Apply for one tier of the worker's cache: "" (the engine
// tier, as Apply), KVTierHost or KVTierDisk. A stale view of any tier
// tells OnStale of the worker (the snapshot it asks for covers every
// tier). Errors: as Apply's, and an unknown tier.
func (ix *KVIndex) ApplyTier(role, id, tier string, data []byte) error {
	if !validKVTier(tier) {
		ix.count(func(s *KVIndexStats) { s.Refused++ })
		return fmt.Errorf("control: kv events of %s: unknown tier %q", id, tier)
	}
	if ix.o.Admitted != nil && !ix.o.Admitted(role, id) {
		ix.count(func(s *KVIndexStats) { s.NotAdmitted++ })
		return fmt.Errorf("%w: %s %s", ErrNotAdmitted, role, id)
	}
	m, err := decodeKV(data)
	if err == nil && m.kind == kvKindSnapshot {
		err = ix.checkSnapshot(m)
	}
	if err != nil {
		ix.count(func(s *KVIndexStats) { s.Refused++ })
		return fmt.Errorf("control: kv events of %s: %w", id, err)
	}
	ix.mu.Lock()
	views := ix.views[tier]
	w := views[id]
	if w == nil {
		w = &WorkerBlocks{}
		views[id] = w
	}
	grant := ix.reserveLocked(id, int64(m.stores()))
	ix.mu.Unlock()
	tell, delta, left, err := w.apply(role, m, grant)
	ix.mu.Lock()
	ix.chargeLocked(id, delta-grant)
	ix.stats.LeftOut += uint64(left)
	ix.mu.Unlock()
	if tell && ix.o.OnStale != nil {
		ix.o.OnStale(role, id)
	}
	if err != nil {
		return fmt.Errorf("control: kv events of %s: %w", id, err)
	}
	return nil
}

func (ix *KVIndex) count(f func(*KVIndexStats)) {
	ix.mu.Lock()
	f(&ix.stats)
	ix.mu.Unlock()
}

// checkSnapshot refuses a snapshot part whose counts no worker within the
// index's caps sends: more parts than a worker's cap holds blocks (every
// part but an empty snapshot's only one carries a hash), or an empty
// part of several. Errors: ErrBadKVMessage, wrapped.
func (ix *KVIndex) checkSnapshot(m kvMessage) error {
	switch {
	case int64(m.parts) > max(ix.workerMaxEnt, 1):
		return fmt.Errorf("%w: a snapshot of %d parts, more than a worker's %d blocks (kv-index-worker-max-bytes)", ErrBadKVMessage, m.parts, ix.workerMaxEnt)
	case m.parts > 1 && len(m.body) == 0:
		return fmt.Errorf("%w: an empty part %d of %d", ErrBadKVMessage, m.part, m.parts)
	}
	return nil
}

// kvEvictSlack is the share of MaxBytes evicted beyond the need, so that
// a full index does not evict at every message.
const kvEvictSlack = 64

// reserveLocked reserves room for up to want new entries of id and
// returns how many it got: within id's cap, and within the global cap
// after evicting from the worker holding the most entries when it holds
// more than id.
func (ix *KVIndex) reserveLocked(id string, want int64) int64 {
	g := min(want, max(ix.workerMaxEnt-ix.byWorker[id], 0))
	if need := ix.entries + g - ix.maxEntries; need > 0 {
		victim, most := "", ix.byWorker[id]
		for v, n := range ix.byWorker {
			if v != id && n > most {
				victim, most = v, n
			}
		}
		if victim != "" {
			// Down to id's share at most: two workers at the cap take
			// turns, neither starves the other.
			k := min(need+ix.maxEntries/kvEvictSlack, most-ix.byWorker[id])
			ix.stats.Evicted += uint64(ix.evictLocked(victim, k))
		}
		g = min(g, max(ix.maxEntries-ix.entries, 0))
	}
	ix.chargeLocked(id, g)
	return g
}

// evictLocked takes up to k entries out of id's views, largest tier
// first, and returns how many it took.
func (ix *KVIndex) evictLocked(id string, k int64) int64 {
	var took int64
	for _, tier := range kvTiers {
		w := ix.views[tier][id]
		if w == nil || took >= k {
			continue
		}
		w.mu.Lock()
		for _, set := range []map[uint64]struct{}{w.set, w.pend} {
			for h := range set {
				if took >= k {
					break
				}
				delete(set, h)
				took++
			}
		}
		w.mu.Unlock()
	}
	ix.chargeLocked(id, -took)
	return took
}

// apply applies m, storing at most grant new entries, and reports whether
// onStale is to be told, the change in the view's entries (set and
// pending snapshot) and the stores left out for want of room.
func (w *WorkerBlocks) apply(role string, m kvMessage, grant int64) (tell bool, delta int64, left int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dropped {
		return false, 0, 0, nil
	}
	before := int64(len(w.set) + len(w.pend))
	defer func() { delta = int64(len(w.set)+len(w.pend)) - before }()
	if w.role != role || w.epoch != m.epoch || w.set == nil {
		// A new worker, or one restarted (a new epoch): nothing known
		// until its snapshot.
		w.role, w.epoch, w.set, w.seq = role, m.epoch, make(map[uint64]struct{}), 0
		w.synced, w.stale, w.asked, w.pend = false, false, false, nil
	}
	room := grant
	switch m.kind {
	case kvKindEvents:
		switch {
		case !w.synced:
			return w.markStale(), 0, 0, nil
		case m.seq <= w.seq:
			return false, 0, 0, nil // in the snapshot already
		case m.seq > w.seq+1:
			w.gaps++
			tell = w.markStale()
		}
		w.seq = m.seq
		eachEvent(m.body, func(h uint64, removed bool) {
			if removed {
				delete(w.set, h)
				return
			}
			if _, ok := w.set[h]; ok {
				return
			}
			if room > 0 {
				w.set[h] = struct{}{}
				room--
			} else {
				left++
			}
		})
	case kvKindSnapshot:
		if w.synced && m.seq < w.seq {
			return false, 0, 0, nil // older than the batches applied
		}
		if m.part == 0 {
			// Sized by what arrived, never by the parts announced.
			w.pend, w.pendSeq, w.pendNext, w.pendParts = make(map[uint64]struct{}, min(int64(len(m.body)/8), grant)), m.seq, 0, m.parts
		}
		if w.pend == nil || m.seq != w.pendSeq || m.part != w.pendNext || m.parts != w.pendParts {
			// A part lost: this snapshot cannot complete.
			w.pend = nil
			return w.markStale(), 0, 0, nil
		}
		for i := 0; i < len(m.body); i += 8 {
			h := binary.LittleEndian.Uint64(m.body[i:])
			if _, ok := w.pend[h]; ok {
				continue
			}
			if room > 0 {
				w.pend[h] = struct{}{}
				room--
			} else {
				left++
			}
		}
		w.pendNext++
		if w.pendNext < w.pendParts {
			break
		}
		w.set, w.seq, w.pend = w.pend, m.seq, nil
		w.synced, w.stale, w.asked = true, false, false
		w.snapshots++
	}
	if left > 0 {
		return tell, 0, left, fmt.Errorf("%d blocks beyond the index's caps left out", left)
	}
	return tell, 0, 0, nil
}

// stores returns how many hashes m may store: an upper bound of the
// entries applying it adds.
func (m kvMessage) stores() int {
	if m.kind == kvKindSnapshot {
		return len(m.body) / 8
	}
	n := 0
	for b := m.body; len(b) > 0; {
		hdr := binary.LittleEndian.Uint32(b)
		c := int(hdr & kvRunMax)
		if hdr&kvRunRemoved == 0 {
			n += c
		}
		b = b[4+c*8:]
	}
	return n
}

// markStale marks the view stale and reports whether this stale period
// is new to onStale.
func (w *WorkerBlocks) markStale() bool {
	w.stale = true
	if w.asked {
		return false
	}
	w.asked = true
	return true
}

// Bounds of WatchKV's queue of one worker's payloads waiting to be
// applied: kvQueueMsgs messages, and in bytes a fifth of the worker's
// cap (a full view's snapshot on the wire: 8 bytes a hash against
// KVIndexEntryBytes an entry), at least kvQueueMinBytes.
const (
	kvQueueMsgs     = 4096
	kvQueueMinBytes = 2 << 20
)

// WatchKV feeds ix with every KV payload published on nc
// (pdserve.kv.<role>.<id>, and .<tier> after it for a worker's host and
// disk tiers) and calls ix.Retain with m's members (admitted ones, when
// ix admits by KVIndexOptions.Admitted) every interval (every > 0), so
// that a worker that left the membership loses its view, and tells
// KVIndexOptions.OnStale of a worker whose payloads it dropped as not
// admitted once it is admitted, until ctx ends or stop is called; then it
// unsubscribes.
//
// One subscription receives every worker's payloads and only sorts them:
// those of ids ix does not admit are dropped unread, the others go to
// their worker's own bounded queue (kvQueueMsgs messages, a fifth of
// KVIndexOptions.WorkerMaxBytes in bytes), applied by a goroutine of the
// worker's. A worker that publishes faster than its payloads are applied
// loses its own (counted in KVIndexStats.QueueFull; its view goes stale
// and heals at a snapshot), never another worker's. A payload that does
// not decode, or whose subject is not one worker's, is dropped and logged
// (log; nil: not logged; not admitted ones at debug level).
//
// It returns once the subscription is registered when nc is connected,
// as Watch does. stop is idempotent and waits for the unsubscription and
// the queues' goroutines. Errors: subscription or flush errors from nats,
// wrapped.
func WatchKV(ctx context.Context, nc *nats.Conn, ix *KVIndex, m *Membership, every time.Duration, log *zap.Logger) (stop func(), err error) {
	if every <= 0 {
		return nil, fmt.Errorf("control: watch kv events: interval %v must be positive", every)
	}
	if log == nil {
		log = zap.NewNop()
	}
	qs := &kvQueues{ix: ix, log: log, byID: map[string]*kvQueue{}, refused: map[string]kvRefusal{}, maxBytes: max(ix.o.WorkerMaxBytes/5, kvQueueMinBytes)}
	sub, err := nc.Subscribe(KVWildcard, qs.handle)
	if err != nil {
		return nil, fmt.Errorf("control: watch kv events: %w", err)
	}
	if nc.IsConnected() {
		fctx, fcancel := context.WithTimeout(ctx, flushTimeout)
		err := nc.FlushWithContext(fctx)
		fcancel()
		if err != nil && nc.IsConnected() {
			_ = sub.Unsubscribe()
			return nil, fmt.Errorf("control: watch kv events: %w", err)
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		// Unsubscribe fails only when it or the connection is closed
		// already: nothing is left to undo.
		defer func() {
			_ = sub.Unsubscribe()
			qs.closeAll()
		}()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				live := map[string]bool{}
				for _, hb := range m.All() {
					if ix.o.Admitted == nil || ix.o.Admitted(hb.Role, hb.ID) {
						live[hb.ID] = true
					}
				}
				ix.Retain(func(id string) bool { return live[id] })
				qs.retain(live)
				if ix.o.Admitted != nil && ix.o.OnStale != nil {
					// Their first snapshot was dropped: ask for another.
					for _, w := range qs.admitted() {
						ix.o.OnStale(w[0], w[1])
					}
				}
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}, nil
}

// kvQueues sorts KV payloads into per-worker queues (WatchKV).
type kvQueues struct {
	ix       *KVIndex
	log      *zap.Logger
	maxBytes int64 // of one queue

	mu     sync.Mutex
	byID   map[string]*kvQueue
	closed bool
	// refused are the workers whose payloads were dropped as not
	// admitted lately (at most kvRefusedMax): once admitted, OnStale is
	// told of them (admitted).
	refused map[string]kvRefusal
	wg      sync.WaitGroup
}

// kvRefusal is a worker whose payloads were dropped as not admitted, in
// role, ticks retain ticks ago.
type kvRefusal struct {
	role  string
	ticks int
}

// kvRefusedMax bounds the workers kvQueues remembers as refused;
// kvRefusedTicks is how many retain ticks it remembers one.
const (
	kvRefusedMax   = 4096
	kvRefusedTicks = 8
)

// admitted returns the workers refused before that ix admits now, in the
// role they were refused in, and forgets them, and those refused
// kvRefusedTicks ticks ago.
func (qs *kvQueues) admitted() [][2]string {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	var out [][2]string
	for id, r := range qs.refused {
		switch {
		case qs.ix.o.Admitted(r.role, id):
			out = append(out, [2]string{r.role, id})
			delete(qs.refused, id)
		case r.ticks >= kvRefusedTicks:
			delete(qs.refused, id)
		default:
			r.ticks++
			qs.refused[id] = r
		}
	}
	return out
}

// kvQueue is one worker's payloads waiting to be applied.
type kvQueue struct {
	ch    chan kvItem
	bytes int64 // of the payloads in ch; kvQueues.mu
}

type kvItem struct {
	role, id, tier string
	data           []byte
}

// handle runs on the subscription's goroutine: cheap, never blocks.
func (qs *kvQueues) handle(msg *nats.Msg) {
	role, id, ok := strings.Cut(strings.TrimPrefix(msg.Subject, kvPrefix), ".")
	id, tier, _ := strings.Cut(id, ".")
	if !ok || ValidToken(role) != nil || ValidToken(id) != nil || !validKVTier(tier) {
		qs.ix.count(func(s *KVIndexStats) { s.Refused++ })
		qs.log.Warn("kv events refused", zap.String("subject", msg.Subject), zap.String("reason", "not a worker's subject"))
		return
	}
	if a := qs.ix.o.Admitted; a != nil && !a(role, id) {
		qs.ix.count(func(s *KVIndexStats) { s.NotAdmitted++ })
		qs.log.Debug("kv events refused", zap.String("subject", msg.Subject), zap.String("reason", "not an admitted worker"))
		qs.mu.Lock()
		if _, ok := qs.refused[id]; ok || len(qs.refused) < kvRefusedMax {
			qs.refused[id] = kvRefusal{role: role}
		}
		qs.mu.Unlock()
		return
	}
	n := int64(len(msg.Data))
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.closed {
		return
	}
	q := qs.byID[id]
	if q == nil {
		q = &kvQueue{ch: make(chan kvItem, kvQueueMsgs)}
		qs.byID[id] = q
		qs.wg.Go(func() { qs.drain(q) })
	}
	if q.bytes+n > qs.maxBytes {
		qs.ix.count(func(s *KVIndexStats) { s.QueueFull++ })
		return
	}
	select {
	case q.ch <- kvItem{role: role, id: id, tier: tier, data: msg.Data}:
		q.bytes += n
	default:
		qs.ix.count(func(s *KVIndexStats) { s.QueueFull++ })
	}
}

// drain applies q's payloads until q is closed.
func (qs *kvQueues) drain(q *kvQueue) {
	for it := range q.ch {
		qs.mu.Lock()
		q.bytes -= int64(len(it.data))
		qs.mu.Unlock()
		if err := qs.ix.ApplyTier(it.role, it.id, it.tier, it.data); err != nil && !errors.Is(err, ErrNotAdmitted) {
			qs.log.Warn("kv events refused", zap.String("subject", KVTierSubject(it.role, it.id, it.tier)), zap.Error(err))
		}
	}
}

// retain closes the queues of ids not in live.
func (qs *kvQueues) retain(live map[string]bool) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	for id, q := range qs.byID {
		if !live[id] {
			close(q.ch)
			delete(qs.byID, id)
		}
	}
}

// closeAll closes every queue and waits for their goroutines.
func (qs *kvQueues) closeAll() {
	qs.mu.Lock()
	qs.closed = true
	for id, q := range qs.byID {
		close(q.ch)
		delete(qs.byID, id)
	}
	qs.mu.Unlock()
	qs.wg.Wait()
}
