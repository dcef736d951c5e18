package router

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pdserve/pdserve/pkg/router/plugins/batchload"
	"github.com/pdserve/pdserve/pkg/router/plugins/batchroom"
	"github.com/pdserve/pdserve/pkg/router/plugins/contextlen"
	"github.com/pdserve/pdserve/pkg/router/plugins/draining"
	"github.com/pdserve/pdserve/pkg/router/plugins/excluded"
	"github.com/pdserve/pdserve/pkg/router/plugins/kvpressure"
	"github.com/pdserve/pdserve/pkg/router/plugins/kvroom"
	"github.com/pdserve/pdserve/pkg/router/plugins/maxscore"
	"github.com/pdserve/pdserve/pkg/router/plugins/modelmatch"
	"github.com/pdserve/pdserve/pkg/router/plugins/prefixoverlap"
	"github.com/pdserve/pdserve/pkg/router/plugins/queuedtokens"
	"github.com/pdserve/pdserve/pkg/router/plugins/queuelimit"
	"github.com/pdserve/pdserve/pkg/router/plugins/roundrobin"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
	"github.com/prometheus/client_golang/prometheus"
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

// Weights are the weights (≥ 0) of the scorers of one profile: a
// candidate's total is Σ weight × score, each score in [0, 1] (see the
// plugins' contracts). All zero means the profile's defaults.
type Weights struct {
	Prefix float64 // plugins/prefixoverlap: share of the prompt's blocks cached
	Queue  float64 // plugins/queuedtokens: queued prefill tokens
	KV     float64 // plugins/kvpressure: share of KV blocks free
	Batch  float64 // plugins/batchload: running batch
}

// Default weights, used for a profile whose Weights are all zero:
// prefix-aware routing. Decode workers by their cached prefix and free KV,
// the running batch only breaking near ties; prefill workers by their
// cached prefix and queued tokens. The prefix weights are the best of a
// sweep on the Mooncake trace (loadtest/results/router-weights/).
// Least-loaded routing is LeastLoadedDecodeWeights and
// LeastLoadedPrefillWeights (prefix caches ignored); round-robin is
// PickerRoundRobin.
var (
	DefaultDecodeWeights  = Weights{Prefix: 1, KV: 1, Batch: 0.01}
	DefaultPrefillWeights = Weights{Prefix: 4, Queue: 1}
)

// Least-loaded weights: the defaults without the prefix scorers (the
// router's defaults before prefix-aware routing).
var (
	LeastLoadedDecodeWeights  = Weights{KV: 1, Batch: 0.01}
	LeastLoadedPrefillWeights = Weights{Queue: 1}
)

