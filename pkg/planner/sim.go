package planner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// Design is one deployment the simulator can run: a disaggregated one
// (Prefill and Decode workers, both ≥ 1) or a colocated one (Colocated
// workers ≥ 1, Prefill and Decode 0).
type Design struct {
	Prefill   int `json:"prefill,omitempty"`
	Decode    int `json:"decode,omitempty"`
	Colocated int `json:"colocated,omitempty"`
	// Chunk is a colocated worker's token budget per step, -1 for no
	// chunking; ignored for disaggregated designs.
	Chunk int `json:"chunk_tokens,omitempty"`
}

// Disaggregated reports whether d has prefill and decode pools.
func (d Design) Disaggregated() bool { return d.Colocated == 0 }

func (d Design) String() string {
	if d.Disaggregated() {
		return fmt.Sprintf("%dP+%dD", d.Prefill, d.Decode)
	}
	if d.Chunk < 0 {
		return fmt.Sprintf("%dC (no chunking)", d.Colocated)
	}
	return fmt.Sprintf("%dC (chunk %d)", d.Colocated, d.Chunk)
}

// Quantiles are latency percentiles, seconds.
type Quantiles struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	// At is the percentile at the SLO's attainment target (P90 at 0.9).
	At float64 `json:"at_attainment"`
}

// Budget is the TTFT budget of the simulated requests, term by term,
// seconds. The terms of each request add up to its TTFT; their means add
// up to the mean TTFT (percentiles do not add up).
type Budget struct {
	Ingress    Quantiles `json:"ingress"`
	Queue      Quantiles `json:"queue"`
	Prefill    Quantiles `json:"prefill"`
	KVTransfer Quantiles `json:"kv_transfer"`
	FirstToken Quantiles `json:"first_token"`
	// KVTransferAny is the exposed transfer time (KV done − prefill end)
	// whatever the policy: with PolicyPrefill it is not in KVTransfer but
	// in the first inter-token gap.
	KVTransferAny Quantiles `json:"kv_transfer_any_policy"`
}

// simResult is what one simulation predicts.
type simResult struct {
	Design Design  `json:"design"`
	Rate   float64 `json:"rate"` // requests/s offered
	// Requests measured (see reset); Met of them met both SLOs; Failed could not be
	// served at all (longer than a decode worker's KV memory).
	Requests int `json:"requests"`
	Met      int `json:"met"`
	Failed   int `json:"failed"`
	// Attainment is Met / Requests.
	Attainment float64 `json:"attainment"`
	// TTFTAttainment is the fraction of Requests served whose first
	// token met the TTFT SLO (0 when Aborted).
	TTFTAttainment float64   `json:"ttft_attainment"`
	TTFT           Quantiles `json:"ttft"`
	TPOT           Quantiles `json:"tpot"`
	Budget         Budget    `json:"budget"`
	// Aborted: the run stopped as soon as the attainment target became
	// unreachable (search runs only); the latency fields are then empty.
	Aborted bool `json:"aborted,omitempty"`
	// Steps are the largest steps the run priced.
	Steps Steps `json:"largest_steps"`
	// Cache: the prefix caches' figures (zero when not simulated).
	Cache CacheStats `json:"prefix_cache"`
}

// Steps are the largest steps a simulation priced on the step-time
// model, per pool: what the profiles' data points should cover.
type Steps struct {
	// Prompt is the longest prompt in a prefill step (a chunk plus its
	// cached context), tokens; PrefillTokens the most prompt tokens in
	// one step.
	Prompt        int `json:"prompt_tokens"`
	PrefillTokens int `json:"prefill_tokens_per_step"`
	// DecodeBatch is the most sequences in one decode step;
	// DecodeContext the longest context of a decoding sequence, tokens.
	DecodeBatch   int `json:"decode_batch"`
	DecodeContext int `json:"decode_context_tokens"`
}

// note widens st to cover step b.
func (st *Steps) note(b perfmodel.Batch) {
	tokens := 0
	for i, n := range b.Prefill {
		tokens += n
		l := n
		if i < len(b.PrefillContext) {
			l += b.PrefillContext[i]
		}
		st.Prompt = max(st.Prompt, l)
	}
	st.PrefillTokens = max(st.PrefillTokens, tokens)
	st.DecodeBatch = max(st.DecodeBatch, len(b.Decode))
	for _, c := range b.Decode {
		st.DecodeContext = max(st.DecodeContext, c)
	}
}

