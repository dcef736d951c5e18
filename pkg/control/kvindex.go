package control

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// DefaultKVIndexMaxBlocks bounds the blocks KVIndex holds of one worker:
// 4Mi blocks are 64Mi tokens at 16 tokens a block, beyond any engine's
// KV memory today.
const DefaultKVIndexMaxBlocks = 1 << 22

// KVIndex is the coordinator's view of the blocks every worker's prefix
// cache holds, built from the workers' KV events and snapshots (Apply).
// A worker's view starts at its first snapshot; from then on each events
// batch of the next sequence number is applied. A gap (a batch lost)
// marks the view stale: later batches are still applied (every report is
// a hash's new state, so only the lost batch's hashes may be wrong), and
// the next snapshot replaces it. Memory: one map entry per block a worker
// holds, at most maxBlocks each. Safe for concurrent use.
type KVIndex struct {
	maxBlocks int
	// onStale is told once per stale period of a worker, without locks
	// held; nil: nobody.
	onStale func(role, id string)

	mu sync.Mutex
	// views are the workers' views by tier (kvTiers: "" the engine
	// tier, KVTierHost, KVTierDisk), then by id.
	views map[string]map[string]*WorkerBlocks
}

// NewKVIndex returns an empty index holding at most maxBlocks (> 0)
// blocks of each worker. onStale (nil: none) is called, once per stale
// period, when a worker's view has a gap or no snapshot yet: the caller
// may ask the worker for one (CmdKVSnapshot). It runs on Apply's
// goroutine and must not block or call the index.
func NewKVIndex(maxBlocks int, onStale func(role, id string)) *KVIndex {
	ix := &KVIndex{maxBlocks: maxBlocks, onStale: onStale, views: make(map[string]map[string]*WorkerBlocks, len(kvTiers))}
	for _, tier := range kvTiers {
		ix.views[tier] = make(map[string]*WorkerBlocks)
	}
	return ix
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
	// pend gathers a snapshot's parts: of pendSeq, next part pendNext
	// of pendParts; nil when none is under way.
	pend                map[uint64]struct{}
	pendSeq             uint64
	pendNext, pendParts int
	gaps, snapshots     uint64
	// overflowed: the message being applied met the bound.
	overflowed bool
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
	return KVWorkerState{Blocks: len(w.set), Seq: w.seq, Synced: w.synced, Stale: w.stale, Gaps: w.gaps, Snapshots: w.snapshots}
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
				delete(m, id)
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
		delete(m, id)
	}
}

// Apply applies one KV payload received from worker id of role (the
// subject's tokens). Errors: ErrBadKVMessage (the payload is refused and
// changes nothing), or a view beyond the index's bound (the blocks beyond
// it are left out), wrapped.
func (ix *KVIndex) Apply(role, id string, data []byte) error { return ix.ApplyTier(role, id, "", data) }

// ApplyTier is Apply for one tier of the worker's cache: "" (the engine
// tier, as Apply), KVTierHost or KVTierDisk. A stale view of any tier
// tells onStale of the worker (the snapshot it asks for covers every
// tier). Errors: as Apply's, and an unknown tier.
func (ix *KVIndex) ApplyTier(role, id, tier string, data []byte) error {
	if !validKVTier(tier) {
		return fmt.Errorf("control: kv events of %s: unknown tier %q", id, tier)
	}
	m, err := decodeKV(data)
	if err != nil {
		return fmt.Errorf("control: kv events of %s: %w", id, err)
	}
	ix.mu.Lock()
	views := ix.views[tier]
	w := views[id]
	if w == nil {
		w = &WorkerBlocks{}
		views[id] = w
	}
	ix.mu.Unlock()
	tell, err := w.apply(role, m, ix.maxBlocks)
	if tell && ix.onStale != nil {
		ix.onStale(role, id)
	}
	if err != nil {
		return fmt.Errorf("control: kv events of %s: %w", id, err)
	}
	return nil
}