// Config tunes the router. The zero value routes every prompt to a remote
// prefill worker, with the default (prefix-aware) weights, unbounded
// prefill queues and no metrics.
type Config struct {
	// Colocated: every request prefills on its decode (colocated) worker.
	Colocated bool
	// RecentTTL is how long an ended request's prompt counts as held by
	// its workers before their KV events or digests say so ("Recent
	// prompts"); ≤ 0: not at all.
	RecentTTL time.Duration
	// LocalPrefillBelowTokens: in disaggregated mode, a prompt whose
	// uncached tokens (prompt minus the decode worker's prefix-cache hit)
	// are fewer than this prefills on the decode worker. 0 = never.
	// Decider rule 1.
	LocalPrefillBelowTokens int
	// PrefillQueueLocalTokens and BusyLocalPrefillBelowTokens: when every
	// prefill worker has at least PrefillQueueLocalTokens queued, a prompt
	// whose uncached tokens are fewer than BusyLocalPrefillBelowTokens
	// prefills on the decode worker. 0 = never. Decider rule 2.
	PrefillQueueLocalTokens     int
	BusyLocalPrefillBelowTokens int
	// MaxQueuedPrefillTokens: a prefill worker whose queued tokens (its
	// heartbeat's plus this router's later assignments) reach this takes
	// no more requests (plugins/queuelimit). 0 = unbounded.
	MaxQueuedPrefillTokens int
	// Decode and Prefill weigh the scorers of the two profiles; zero
	// values take DefaultDecodeWeights and DefaultPrefillWeights.
	Decode, Prefill Weights
	// Picker chooses among the scored candidates in both profiles:
	// PickerMaxScore ("" too: the highest total, plugins/maxscore) or
	// PickerRoundRobin (in turn by worker id, plugins/roundrobin, a
	// baseline; the profiles then run no scorers, so Decode and Prefill
	// weigh nothing). Any other value makes New panic (the policy
	// validates it first).
	Picker string
	// DecodeProfile and PrefillProfile, when not nil, replace the
	// profiles built from the fields above (Decode, Prefill,
	// MaxQueuedPrefillTokens, Picker).
	DecodeProfile, PrefillProfile *Profile
	// BlockTokens: tokens per KV block, for estimating the blocks a
	// request takes and the tokens a prefix hash covers. ≤ 0 means
	// vocab.DefaultBlockTokens.
	BlockTokens int
	// HostCost is the time a worker takes to load a block from its
	// prefix cache's host tier over the time to compute it, which the
	// prefix scorer charges (plugins/prefixoverlap); 0 means
	// prefixoverlap.DefaultHostCost.
	HostCost float64
	// DiskCost is the time a worker takes to read a block from its
	// prefix cache's disk tier (and load it over the host link) over the
	// time to compute it; 0 means prefixoverlap.DefaultDiskCost.
	DiskCost float64
	// Registerer, when not nil, gets the router's metrics:
	// pdserve_router_plugin_duration_seconds{profile,plugin,kind} (every
	// plugin call, timed by the framework) and
	// pdserve_router_decisions_total{placement}. A collector already
	// registered there by another Router is shared.
	Registerer prometheus.Registerer
	// Clock reads the time for plugin durations only (routing decisions
	// take their time as Route's argument); nil is time.Now. Unused
	// without a Registerer.
	Clock func() time.Time
}

// Pickers, the values of Config.Picker.
const (
	PickerMaxScore   = "maxscore"
	PickerRoundRobin = "roundrobin"
)

// DefaultProfiles returns the profiles New builds from cfg: decode
// filters draining, excluded, model, context, then kvroom and batchroom; prefill
// filters draining, excluded, model, context, then queuelimit; scorers prefix, queue, kv,
// batch with the configured weights (kv is not used for prefill: prefill
// workers report no KV); the picker of cfg.Picker (with
// PickerRoundRobin, one per profile and no scorers). It panics on an
// unknown cfg.Picker.
func DefaultProfiles(cfg Config) (decode, prefill Profile) {
	switch cfg.Picker {
	case "", PickerMaxScore, PickerRoundRobin:
	default:
		panic(fmt.Sprintf("router: unknown picker %q", cfg.Picker))
	}
	dw, pw := cfg.Decode, cfg.Prefill
	if dw == (Weights{}) {
		dw = DefaultDecodeWeights
	}
	if pw == (Weights{}) {
		pw = DefaultPrefillWeights
	}
	eligible := []Filter{&draining.Filter{}, &excluded.Filter{}, &modelmatch.Filter{}, &contextlen.Filter{}}
	scorers := func(w Weights) []WeightedScorer {
		return []WeightedScorer{
			{&prefixoverlap.Scorer{HostCost: cfg.HostCost, DiskCost: cfg.DiskCost}, w.Prefix}, {&queuedtokens.Scorer{}, w.Queue},
			{&kvpressure.Scorer{}, w.KV}, {&batchload.Scorer{}, w.Batch},
		}
	}
	decode = Profile{Filters: eligible, Capacity: []Filter{&kvroom.Filter{}, &batchroom.Filter{}}, Scorers: scorers(dw)}
	ps := scorers(pw)
	ps[2].Weight = 0
	prefill = Profile{Filters: eligible, Capacity: []Filter{&queuelimit.Filter{Max: cfg.MaxQueuedPrefillTokens}}, Scorers: ps}
	if cfg.Picker == PickerRoundRobin {
		decode.Scorers, decode.Picker = nil, &roundrobin.Picker{}
		prefill.Scorers, prefill.Picker = nil, &roundrobin.Picker{}
	}
	return decode, prefill
}

