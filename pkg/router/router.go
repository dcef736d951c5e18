package router

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"
)

// Errors returned by Route, wrapped with detail; match with errors.Is.
var (
	// ErrNoDecodeWorkers: no decode (or colocated) worker is available.
	ErrNoDecodeWorkers = errors.New("router: no decode worker available")
	// ErrNoPrefillWorkers: remote prefill is needed and no prefill worker is available.
	ErrNoPrefillWorkers = errors.New("router: no prefill worker available")
	// ErrNoCapacity: workers exist but all are full (prefill queues at their limit).
	ErrNoCapacity = errors.New("router: no worker has capacity")
)

// Worker is a snapshot of one worker, as its latest heartbeat told it.
type Worker struct {
	ID                  string
	Addr                string // gRPC address
	KVBlocksFree        int
	KVBlocksTotal       int
	QueuedPrefillTokens int
	RunningBatch        int
	// PrefixDigest holds the hashes of the prompt-prefix blocks the worker
	// has cached (chained block hashes, see pkg/kv.HashBlocks). Read only.
	PrefixDigest []uint64
	Draining     bool
	// Model is the model the worker serves; empty serves any.
	Model string
	// Time is when the snapshot was taken (the worker's clock).
	Time time.Time
}

// Config tunes the router. The zero value routes every prompt to a remote
// prefill worker, with no prefix scoring and unbounded prefill queues.
type Config struct {
	// Colocated: every request prefills on its decode (colocated) worker.
	Colocated bool
	// LocalPrefillBelowTokens: in disaggregated mode, a prompt whose
	// uncached tokens (prompt minus the decode worker's prefix-cache hit)
	// are fewer than this prefills on the decode worker. 0 = never.
	LocalPrefillBelowTokens int
	// MaxQueuedPrefillTokens: a prefill worker whose queued tokens (its
	// heartbeat's plus this router's later assignments) reach this takes
	// no more requests. 0 = unbounded.
	MaxQueuedPrefillTokens int
	// PrefixWeight: queued tokens that one token of prefix-cache hit is
	// worth when comparing prefill workers. 0 = ignore prefix caches.
	PrefixWeight float64
	// BlockTokens: tokens per KV block, for estimating the blocks a
	// request takes and the tokens a prefix hash covers. ≤ 0 means 16.
	BlockTokens int
}

// Request is what the router needs to know about a request.
type Request struct {
	ID           string
	PromptTokens int // > 0
	MaxTokens    int // ≥ 0
	// PrefixHashes are the chained hashes of the prompt's full blocks, in
	// order (pkg/kv.HashBlocks with Config.BlockTokens); nil disables
	// prefix matching for this request. Read only.
	PrefixHashes []uint64
	// DecodeOnly chooses a decode worker only (a recovery, where the KV
	// comes from the prefill worker that already holds it): Local and
	// Prefill of the Decision stay zero.
	DecodeOnly bool
	// Local prefills on the decode worker whatever the prompt's size (the
	// request needs the prompt's logits there: prompt logprobs).
	Local bool
	// Model, when not empty, limits the choice to workers serving it (or
	// any model).
	Model string
}

// Decision is where a request goes.
type Decision struct {
	Decode Worker
	// Local: the decode worker prefills the prompt itself; Prefill is zero.
	Local   bool
	Prefill Worker
	// PrefixHitTokens is the predicted prefix-cache hit on the worker that
	// prefills (tokens).
	PrefixHitTokens int
}

// assignment is this router's record of one routed request.
type assignment struct {
	at            time.Time
	decode        string
	blocks        int
	prefill       string // "" when local or prefill done
	prefillTokens int
}

// Router chooses workers; see the package doc.
type Router struct {
	cfg Config

	mu       sync.Mutex
	inflight map[string]assignment // by request id
}

// New returns a Router with cfg.
func New(cfg Config) *Router {
	if cfg.BlockTokens <= 0 {
		cfg.BlockTokens = 16
	}
	return &Router{cfg: cfg, inflight: make(map[string]assignment)}
}

// Route chooses the workers of req at time now among the given snapshots
// (decode: role decode, or colocated in colocated mode; prefill: role
// prefill, ignored in colocated mode). Workers whose id is in exclude are
// skipped (the caller's failed attempts). On success the assignment is
// recorded under req.ID, replacing an earlier one of the same id; call
// Done when the request ends. The slices are read, not kept.
//
// Errors: ErrNoDecodeWorkers, ErrNoPrefillWorkers, ErrNoCapacity.
func (r *Router) Route(now time.Time, req Request, decode, prefill []Worker, exclude map[string]bool) (Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inflight, req.ID)

	decode, prefill = serving(decode, req.Model), serving(prefill, req.Model)
	loads := r.loads(decode, prefill)
	d, ok := r.pickDecode(decode, exclude, loads)
	if !ok {
		return Decision{}, fmt.Errorf("%w (%d known, %d excluded)", ErrNoDecodeWorkers, len(decode), len(exclude))
	}
	dec := Decision{Decode: d}
	a := assignment{at: now, decode: d.ID, blocks: r.blocksFor(req.PromptTokens + req.MaxTokens)}

	hitDecode := r.prefixHit(req.PrefixHashes, d.PrefixDigest)
	switch {
	case req.DecodeOnly:
	case r.cfg.Colocated, req.Local:
		dec.Local, dec.PrefixHitTokens = true, hitDecode
	case r.cfg.LocalPrefillBelowTokens > 0 && req.PromptTokens-hitDecode < r.cfg.LocalPrefillBelowTokens:
		dec.Local, dec.PrefixHitTokens = true, hitDecode
	default:
		p, hit, err := r.pickPrefill(req, prefill, exclude, loads)
		if err != nil {
			return Decision{}, err
		}
		dec.Prefill, dec.PrefixHitTokens = p, hit
		a.prefill, a.prefillTokens = p.ID, req.PromptTokens-hit
	}
	r.inflight[req.ID] = a
	return dec, nil
}