// apply applies m and reports whether onStale is to be told.
func (w *WorkerBlocks) apply(role string, m kvMessage, maxBlocks int) (tell bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.role != role || w.epoch != m.epoch || w.set == nil {
		// A new worker, or one restarted (a new epoch): nothing known
		// until its snapshot.
		w.role, w.epoch, w.set, w.seq = role, m.epoch, make(map[uint64]struct{}), 0
		w.synced, w.stale, w.asked, w.pend = false, false, false, nil
	}
	switch m.kind {
	case kvKindEvents:
		switch {
		case !w.synced:
			return w.markStale(), nil
		case m.seq <= w.seq:
			return false, nil // in the snapshot already
		case m.seq > w.seq+1:
			w.gaps++
			tell = w.markStale()
		}
		w.seq = m.seq
		eachEvent(m.body, func(h uint64, removed bool) {
			if removed {
				delete(w.set, h)
			} else if len(w.set) < maxBlocks {
				w.set[h] = struct{}{}
			} else {
				w.overflowed = true
			}
		})
	case kvKindSnapshot:
		if w.synced && m.seq < w.seq {
			return false, nil // older than the batches applied
		}
		if m.part == 0 {
			w.pend, w.pendSeq, w.pendNext, w.pendParts = make(map[uint64]struct{}, len(m.body)/8*m.parts), m.seq, 0, m.parts
		}
		if w.pend == nil || m.seq != w.pendSeq || m.part != w.pendNext || m.parts != w.pendParts {
			// A part lost: this snapshot cannot complete.
			w.pend = nil
			return w.markStale(), nil
		}
		for i := 0; i < len(m.body); i += 8 {
			if len(w.pend) >= maxBlocks {
				w.overflowed = true
				break
			}
			w.pend[binary.LittleEndian.Uint64(m.body[i:])] = struct{}{}
		}
		w.pendNext++
		if w.pendNext < w.pendParts {
			return false, nil
		}
		w.set, w.seq, w.pend = w.pend, m.seq, nil
		w.synced, w.stale, w.asked = true, false, false
		w.snapshots++
	}
	if w.overflowed {
		w.overflowed = false
		return tell, fmt.Errorf("more than %d blocks; the rest are left out", maxBlocks)
	}
	return tell, nil
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

// WatchKV feeds ix with every KV payload published on nc
// (pdserve.kv.<role>.<id>, and .<tier> after it for a worker's host and
// disk tiers) and calls ix.Retain with m's members every interval
// (every > 0), so that a worker that left the membership loses its view,
// until ctx ends or stop is called; then it unsubscribes. A payload that
// does not decode, or whose subject is not one worker's, is dropped and
// logged (log; nil: not logged). It returns once the subscription is
// registered when nc is connected, as Watch does. stop is idempotent and
// waits for the unsubscription. Errors: subscription or flush errors from
// nats, wrapped.
func WatchKV(ctx context.Context, nc *nats.Conn, ix *KVIndex, m *Membership, every time.Duration, log *zap.Logger) (stop func(), err error) {
	if every <= 0 {
		return nil, fmt.Errorf("control: watch kv events: interval %v must be positive", every)
	}
	if log == nil {
		log = zap.NewNop()
	}
	sub, err := nc.Subscribe(KVWildcard, func(msg *nats.Msg) {
		role, id, ok := strings.Cut(strings.TrimPrefix(msg.Subject, kvPrefix), ".")
		id, tier, _ := strings.Cut(id, ".")
		if !ok || ValidToken(role) != nil || ValidToken(id) != nil || !validKVTier(tier) {
			log.Warn("kv events refused", zap.String("subject", msg.Subject), zap.String("reason", "not a worker's subject"))
			return
		}
		if err := ix.ApplyTier(role, id, tier, msg.Data); err != nil {
			log.Warn("kv events refused", zap.String("subject", msg.Subject), zap.Error(err))
		}
	})
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
		defer func() { _ = sub.Unsubscribe() }()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				live := map[string]bool{}
				for _, hb := range m.All() {
					live[hb.ID] = true
				}
				ix.Retain(func(id string) bool { return live[id] })
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}, nil
}