// Decision is where a request goes: the whole routing decision of one
// placement.
type Decision struct {
	Decode Worker
	// Local: the decode worker prefills the prompt itself; Prefill is zero.
	Local   bool
	Prefill Worker
	// PrefixHitTokens is the predicted prefix-cache hit on the worker that
	// prefills (tokens).
	PrefixHitTokens int
	// Peer is the pull the worker that prefills (Prefill; Decode when
	// Local or for a DecodeOnly request) may make of the prompt's prefix
	// instead of computing it; zero: none.
	Peer Pull
	// LocalPeer is the pull the decode worker would make if it prefilled
	// (Peer when Local): what Revise puts in Peer.
	LocalPeer Pull
	// ShortBelow is Decider rule 1's threshold (tokens; 0: off) that
	// Revise applies to the decode worker's real hit.
	ShortBelow int
}

// Pull is a prefix pull: From holds the prompt's first Tokens tokens (its
// leading full blocks, in any tier of its cache: engine, host, disk),
// more than the worker that would pull holds itself. From.ID "": none.
type Pull struct {
	From   Worker
	Tokens int
}

// Revise revisits a remote-prefill decision once its decode worker's
// Reserve answered its real prefix hit: hitTokens of the request's
// promptTokens are cached there. The router decided on its estimate (the
// KV-event index or a digest, which lag); when the real uncached rest is
// short by Decider rule 1 (dec.ShortBelow), the prompt prefills on the
// decode worker instead: Revise returns dec with Local set, Prefill and
// the predicted hit cleared (the estimate was of the prefill worker's
// cache) and Peer the decode worker's (dec.LocalPeer), and true.
// Otherwise, or for a decision already local, it returns dec and false.
// It is pure; the caller tells the Router with Revised.
func Revise(dec Decision, promptTokens, hitTokens int) (Decision, bool) {
	if dec.Local || dec.Prefill.ID == "" || !(Decider{LocalPrefillBelowTokens: dec.ShortBelow}).Short(promptTokens-hitTokens) {
		return dec, false
	}
	dec.Local, dec.Prefill, dec.PrefixHitTokens, dec.Peer = true, Worker{}, 0, dec.LocalPeer
	return dec, true
}

// Placements, the values of pdserve_router_decisions_total's label.
const (
	PlacementRemote     = "remote"      // a prefill worker prefills
	PlacementLocalShort = "local_short" // Decider rule 1
	PlacementLocalBusy  = "local_busy"  // Decider rule 2
	// PlacementLocalReserved: routed remote on the estimated hit, made
	// local by Decider rule 1 on the decode worker's real hit (Reserved).
	PlacementLocalReserved = "local_reserved"
	PlacementLocal         = "local"       // colocated mode or Request.Local
	PlacementDecodeOnly    = "decode_only" // Request.DecodeOnly
)

// assignment is this router's record of one routed request.
type assignment struct {
	at            time.Time
	decode        string
	blocks        int
	prefill       string // "" when local or prefill done
	prefillTokens int
	// prefilledOn is the prefill worker chosen (kept when prefill ends),
	// and hashes the request's leading block hashes (at most
	// recentMaxHashes): on Done both workers are taken to hold them
	// (recent) until their KV events can say so.
	prefilledOn string
	hashes      []uint64
}

// Recent prompts: a request that ended leaves its prompt's blocks in its
// workers' caches, which the workers' KV events (or digests) report only
// at their next publication, tens of milliseconds later. An agent's next
// turn, or a client's follow-up, often comes sooner and would find the
// router blind to the prefix it was built on. So Done records the ended
// request's block hashes as held by its decode (and prefill) worker, for
// Config.RecentTTL after the request was routed (DefaultRecentTTL is the
// coordinator's default), at most recentPerWorker prompts
// a worker, and the engine-memory hit of a worker is the larger of what
// its index says and these. A guess that turned out wrong (the worker
// evicted the prompt) costs one route; Reserve stays the authority.
const (
	DefaultRecentTTL = 10 * time.Second
	recentPerWorker  = 16
	recentMaxHashes  = 4096
)

// recentPrompt is an ended request's prompt, by its block hashes.
type recentPrompt struct {
	at     time.Time
	hashes []uint64
}