// serving returns the workers of ws that serve model (all when model is
// empty), in order; ws itself when all do.
func serving(ws []Worker, model string) []Worker {
	if model == "" || !slices.ContainsFunc(ws, func(w Worker) bool { return w.Model != "" && w.Model != model }) {
		return ws
	}
	out := make([]Worker, 0, len(ws))
	for _, w := range ws {
		if w.Model == "" || w.Model == model {
			out = append(out, w)
		}
	}
	return out
}

// PrefillDone records that req's prefill finished, so its prompt no longer
// counts as queued on its prefill worker. Unknown ids are ignored.
func (r *Router) PrefillDone(requestID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a, ok := r.inflight[requestID]; ok {
		a.prefill, a.prefillTokens = "", 0
		r.inflight[requestID] = a
	}
}

// Done forgets the assignment of a request that ended (or whose routing is
// abandoned). Unknown ids are ignored.
func (r *Router) Done(requestID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inflight, requestID)
}

// InFlight returns the number of requests with a recorded assignment.
func (r *Router) InFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.inflight)
}

// load is a worker's snapshot plus this router's assignments made after it.
type load struct {
	free, batch, queued int
}

// loads returns the load of every listed worker by id, in one pass over
// the assignments: O(workers + assignments).
func (r *Router) loads(lists ...[]Worker) map[string]load {
	type entry struct {
		l  load
		at time.Time
	}
	m := make(map[string]*entry)
	for _, ws := range lists {
		for _, w := range ws {
			m[w.ID] = &entry{l: load{free: w.KVBlocksFree, batch: w.RunningBatch, queued: w.QueuedPrefillTokens}, at: w.Time}
		}
	}
	for _, a := range r.inflight {
		// An assignment made before a snapshot is already reflected in it.
		if e, ok := m[a.decode]; ok && a.at.After(e.at) {
			e.l.free -= a.blocks
			e.l.batch++
		}
		if e, ok := m[a.prefill]; ok && a.prefill != "" && a.at.After(e.at) {
			e.l.queued += a.prefillTokens
		}
	}
	out := make(map[string]load, len(m))
	for id, e := range m {
		out[id] = e.l
	}
	return out
}

func (r *Router) pickDecode(ws []Worker, exclude map[string]bool, loads map[string]load) (Worker, bool) {
	type cand struct {
		w Worker
		l load
	}
	var cs []cand
	for _, w := range ws {
		if w.Draining || exclude[w.ID] {
			continue
		}
		cs = append(cs, cand{w, loads[w.ID]})
	}
	if len(cs) == 0 {
		return Worker{}, false
	}
	sort.Slice(cs, func(i, j int) bool {
		a, b := cs[i], cs[j]
		if a.l.free != b.l.free {
			return a.l.free > b.l.free
		}
		if a.l.batch != b.l.batch {
			return a.l.batch < b.l.batch
		}
		return a.w.ID < b.w.ID
	})
	return cs[0].w, true
}

func (r *Router) pickPrefill(req Request, ws []Worker, exclude map[string]bool, loads map[string]load) (Worker, int, error) {
	type cand struct {
		w     Worker
		score float64
		hit   int
	}
	var cs []cand
	known := 0
	for _, w := range ws {
		if w.Draining || exclude[w.ID] {
			continue
		}
		known++
		l := loads[w.ID]
		if r.cfg.MaxQueuedPrefillTokens > 0 && l.queued >= r.cfg.MaxQueuedPrefillTokens {
			continue
		}
		c := cand{w: w, score: float64(l.queued)}
		if r.cfg.PrefixWeight > 0 {
			c.hit = r.prefixHit(req.PrefixHashes, w.PrefixDigest)
			c.score -= r.cfg.PrefixWeight * float64(c.hit)
		}
		cs = append(cs, c)
	}
	if known == 0 {
		return Worker{}, 0, fmt.Errorf("%w (%d known)", ErrNoPrefillWorkers, len(ws))
	}
	if len(cs) == 0 {
		return Worker{}, 0, fmt.Errorf("%w: all %d prefill workers have ≥ %d queued tokens", ErrNoCapacity, known, r.cfg.MaxQueuedPrefillTokens)
	}
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].score != cs[j].score {
			return cs[i].score < cs[j].score
		}
		return cs[i].w.ID < cs[j].w.ID
	})
	return cs[0].w, cs[0].hit, nil
}

// prefixHit returns the tokens of the longest prefix of hashes found in
// digest. Hashes are chained, so the match stops at the first miss.
func (r *Router) prefixHit(hashes, digest []uint64) int {
	if len(hashes) == 0 || len(digest) == 0 {
		return 0
	}
	set := make(map[uint64]struct{}, len(digest))
	for _, h := range digest {
		set[h] = struct{}{}
	}
	n := 0
	for _, h := range hashes {
		if _, ok := set[h]; !ok {
			break
		}
		n++
	}
	return n * r.cfg.BlockTokens
}

func (r *Router) blocksFor(tokens int) int {
	if tokens <= 0 {
		return 0
	}
	return (tokens + r.cfg.BlockTokens - 1) / r.cfg.BlockTokens
}