// sreq is one simulated request. Times are seconds from the start.
type sreq struct {
	in, out                       int32
	gen                           int32 // tokens produced so far, by any worker
	prefilled                     int32 // colocated: prompt tokens done
	pw, dw                        int32 // prefill / decode worker
	arr                           float64
	pStart, pEnd, kvDone, first   float64
	last                          float64
	missed, done, failed, started bool
	measured                      bool  // counts in attainment and statistics
	hit, loaded                   int32 // prefix-cache hit tokens, and of them loaded from the host tier
}

// stream is the simulated requests shared by every candidate (common
// random numbers): arrival times at rate 1 and lengths.
type stream struct {
	unitArr []float64 // arrival i at unitArr[i]/rate
	lens    []Lengths
	// keys, with cached, are each request's full prompt blocks as cache
	// keys: the sample's block id, and in the high 32 bits the pass over
	// the samples, so that each pass starts with blocks never seen.
	keys    [][]int64
	clamped int // requests shortened to fit the models' context
}

// newStream draws n requests from w with the seed: lengths with
// replacement (with cached, w's samples in order, cyclically, with their
// blocks); gaps from the trace (a window from its start, cyclic,
// normalised to mean 1) or gamma with the burstiness. Lengths are clamped
// so that in+out fits maxSeq.
func newStream(w *Workload, n int, burstiness float64, seed uint64, maxSeq int, cached bool) *stream {
	rng := rand.New(rand.NewPCG(seed, 0x706473657276))
	s := &stream{unitArr: make([]float64, n), lens: make([]Lengths, n)}
	gaps := make([]float64, n)
	switch {
	case burstiness <= 0 && len(w.Gaps) > 0:
		for i := range gaps {
			gaps[i] = w.Gaps[i%len(w.Gaps)]
		}
		if g := normalizeGaps(gaps); g != nil {
			gaps = g
		} else {
			for i := range gaps {
				gaps[i] = 1
			}
		}
	default:
		k := burstiness
		if k <= 0 {
			k = w.Burstiness
		}
		if k <= 0 {
			k = 1
		}
		for i := range gaps {
			gaps[i] = gammaVariate(rng, k) / k
		}
	}
	var t float64
	for i := range n {
		t += gaps[i]
		s.unitArr[i] = t
		k := i % len(w.Lengths)
		if !cached {
			k = rng.IntN(len(w.Lengths))
		}
		l := w.Lengths[k]
		if maxSeq > 1 && l.In+l.Out > maxSeq {
			l.In = min(l.In, maxSeq-1)
			l.Out = min(l.Out, maxSeq-l.In)
			s.clamped++
		}
		s.lens[i] = l
		if cached {
			pass := int64(i / len(w.Lengths))
			blocks := fullBlocks(w.Blocks[k], l.In, w.BlockTokens)
			keys := make([]int64, len(blocks))
			for j, b := range blocks {
				keys[j] = pass<<32 | int64(b)
			}
			s.keys = append(s.keys, keys)
		}
	}
	return s
}