// Router chooses workers; see the package doc.
type Router struct {
	cfg             Config
	decider         Decider
	decode, prefill *profile
	timer           *timer // nil: plugins are not timed
	decisions       *prometheus.CounterVec

	mu       sync.Mutex
	inflight map[string]assignment     // by request id
	recent   map[string][]recentPrompt // by worker id, oldest first
	now      time.Time                 // Route's, for recent; under mu
	// Scratch buffers of Route, under mu.
	dbuf, pbuf     []Candidate
	scores, totals []float64
	queued         []int
	hashIdx        map[uint64]int
	marks          []bool
	hashes         []uint64 // the request's, for Worker.Prefix
	deep           [2]depth // the two deepest holders of the request's prefix
	served         prefixoverlap.Scorer
}

// New returns a Router with cfg. It panics if cfg.Registerer refuses the
// router's metrics for a reason other than their being registered
// already (a programming error: a clashing metric).
func New(cfg Config) *Router {
	if cfg.BlockTokens <= 0 {
		cfg.BlockTokens = vocab.DefaultBlockTokens
	}
	r := &Router{cfg: cfg, inflight: make(map[string]assignment), recent: make(map[string][]recentPrompt), hashIdx: make(map[uint64]int),
		served: prefixoverlap.Scorer{HostCost: cfg.HostCost, DiskCost: cfg.DiskCost},
		decider: Decider{LocalPrefillBelowTokens: cfg.LocalPrefillBelowTokens,
			PrefillQueueLocalTokens: cfg.PrefillQueueLocalTokens, BusyLocalPrefillBelowTokens: cfg.BusyLocalPrefillBelowTokens}}
	if cfg.Registerer != nil {
		clock := cfg.Clock
		if clock == nil {
			clock = time.Now
		}
		r.timer = &timer{clock: clock, hist: register(cfg.Registerer, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "pdserve", Name: "router_plugin_duration_seconds",
			Help:    "Time of one call of a router plugin (filter, scorer or picker), by profile (decode, prefill).",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 8), // 1µs … 16ms
		}, []string{"profile", "plugin", "kind"}))}
		r.decisions = register(cfg.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pdserve", Name: "router_decisions_total",
			Help: "Requests routed, by where their prompt prefills: remote, local_short (few uncached tokens), local_busy (prefill pool busy), local_reserved (few uncached tokens by the decode worker's Reserve, routed remote on the estimate), local (colocated or required), decode_only (recovery).",
		}, []string{"placement"}))
	}
	d, p := DefaultProfiles(cfg)
	if cfg.DecodeProfile != nil {
		d = *cfg.DecodeProfile
	}
	if cfg.PrefillProfile != nil {
		p = *cfg.PrefillProfile
	}
	r.decode = compile(ProfileDecode, d, r.timer, &maxscore.Picker{})
	pt := r.timer
	if cfg.Colocated {
		pt = nil // never runs: no series for it
	}
	r.prefill = compile(ProfilePrefill, p, pt, &maxscore.Picker{})
	return r
}

// register registers c with reg, or returns the collector of the same
// description already there.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
		panic(fmt.Sprintf("router: register metrics: %v", err))
	}
	return c
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

	loads := r.loads(decode, prefill)
	r.now = now
	r.indexHashes(req.PrefixHashes)
	defer func() { r.hashes = nil }() // the caller's slice is not kept
	in := &Input{Now: now, Profile: ProfileDecode, Request: req, BlockTokens: r.cfg.BlockTokens,
		Blocks: r.blocksFor(req.PromptTokens + req.MaxTokens), Exclude: exclude}

	if req.Peers != nil {
		r.deepest(req.Peers)
	} else {
		r.deepest(decode, prefill)
	}
	// A decode worker loads from its host and disk tiers, and pulls from
	// peers, only the prompts it prefills itself.
	r.dbuf = r.candidates(r.dbuf[:0], decode, loads, r.cfg.Colocated || req.Local)
	cs, by := r.decode.filter(in, r.decode.filters, r.dbuf)
	if len(cs) == 0 {
		return Decision{}, fmt.Errorf("%w (%d known, %d excluded%s)", ErrNoDecodeWorkers, len(decode), len(exclude), filteredBy(by))
	}
	if cs, by = r.decode.filter(in, r.decode.capacity, cs); len(cs) == 0 {
		return Decision{}, fmt.Errorf("%w: decode filter %s left none", ErrNoCapacity, by)
	}
	dc := cs[r.decode.checked(r.decode.pick(in, cs, &r.scores, &r.totals), len(cs))]
	dec := Decision{Decode: dc.Worker, ShortBelow: r.cfg.LocalPrefillBelowTokens, LocalPeer: r.pullFor(dc.Worker)}
	a := assignment{at: now, decode: dc.Worker.ID, blocks: in.Blocks}
	if n := min(len(req.PrefixHashes), recentMaxHashes); n > 0 {
		a.hashes = append([]uint64(nil), req.PrefixHashes[:n]...)
	}

	hitDecode := dc.PrefixHitBlocks * r.cfg.BlockTokens
	uncached := req.PromptTokens - hitDecode
	placement := PlacementRemote
	switch {
	case req.DecodeOnly:
		placement, dec.Peer = PlacementDecodeOnly, dec.LocalPeer
	case r.cfg.Colocated, req.Local:
		placement, dec.Local, dec.PrefixHitTokens, dec.Peer = PlacementLocal, true, hitDecode, dec.LocalPeer
	case r.decider.Short(uncached):
		placement, dec.Local, dec.PrefixHitTokens, dec.Peer = PlacementLocalShort, true, hitDecode, dec.LocalPeer
	default:
		in.Profile = ProfilePrefill
		r.pbuf = r.candidates(r.pbuf[:0], prefill, loads, true)
		cs, by := r.prefill.filter(in, r.prefill.filters, r.pbuf)
		if len(cs) == 0 {
			return Decision{}, fmt.Errorf("%w (%d known%s)", ErrNoPrefillWorkers, len(prefill), filteredBy(by))
		}
		r.queued = r.queued[:0]
		for _, c := range cs {
			r.queued = append(r.queued, c.Load.QueuedPrefillTokens)
		}
		if r.decider.Busy(uncached, r.queued) {
			placement, dec.Local, dec.PrefixHitTokens, dec.Peer = PlacementLocalBusy, true, hitDecode, dec.LocalPeer
			break
		}
		known := len(cs)
		if cs, by = r.prefill.filter(in, r.prefill.capacity, cs); len(cs) == 0 {
			return Decision{}, fmt.Errorf("%w: prefill filter %s left none of %d prefill workers (max %d queued tokens)",
				ErrNoCapacity, by, known, r.cfg.MaxQueuedPrefillTokens)
		}
		pc := cs[r.prefill.checked(r.prefill.pick(in, cs, &r.scores, &r.totals), len(cs))]
		_, served := r.served.Serve(pc, len(req.PrefixHashes))
		hit := min(served*r.cfg.BlockTokens, req.PromptTokens)
		dec.Prefill, dec.PrefixHitTokens, dec.Peer = pc.Worker, hit, r.pullFor(pc.Worker)
		a.prefill, a.prefillTokens, a.prefilledOn = pc.Worker.ID, req.PromptTokens-hit, pc.Worker.ID
	}
	if r.decisions != nil {
		r.decisions.WithLabelValues(placement).Inc()
	}
	r.inflight[req.ID] = a
	return dec, nil
}

func filteredBy(name string) string {
	if name == "" {
		return ""
	}
	return "; filter " + name + " left none"
}

// checked returns i when it indexes n candidates, else 0 (a picker
// breaking its contract does not crash the router).
func (p *profile) checked(i, n int) int {
	if i < 0 || i >= n {
		return 0
	}
	return i
}

// candidates appends the candidates of ws to buf: their loads and their
// prefix hit on the hashes indexed by indexHashes: from Worker.Prefix
// when set, else from Worker.PrefixDigest; and, when host is set (the
// worker would load them), their host tier's from Worker.HostPrefix,
// their disk tier's from Worker.DiskPrefix and, for a worker that pulls,
// the deepest prefix another worker holds (deepest).
func (r *Router) candidates(buf []Candidate, ws []Worker, loads map[string]Load, host bool) []Candidate {
	for _, w := range ws {
		c := Candidate{Worker: w, Load: loads[w.ID], PrefixHitBlocks: r.engineHit(w)}
		if host && w.HostPrefix != nil {
			c.HostHitBlocks = min(w.HostPrefix.Match(r.hashes), len(r.hashes))
		}
		if host && w.DiskPrefix != nil {
			c.DiskHitBlocks = min(w.DiskPrefix.Match(r.hashes), len(r.hashes))
		}
		if host && w.PeerPullCost > 0 {
			c.PeerHitBlocks = r.peerOf(w.ID).blocks
		}
		buf = append(buf, c)
	}
	return buf
}