// gammaVariate draws from Gamma(k, 1) (Marsaglia and Tsang, 2000).
func gammaVariate(rng *rand.Rand, k float64) float64 {
	if k < 1 {
		return gammaVariate(rng, k+1) * math.Pow(rng.Float64(), 1/k)
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}

// simulator runs designs of one Config over one stream. Not safe for
// concurrent use (it reuses buffers); cheap to create.
type simulator struct {
	cfg                    *Config
	pp, dp, cp             *perfmodel.Profile
	st                     *stream
	lim                    Limits
	policy                 Policy
	ingress                float64
	ttftSLO, tpotSLO       float64
	target                 float64
	xferRate               float64 // raw KV bytes/s per transfer
	kvBytes                float64 // raw KV bytes per token
	layers                 float64
	scaleP, scaleD, scaleT float64
	decCap, colCap         int64 // KV tokens per worker

	// Prefix caches (cfg.cacheOn): blockTokens per block; engine and host
	// tiers of a prefill and a colocated worker, blocks; hostLoad the
	// seconds per token loaded from the host tier.
	cached                       bool
	blockTokens                  int
	pEngine, cEngine, hostBlocks int
	hostLoad                     float64
	caches                       []wCache
	dEngine                      int      // a decode worker's cache, blocks
	dcaches                      []wCache // decode workers' caches
	router                       *prefixRouter

	// lifetime is a request's longest life within the SLO: TTFT plus
	// the mean output at TPOT, seconds.
	lifetime float64

	reqs     []sreq
	measured int
	steps    Steps // the largest steps of the current run
	batch    perfmodel.Batch
	runs     int // simulations run, for reports
}

func newSimulator(cfg *Config, st *stream, lim Limits) *simulator {
	pp, dp, cp := cfg.Prefill, cfg.decodeProfile(), cfg.colocatedProfile()
	s := &simulator{
		cfg: cfg, pp: pp, dp: dp, cp: cp, st: st, lim: lim,
		policy:   cfg.policy(),
		ingress:  cfg.Ingress.Seconds(),
		ttftSLO:  cfg.SLO.TTFT.Seconds(),
		tpotSLO:  cfg.SLO.TPOT.Seconds(),
		target:   cfg.SLO.Attainment,
		xferRate: cfg.Codec.rawRate(cfg.LinkBytesPerSec, cfg.codecCores()),
		kvBytes:  float64(pp.KVBytesPerToken()),
		layers:   float64(pp.Spec.Layers),
		scaleP:   cfg.Scale.get(cfg.Scale.Prefill),
		scaleD:   cfg.Scale.get(cfg.Scale.Decode),
		scaleT:   cfg.Scale.get(cfg.Scale.Transfer),
		decCap:   dp.MaxKVTokens(),
		colCap:   cp.MaxKVTokens(),
		lifetime: cfg.SLO.TTFT.Seconds() + cfg.Workload.Stats().MeanOut*cfg.SLO.TPOT.Seconds(),
		cached:   cfg.cacheOn(),
	}
	if s.cached {
		bt := cfg.Workload.BlockTokens
		s.blockTokens = bt
		s.pEngine = int(cfg.Cache.engineTokens(pp.MaxKVTokens()) / int64(bt))
		s.cEngine = int(cfg.Cache.engineTokens(cp.MaxKVTokens()) / int64(bt))
		s.dEngine = int(cfg.Cache.engineTokens(dp.MaxKVTokens()) / int64(bt))
		s.hostBlocks = int(cfg.Cache.HostTokens / int64(bt))
		s.hostLoad = float64(pp.KVBytesPerToken()) / cfg.Cache.hostLink()
	}
	return s
}

// resetCaches empties n workers' caches of engineBlocks each (and the
// host tiers), for a run.
func (s *simulator) resetCaches(n, engineBlocks int) {
	if cap(s.caches) < n {
		s.caches = append(s.caches[:cap(s.caches)], make([]wCache, n-cap(s.caches))...)
	}
	s.caches = s.caches[:n]
	for i := range s.caches {
		s.caches[i].reset(engineBlocks, s.hostBlocks)
	}
	if s.cached && s.cfg.Cache.routing() == RoutePrefix && (s.router == nil || len(s.router.cs) != n) {
		s.router = newPrefixRouter(n, "worker")
	}
}

// useCache looks r's prompt up in worker w's cache and caches it (see
// Cache): it sets r.hit and r.loaded and returns the seconds the host
// tier's blocks take to load.
func (s *simulator) useCache(w int, id int32) float64 {
	r := &s.reqs[id]
	hit, loaded := s.caches[w].use(s.st.keys[id])
	r.hit = int32(hitTokens(hit, int(r.in), s.blockTokens))
	r.loaded = int32(min(loaded*s.blockTokens, int(r.hit)))
	return float64(r.loaded) * s.hostLoad
}

// route picks the worker of n for request id: prefix-aware (the router's
// default prefill scoring over each worker's cache and queued tokens) or
// the fewest queued tokens, the first of the fewest.
func (s *simulator) route(id int32, n int, queued func(i int) int) int {
	if s.cached && s.cfg.Cache.routing() == RoutePrefix {
		keys := s.st.keys[id]
		return s.router.pick(len(keys), func(i int) int { return s.caches[i].match(keys) }, queued)
	}
	best := 0
	for i := 1; i < n; i++ {
		if queued(i) < queued(best) {
			best = i
		}
	}
	return best
}

// transferSeconds is the time the KV of a prompt of in tokens occupies the
// link.
func (s *simulator) transferSeconds(in int32) float64 {
	return float64(in) * s.kvBytes / s.xferRate * s.scaleT
}

// reset lays out the requests of a run at rate and returns the miss
// allowance. A run simulates enough requests for its arrivals to span
// steadySpans request lifetimes (at least cfg.Requests, at most the
// stream), and measures only those arriving after the first lifetime
// (warm-up) and before the last one (drain).
func (s *simulator) reset(rate float64) int {
	n := int(math.Ceil(rate * steadySpans * s.lifetime))
	n = min(max(n, s.cfg.requests()), len(s.st.lens))
	if cap(s.reqs) < n {
		s.reqs = make([]sreq, n)
	}
	s.reqs = s.reqs[:n]
	end := s.st.unitArr[n-1] / rate
	warm, drain := min(s.lifetime, end/10), max(end-s.lifetime, end*0.9)
	s.measured = 0
	s.steps = Steps{}
	for i := range s.reqs {
		l := s.st.lens[i]
		r := sreq{in: int32(l.In), out: int32(l.Out), arr: s.st.unitArr[i] / rate, pw: -1, dw: -1}
		r.measured = r.arr >= warm && r.arr <= drain
		if r.measured {
			s.measured++
		}
		s.reqs[i] = r
	}
	if s.measured == 0 {
		for i := range s.reqs {
			s.reqs[i].measured = true
		}
		s.measured = n
	}
	s.runs++
	return int(math.Floor((1 - s.target) * float64(s.measured) * (1 + 1e-12)))
}

// steadySpans is how many request lifetimes the arrivals of a run span.
const steadySpans = 4

// noteFirst records r's first token at t and whether it missed TTFT.
func (s *simulator) noteFirst(r *sreq, t float64) bool {
	r.first = t
	if t-r.arr > s.ttftSLO*(1+1e-9) {
		r.missed = true
		return r.measured
	}
	return false
}

// noteLast records r's last token at t; it reports a new miss.
func (s *simulator) noteLast(r *sreq, t float64) bool {
	r.last, r.done = t, true
	if r.missed || r.out <= 1 {
		return false
	}
	if (t-r.first)/float64(r.out-1) > s.tpotSLO*(1+1e-9) {
		r.missed = true
		return r.measured
	}
	return false
}

func (s *simulator) fail(r *sreq) bool {
	r.failed, r.done = true, true
	if r.missed {
		return false
	}
	r.missed = true
	return r.measured
}

// run simulates d at rate. With abort, it stops once more requests missed
// the SLO than the attainment target allows.
func (s *simulator) run(d Design, rate float64, abort bool) *simResult {
	allowed := s.reset(rate)
	if !abort {
		allowed = math.MaxInt
	}
	var completed bool
	if d.Disaggregated() {
		completed = s.runDisagg(d, allowed)
	} else {
		completed = s.runColoc(d, allowed)
	}
	res := &simResult{Design: d, Rate: rate, Requests: s.measured, Steps: s.steps}
	for i := range s.reqs {
		r := &s.reqs[i]
		if !r.measured {
			continue
		}
		res.Cache.PromptTokens += int64(r.in)
		res.Cache.HitTokens += int64(r.hit)
		res.Cache.HostHitTokens += int64(r.loaded)
		if r.failed {
			res.Failed++
		}
		if r.done && !r.missed {
			res.Met++
		}
	}
	res.Attainment = float64(res.Met) / float64(res.Requests)
	if res.Cache.PromptTokens > 0 {
		res.Cache.HitRatio = float64(res.Cache.HitTokens) / float64(res.Cache.PromptTokens)
	}
	if !completed {
		res.Aborted = true
		return res
	}
	s.stats(res, d)
	return res
}

// Disaggregated system.

type pWorker struct {
	q      []int32 // FIFO of queued requests
	head   int
	queued int // prompt tokens queued or in the running batch
	busy   bool
	end    float64
	egress float64 // link free from
	batch  []int32
}

type dWorker struct {
	running  []int32
	pending  []int32 // KV on its way or arrived, by kvDone
	assigned int     // requests holding a reservation here
	free     int64   // KV tokens not reserved
	busy     bool
	end      float64
	ingress  float64 // link free from
	ctx      []int
}

func (w *dWorker) next(reqs []sreq) float64 {
	switch {
	case w.busy:
		return w.end
	case len(w.pending) > 0:
		return reqs[w.pending[0]].kvDone
	}
	return math.Inf(1)
}

// runDisagg simulates a disaggregated design. As the router does, a
// request first reserves prompt+output tokens of KV on the decode worker
// with the fewest requests among those with room (waiting at the
// coordinator, FIFO, while none has), then joins the prefill worker with
// the fewest queued prompt tokens. It reports whether the run completed
// (false: aborted after more than allowed misses).
func (s *simulator) runDisagg(d Design, allowed int) bool {
	reqs := s.reqs
	pws := make([]pWorker, d.Prefill)
	dws := make([]dWorker, d.Decode)
	for i := range dws {
		dws[i].free = s.decCap
	}
	if s.cached {
		s.resetCaches(d.Prefill, s.pEngine)
		if cap(s.dcaches) < d.Decode {
			s.dcaches = make([]wCache, d.Decode)
		}
		s.dcaches = s.dcaches[:d.Decode]
		for i := range s.dcaches {
			s.dcaches[i].reset(s.dEngine, 0)
		}
	}
	var admit []int32 // waiting for decode memory, FIFO
	admitHead := 0
	misses, next, n := 0, 0, len(reqs)
	maxBatch := s.lim.MaxDecodeBatch
	need := func(r *sreq) int64 { return int64(r.in) + int64(r.out) }

	startPrefill := func(pi int, t float64) {
		w := &pws[pi]
		w.batch = w.batch[:0]
		tokens := 0
		load := 0.0 // host-tier loads before the step, seconds
		for w.head < len(w.q) {
			id := w.q[w.head]
			r := &reqs[id]
			if len(w.batch) > 0 && tokens+int(r.in) > s.lim.MaxPrefillTokens {
				break
			}
			tokens += int(r.in)
			w.batch = append(w.batch, id)
			w.head++
		}
		if len(w.batch) == 0 {
			return
		}
		if s.cached {
			for _, id := range w.batch {
				load += s.useCache(pi, id)
			}
		}
		b := &s.batch
		b.Prefill, b.PrefillContext = b.Prefill[:0], b.PrefillContext[:0]
		for _, id := range w.batch {
			r := &reqs[id]
			b.Prefill = append(b.Prefill, int(r.in-r.hit))
			b.PrefillContext = append(b.PrefillContext, int(r.hit))
		}
		step := perfmodel.Batch{Prefill: b.Prefill}
		if s.cached {
			step.PrefillContext = b.PrefillContext
		}
		s.steps.note(step)
		dur := load + s.pp.StepSeconds(step)*s.scaleP
		w.busy, w.end = true, t+dur
		for _, id := range w.batch {
			r := &reqs[id]
			r.pStart, r.pEnd = t, t+dur
			if s.policy == PolicyPrefill {
				r.gen = 1
				if s.noteFirst(r, r.pEnd) {
					misses++
				}
			}
			if r.dw < 0 { // one token under the prefill policy: no decode
				s.noteLast(r, r.pEnd)
				continue
			}
			// The KV streams layer by layer as the prefill runs: first
			// through the sender's egress (FIFO), then, pipelined, through
			// the receiver's ingress (FIFO), and never ends before the last
			// layer is computed and sent.
			dw := &dws[r.dw]
			sent := r.in
			if s.cached {
				// The decode worker's cache holds a prefix: only the rest
				// of the KV crosses the link.
				hit, _ := s.dcaches[r.dw].use(s.st.keys[id])
				sent -= int32(hitTokens(hit, int(r.in), s.blockTokens))
			}
			total := s.transferSeconds(sent)
			sStart := max(t+dur/s.layers, w.egress)
			w.egress = sStart + total
			rStart := max(sStart, dw.ingress)
			dw.ingress = rStart + total
			r.kvDone = max(rStart+total, w.egress, r.pEnd+total/s.layers)
			at, _ := slices.BinarySearchFunc(dw.pending, r.kvDone, func(e int32, t float64) int {
				if reqs[e].kvDone <= t {
					return -1
				}
				return 1
			})
			dw.pending = slices.Insert(dw.pending, at, id)
		}
	}
	// dispatch reserves decode memory for r and queues it for prefill; it
	// reports false when no decode worker has room.
	dispatch := func(id int32, t float64) bool {
		r := &reqs[id]
		if s.policy == PolicyDecode || r.out > 1 {
			best := -1
			for i := range dws {
				if dws[i].free >= need(r) && (best < 0 || dws[i].assigned < dws[best].assigned) {
					best = i
				}
			}
			if best < 0 {
				return false
			}
			dw := &dws[best]
			dw.free -= need(r)
			dw.assigned++
			r.dw = int32(best)
		}
		pi := s.route(id, len(pws), func(i int) int { return pws[i].queued })
		w := &pws[pi]
		r.pw = int32(pi)
		w.q = append(w.q, id)
		w.queued += int(r.in)
		if !w.busy {
			startPrefill(pi, t)
		}
		return true
	}
	startDecode := func(w *dWorker, t float64) {
		for len(w.pending) > 0 && len(w.running) < maxBatch && reqs[w.pending[0]].kvDone <= t {
			w.running = append(w.running, w.pending[0])
			w.pending = w.pending[1:]
		}
		if len(w.running) == 0 {
			w.busy = false
			return
		}
		w.ctx = w.ctx[:0]
		for _, id := range w.running {
			r := &reqs[id]
			w.ctx = append(w.ctx, int(r.in+r.gen))
		}
		s.steps.note(perfmodel.Batch{Decode: w.ctx})
		w.busy, w.end = true, t+s.dp.StepSeconds(perfmodel.Batch{Decode: w.ctx})*s.scaleD
	}

	for misses <= allowed {
		t, kind, idx := math.Inf(1), 0, 0
		if next < n {
			t, kind = reqs[next].arr+s.ingress, 1
		}
		for i := range pws {
			if pws[i].busy && pws[i].end < t {
				t, kind, idx = pws[i].end, 2, i
			}
		}
		for i := range dws {
			if nt := dws[i].next(reqs); nt < t {
				t, kind, idx = nt, 3, i
			}
		}
		switch kind {
		case 0:
			return true
		case 1: // arrival
			id := int32(next)
			next++
			if r := &reqs[id]; need(r) > s.decCap {
				if s.fail(r) {
					misses++
				}
				continue
			}
			if admitHead < len(admit) || !dispatch(id, t) {
				admit = append(admit, id)
			}
		case 2: // prefill step done
			w := &pws[idx]
			w.busy = false
			for _, id := range w.batch {
				w.queued -= int(reqs[id].in)
			}
			if w.head > 1024 && w.head*2 > len(w.q) {
				w.q = append(w.q[:0], w.q[w.head:]...)
				w.head = 0
			}
			startPrefill(idx, t)
		case 3: // decode step done, or KV arrived at an idle worker
			w := &dws[idx]
			freed := false
			if w.busy {
				kept := w.running[:0]
				for _, id := range w.running {
					r := &reqs[id]
					r.gen++
					if r.gen == 1 && s.noteFirst(r, t) {
						misses++
					}
					if r.gen >= r.out {
						if s.noteLast(r, t) {
							misses++
						}
						w.free += need(r)
						w.assigned--
						freed = true
						continue
					}
					kept = append(kept, id)
				}
				w.running = kept
				w.busy = false
			}
			for freed && admitHead < len(admit) && dispatch(admit[admitHead], t) {
				admitHead++
			}
			startDecode(w, t)
		}
	}
	return false
}

// Colocated system.

type cWorker struct {
	q       []int32 // waiting, not admitted
	head    int
	pending int     // prompt tokens not yet prefilled (queued and admitted)
	pre     []int32 // admitted, prefilling, FIFO
	run     []int32 // decoding
	free    int64
	busy    bool
	end     float64
	stepPre []int32 // prefilling requests in the current step
	stepLen []int32 // and their chunk lengths
	stepDec int     // the first stepDec of run decode in the current step
	id      int     // index among the workers
}

func (s *simulator) runColoc(d Design, allowed int) bool {
	reqs := s.reqs
	ws := make([]cWorker, d.Colocated)
	for i := range ws {
		ws[i].free, ws[i].id = s.colCap, i
	}
	if s.cached {
		s.resetCaches(d.Colocated, s.cEngine)
	}
	misses, next, n := 0, 0, len(reqs)
	chunk := d.Chunk
	maxBatch := s.lim.MaxDecodeBatch
	if chunk > 0 {
		maxBatch = min(maxBatch, max(chunk/2, 1))
	}
	need := func(r *sreq) int64 { return int64(r.in) + int64(r.out) }

	start := func(w *cWorker, t float64) {
		load := 0.0 // host-tier loads of the requests admitted, seconds
		for w.head < len(w.q) && len(w.pre)+len(w.run) < maxBatch {
			r := &reqs[w.q[w.head]]
			if need(r) > s.colCap {
				w.pending -= int(r.in)
				w.head++
				if s.fail(r) {
					misses++
				}
				continue
			}
			if w.free < need(r) {
				break
			}
			w.free -= need(r)
			if s.cached {
				// Its cached prefix is the context of its first chunk.
				load += s.useCache(w.id, w.q[w.head])
				r.prefilled = r.hit
				w.pending -= int(r.hit)
			}
			w.pre = append(w.pre, w.q[w.head])
			w.head++
		}
		w.stepPre, w.stepLen, w.stepDec = w.stepPre[:0], w.stepLen[:0], 0
		b := &s.batch
		b.Prefill, b.PrefillContext, b.Decode = b.Prefill[:0], b.PrefillContext[:0], b.Decode[:0]
		if chunk < 0 && len(w.pre) > 0 { // prefill priority, whole prompts
			tokens := 0
			for _, id := range w.pre {
				r := &reqs[id]
				rest := r.in - r.prefilled // all of it but a cached prefix
				if len(w.stepPre) > 0 && tokens+int(rest) > s.lim.MaxPrefillTokens {
					break
				}
				tokens += int(rest)
				w.stepPre = append(w.stepPre, id)
				w.stepLen = append(w.stepLen, rest)
				b.Prefill = append(b.Prefill, int(rest))
				b.PrefillContext = append(b.PrefillContext, int(r.prefilled))
			}
		} else {
			w.stepDec = len(w.run)
			for _, id := range w.run {
				r := &reqs[id]
				b.Decode = append(b.Decode, int(r.in+r.gen))
			}
			budget := chunk - len(w.run)
			if chunk < 0 {
				budget = 0
			}
			for _, id := range w.pre {
				if budget <= 0 {
					break
				}
				r := &reqs[id]
				c := min(r.in-r.prefilled, int32(budget))
				budget -= int(c)
				w.stepPre = append(w.stepPre, id)
				w.stepLen = append(w.stepLen, c)
				b.Prefill = append(b.Prefill, int(c))
				b.PrefillContext = append(b.PrefillContext, int(r.prefilled))
			}
		}
		if len(b.Prefill) == 0 && len(b.Decode) == 0 {
			w.busy = false
			return
		}
		for _, id := range w.stepPre {
			if r := &reqs[id]; !r.started {
				r.pStart, r.started = t, true
			}
		}
		scale := s.scaleD
		if len(b.Prefill) > 0 {
			scale = s.scaleP
		}
		s.steps.note(*b)
		w.busy, w.end = true, t+load+s.cp.StepSeconds(*b)*scale
	}

	for misses <= allowed {
		t, kind, idx := math.Inf(1), 0, 0
		if next < n {
			t, kind = reqs[next].arr+s.ingress, 1
		}
		for i := range ws {
			if ws[i].busy && ws[i].end < t {
				t, kind, idx = ws[i].end, 2, i
			}
		}
		switch kind {
		case 0:
			return true
		case 1:
			id := int32(next)
			next++
			best := 0
			if s.cached && s.cfg.Cache.routing() == RoutePrefix {
				best = s.route(id, len(ws), func(i int) int { return ws[i].pending })
			} else {
				for i := 1; i < len(ws); i++ {
					a, b := &ws[i], &ws[best]
					if a.pending < b.pending || (a.pending == b.pending && len(a.run) < len(b.run)) {
						best = i
					}
				}
			}
			w := &ws[best]
			w.q = append(w.q, id)
			w.pending += int(reqs[id].in)
			if !w.busy {
				start(w, t)
			}
		case 2:
			w := &ws[idx]
			// Decoding sequences of the step produce a token.
			kept := w.run[:0]
			for k, id := range w.run {
				r := &reqs[id]
				if k < w.stepDec {
					r.gen++
					if r.gen >= r.out {
						if s.noteLast(r, t) {
							misses++
						}
						w.free += need(r)
						continue
					}
				}
				kept = append(kept, id)
			}
			w.run = kept
			// Prefill chunks advance; a finished prompt yields its first
			// token and joins the decode batch.
			for k, id := range w.stepPre {
				r := &reqs[id]
				r.prefilled += w.stepLen[k]
				w.pending -= int(w.stepLen[k])
				if r.prefilled < r.in {
					continue
				}
				r.pEnd, r.gen = t, 1
				if s.noteFirst(r, t) {
					misses++
				}
				if r.out <= 1 {
					s.noteLast(r, t)
					w.free += need(r)
					continue
				}
				w.run = append(w.run, id)
			}
			w.pre = slices.DeleteFunc(w.pre, func(id int32) bool { return reqs[id].prefilled >= reqs[id].in })
			if w.head > 1024 && w.head*2 > len(w.q) {
				w.q = append(w.q[:0], w.q[w.head:]...)
				w.head = 0
			}
			w.busy = false
			start(w, t)
		}
	}
	return false
}

// stats fills the latency fields of res from the finished requests.
func (s *simulator) stats(res *simResult, d Design) {
	n := len(s.reqs)
	ttft, tpot := make([]float64, 0, n), make([]float64, 0, n)
	terms := make([][]float64, 6)
	for i := range terms {
		terms[i] = make([]float64, 0, n)
	}
	for i := range s.reqs {
		r := &s.reqs[i]
		if r.failed || !r.measured {
			continue
		}
		ttft = append(ttft, r.first-r.arr)
		if r.out > 1 {
			tpot = append(tpot, (r.last-r.first)/float64(r.out-1))
		} else {
			tpot = append(tpot, 0)
		}
		queued := r.arr + s.ingress
		kvAny, kv, first := 0.0, 0.0, r.first-r.pEnd
		if d.Disaggregated() && r.dw >= 0 {
			kvAny = r.kvDone - r.pEnd
			if s.policy == PolicyDecode {
				kv, first = kvAny, r.first-r.kvDone
			}
		}
		for k, v := range []float64{s.ingress, r.pStart - queued, r.pEnd - r.pStart, kv, first, kvAny} {
			terms[k] = append(terms[k], max(v, 0))
		}
	}
	q := s.target
	met := 0
	for _, x := range ttft {
		if x <= s.ttftSLO*(1+1e-9) {
			met++
		}
	}
	res.TTFTAttainment = float64(met) / float64(res.Requests)
	res.TTFT, res.TPOT = quantiles(ttft, q), quantiles(tpot, q)
	b := &res.Budget
	for k, dst := range []*Quantiles{&b.Ingress, &b.Queue, &b.Prefill, &b.KVTransfer, &b.FirstToken, &b.KVTransferAny} {
		*dst = quantiles(terms[k], q)
	}
}

// quantiles sorts xs and returns its mean and nearest-rank percentiles.
func quantiles(xs []float64, at float64) Quantiles {
	if len(xs) == 0 {
		return Quantiles{}
	}
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	n := len(xs)
	return Quantiles{
		Mean: sum / float64(n),
		P50:  xs[pctIndex(n, 0.5)],
		P90:  xs[pctIndex(n, 0.9)],
		P99:  xs[pctIndex(n, 0.99)],
		At:   xs[pctIndex(n, at)],
	}
}