// engineHit returns the leading hashes (indexed by indexHashes) worker w
// holds in engine memory: by Worker.Prefix when set, else by
// Worker.PrefixDigest.
func (r *Router) engineHit(w Worker) int {
	var n int
	if w.Prefix != nil {
		n = min(w.Prefix.Match(r.hashes), len(r.hashes))
	} else {
		n = r.prefixHitBlocks(w.PrefixDigest)
	}
	return max(n, r.recentHit(w.ID))
}

// recentHit returns the leading hashes of the request that a prompt
// recently ended on worker id shares (see recentTTL).
func (r *Router) recentHit(id string) int {
	best := 0
	for _, p := range r.recent[id] {
		if r.now.Sub(p.at) > r.cfg.RecentTTL {
			continue
		}
		n := 0
		for n < len(p.hashes) && n < len(r.hashes) && p.hashes[n] == r.hashes[n] {
			n++
		}
		best = max(best, n)
	}
	return best
}

// remember records a's prompt as held by worker id (Done).
func (r *Router) remember(id string, a assignment) {
	if id == "" || len(a.hashes) == 0 || r.cfg.RecentTTL <= 0 {
		return
	}
	l := r.recent[id]
	// Drop what has expired (by the newest time known, the ended
	// request's), then the oldest beyond the bound.
	k := 0
	for k < len(l) && a.at.Sub(l[k].at) > r.cfg.RecentTTL {
		k++
	}
	l = append(l[k:], recentPrompt{at: a.at, hashes: a.hashes})
	if len(l) > recentPerWorker {
		l = l[len(l)-recentPerWorker:]
	}
	r.recent[id] = l
}

// Retain drops what Done remembered of the workers not in live (ids of
// the live members): a worker that left takes its recent prompts along.
func (r *Router) Retain(live map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.recent {
		if !live[id] {
			delete(r.recent, id)
		}
	}
}

// depth is one worker's prefix of the request, in blocks, in any tier.
type depth struct {
	w      Worker
	blocks int
}

// depthOf returns the leading blocks of the indexed hashes w holds in any
// tier of its cache (engine, host, disk).
func (r *Router) depthOf(w Worker) int {
	n := r.engineHit(w)
	if w.HostPrefix != nil {
		n = max(n, min(w.HostPrefix.Match(r.hashes), len(r.hashes)))
	}
	if w.DiskPrefix != nil {
		n = max(n, min(w.DiskPrefix.Match(r.hashes), len(r.hashes)))
	}
	return n
}

// deepest sets r.deep to the two workers of the lists holding the
// longest prefix of the indexed hashes in any tier of their caches,
// deepest first: a worker's peers are every listed worker but itself,
// and the deepest of them is r.deep[0], or r.deep[1] when it is
// r.deep[0]. It is the one search of a prompt's holders: the scorers'
// Candidate.PeerHitBlocks and the decision's pulls (pullFor) read it.
// O(workers × hashes).
func (r *Router) deepest(lists ...[]Worker) {
	r.deep = [2]depth{}
	if len(r.hashes) == 0 {
		return
	}
	for _, ws := range lists {
		for _, w := range ws {
			d := depth{w: w, blocks: r.depthOf(w)}
			switch {
			case d.blocks == 0:
			case d.w.ID == r.deep[0].w.ID || d.w.ID == r.deep[1].w.ID:
				// Listed twice (a decode worker that is a prefill
				// candidate too, colocated): the same depth.
			case d.blocks > r.deep[0].blocks:
				r.deep[0], r.deep[1] = d, r.deep[0]
			case d.blocks > r.deep[1].blocks:
				r.deep[1] = d
			}
		}
	}
}

// peerOf returns the deepest holder of the request's prefix other than
// the worker id (zero: none).
func (r *Router) peerOf(id string) depth {
	if r.deep[0].w.ID == id {
		return r.deep[1]
	}
	return r.deep[0]
}

// pullFor returns the pull w may make of the request's prefix: from the
// deepest other holder, when it holds more than w does and has an
// address; zero otherwise.
func (r *Router) pullFor(w Worker) Pull {
	p := r.peerOf(w.ID)
	if p.w.ID == "" || p.w.Addr == "" || p.blocks <= r.depthOf(w) {
		return Pull{}
	}
	return Pull{From: p.w, Tokens: p.blocks * r.cfg.BlockTokens}
}

// indexHashes prepares prefixHitBlocks for a request's hashes.
func (r *Router) indexHashes(hashes []uint64) {
	r.hashes = hashes
	clear(r.hashIdx)
	for i, h := range hashes {
		if _, dup := r.hashIdx[h]; !dup {
			r.hashIdx[h] = i
		}
	}
	if cap(r.marks) < len(hashes) {
		r.marks = make([]bool, len(hashes))
	}
	r.marks = r.marks[:len(hashes)]
}

// prefixHitBlocks returns how many of the indexed hashes, from the first,
// digest holds: the match stops at the first miss, as the hashes are
// chained. O(len(digest) + len(hashes)).
func (r *Router) prefixHitBlocks(digest []uint64) int {
	if len(r.marks) == 0 || len(digest) == 0 {
		return 0
	}
	clear(r.marks)
	for _, h := range digest {
		if i, ok := r.hashIdx[h]; ok {
			r.marks[i] = true
		}
	}
	n := 0
	for n < len(r.marks) && r.marks[n] {
		n++
	}
	return n
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

// Revised records that requestID's decision was revised by Revise onto
// its decode worker: it drops the request's prefill assignment and counts
// pdserve_router_decisions_total{placement="local_reserved"}. An unknown
// id, or one whose prefill is already dropped, changes nothing.
func (r *Router) Revised(requestID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.inflight[requestID]
	if !ok || a.prefill == "" {
		return
	}
	a.prefill, a.prefillTokens = "", 0
	r.inflight[requestID] = a
	if r.decisions != nil {
		r.decisions.WithLabelValues(PlacementLocalReserved).Inc()
	}
}

// Done forgets the assignment of a request that ended (or whose routing is
// abandoned). Unknown ids are ignored.
func (r *Router) Done(requestID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a, ok := r.inflight[requestID]; ok {
		r.remember(a.decode, a)
		if a.prefilledOn != a.decode {
			r.remember(a.prefilledOn, a)
		}
	}
	delete(r.inflight, requestID)
}

// InFlight returns the number of requests with a recorded assignment.
func (r *Router) InFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.inflight)
}

// Loads returns the estimated load of every listed worker by id: its
// snapshot with the assignments made after it (see "Determinism and load
// between heartbeats" in the package doc).
func (r *Router) Loads(lists ...[]Worker) map[string]Load {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loads(lists...)
}

// loads returns the load of every listed worker by id, in one pass over
// the assignments: O(workers + assignments).
func (r *Router) loads(lists ...[]Worker) map[string]Load {
	type entry struct {
		l  Load
		at time.Time
	}
	m := make(map[string]*entry)
	for _, ws := range lists {
		for _, w := range ws {
			m[w.ID] = &entry{l: Load{KVBlocksFree: w.KVBlocksFree, RunningBatch: w.RunningBatch, QueuedPrefillTokens: w.QueuedPrefillTokens}, at: w.Time}
		}
	}
	for _, a := range r.inflight {
		// An assignment made before a snapshot is already reflected in it.
		if e, ok := m[a.decode]; ok && a.at.After(e.at) {
			e.l.KVBlocksFree -= a.blocks
			e.l.RunningBatch++
		}
		if e, ok := m[a.prefill]; ok && a.prefill != "" && a.at.After(e.at) {
			e.l.QueuedPrefillTokens += a.prefillTokens
		}
	}
	out := make(map[string]Load, len(m))
	for id, e := range m {
		out[id] = e.l
	}
	return out
}

func (r *Router) blocksFor(tokens int) int {
	if tokens <= 0 {
		return 0
	}
	return (tokens + r.cfg.BlockTokens - 1) / r.cfg.BlockTokens
}
