package planner

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// Candidate is one design the search looked at.
type Candidate struct {
	Design Design `json:"design"`
	GPUs   int    `json:"gpus"`
	// Bound is the analytic capacity bound on its rate, requests/s.
	Bound float64 `json:"bound"`
	// MaxRate is the highest rate (requests/s) at which the SLO
	// attainment target holds; 0 when it never does. Valid unless
	// Skipped.
	MaxRate float64 `json:"max_rate"`
	// GoodputPerGPU is MaxRate / GPUs.
	GoodputPerGPU float64 `json:"goodput_per_gpu"`
	// Skipped: its bound could not beat the best goodput per GPU found.
	Skipped bool `json:"skipped,omitempty"`

	evaluated bool
}

// streamFactor is how many times Config.Requests the stream holds: the
// most requests one run may simulate to reach a steady state.
const streamFactor = 10

// rateTolerance is the relative precision of the binary search on rate.
const rateTolerance = 0.01

// boundSlack widens the analytic capacity bounds, which ignore batching
// gains the simulation may find.
const boundSlack = 1.3

// searcher evaluates candidates of one Config.
type searcher struct {
	ctx context.Context // nil: never cancelled
	cfg *Config
	sim *simulator
	lim Limits
	// per-worker analytic capacities, requests/s
	capPrefill, capDecode, capLink, capColoc float64
}

func newSearcher(cfg *Config) *searcher {
	lim := cfg.limits()
	maxSeq := min(cfg.Prefill.Spec.MaxSeqLen, cfg.decodeProfile().Spec.MaxSeqLen, cfg.colocatedProfile().Spec.MaxSeqLen)
	st := newStream(cfg.Workload, streamFactor*cfg.requests(), cfg.Burstiness, cfg.Seed, maxSeq, cfg.cacheOn())
	s := &searcher{cfg: cfg, lim: lim, sim: newSimulator(cfg, st, lim)}
	s.capacities()
	return s
}

// capacities computes per-worker throughput bounds from the step-time
// model on a sample of the stream's lengths. With prefix caches, each
// prompt's prefill is bounded by what an infinite cache would leave to
// compute.
func (s *searcher) capacities() {
	sm, cfg := s.sim, s.cfg
	lens := sm.st.lens[:min(len(sm.st.lens), 256)]
	hits := make([]int, len(lens))
	if sm.cached {
		seen := map[int64]bool{}
		for i, l := range lens {
			keys := sm.st.keys[i]
			n := 0
			for n < len(keys) && seen[keys[n]] {
				n++
			}
			hits[i] = hitTokens(n, l.In, sm.blockTokens)
			for _, k := range keys {
				seen[k] = true
			}
		}
	}
	var inTok, outTok, prefillT float64
	batch, ctx := make([]int, 0, 64), make([]int, 0, 64)
	for i, l := range lens {
		inTok += float64(l.In)
		outTok += float64(l.Out)
		k := max(1, s.lim.MaxPrefillTokens/l.In)
		batch, ctx = batch[:0], ctx[:0]
		for range k {
			batch = append(batch, l.In-hits[i])
			ctx = append(ctx, hits[i])
		}
		prefillT += cfg.Prefill.StepSeconds(perfmodel.Batch{Prefill: batch, PrefillContext: ctx}) / float64(k) * sm.scaleP
	}
	n := float64(len(lens))
	meanIn, meanOut := inTok/n, outTok/n
	s.capPrefill = n / prefillT
	decodeCap := func(p *perfmodel.Profile, memTokens int64, scale float64) float64 {
		b := min(s.lim.MaxDecodeBatch, max(int(float64(memTokens)/(meanIn+meanOut)), 1))
		ctx := make([]int, b)
		for i := range ctx {
			ctx[i] = int(meanIn + meanOut/2)
		}
		return float64(b) / (p.StepSeconds(perfmodel.Batch{Decode: ctx}) * scale * math.Max(meanOut, 1))
	}
	s.capDecode = decodeCap(cfg.decodeProfile(), sm.decCap, sm.scaleD)
	s.capLink = sm.xferRate / sm.scaleT / (meanIn * sm.kvBytes)
	// A colocated worker does both jobs; prefill on its own profile.
	var colPrefill float64
	for i, l := range lens {
		colPrefill += cfg.colocatedProfile().StepSeconds(perfmodel.Batch{Prefill: []int{l.In - hits[i]}, PrefillContext: []int{hits[i]}}) * sm.scaleP
	}
	s.capColoc = min(n/colPrefill, decodeCap(cfg.colocatedProfile(), sm.colCap, sm.scaleD))
}

func (s *searcher) bound(d Design) float64 {
	if d.Disaggregated() {
		p, dd := float64(d.Prefill), float64(d.Decode)
		return boundSlack * min(p*s.capPrefill, dd*s.capDecode, p*s.capLink, dd*s.capLink)
	}
	return boundSlack * float64(d.Colocated) * s.capColoc
}

func (s *searcher) gpus(d Design) int {
	if d.Disaggregated() {
		return d.Prefill*s.cfg.Prefill.Units() + d.Decode*s.cfg.decodeProfile().Units()
	}
	return d.Colocated * s.cfg.colocatedProfile().Units()
}

// meets reports whether d meets the attainment target at rate.
func (s *searcher) meets(d Design, rate float64) bool {
	if s.ctx != nil && s.ctx.Err() != nil {
		return false // Run reports the cancellation
	}
	return s.sim.run(d, rate, true).Attainment >= s.cfg.SLO.Attainment
}

// maxRate finds the highest rate at which d meets the target, to
// rateTolerance, knowing that it meets it at lo (0 when unknown).
func (s *searcher) maxRate(d Design, lo float64) float64 {
	hi := s.bound(d)
	if !(hi > 0) {
		return 0
	}
	if lo <= 0 {
		probe := hi / 256
		if !s.meets(d, probe) {
			return 0
		}
		lo = probe
	}
	for range 4 { // the bound is analytic: widen it if it was met
		if lo < hi && !s.meets(d, hi) {
			break
		}
		lo, hi = max(lo, hi), max(lo, hi)*2
	}
	for hi-lo > rateTolerance*hi {
		mid := (lo + hi) / 2
		if s.meets(d, mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// searchDisagg evaluates every (P, D) within the budget, best bound per
// GPU first, skipping those whose bound cannot beat the best found.
func (s *searcher) searchDisagg() []Candidate {
	var cands []Candidate
	tpP, tpD := s.cfg.Prefill.Units(), s.cfg.decodeProfile().Units()
	for p := 1; p*tpP+tpD <= s.cfg.GPUBudget; p++ {
		for d := 1; p*tpP+d*tpD <= s.cfg.GPUBudget; d++ {
			des := Design{Prefill: p, Decode: d}
			cands = append(cands, Candidate{Design: des, GPUs: s.gpus(des), Bound: s.bound(des)})
		}
	}
	s.evaluate(cands, func(c Candidate) float64 {
		// The largest known rate of a design with no more of either
		// pool is a lower bound (more workers never hurt).
		var lo float64
		for _, o := range cands {
			if o.MaxRate > lo && o.Design.Prefill <= c.Design.Prefill && o.Design.Decode <= c.Design.Decode {
				lo = o.MaxRate
			}
		}
		return lo
	})
	return cands
}

// evaluate fills MaxRate of cands in decreasing order of bound per GPU,
// marking Skipped those whose bound per GPU is below the best goodput per
// GPU found. lower gives a rate known to be met, or 0.
func (s *searcher) evaluate(cands []Candidate, lower func(Candidate) float64) {
	order := make([]int, len(cands))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ca, cb := &cands[a], &cands[b]
		return cmp.Or(cmp.Compare(cb.Bound/float64(cb.GPUs), ca.Bound/float64(ca.GPUs)), cmp.Compare(ca.GPUs, cb.GPUs))
	})
	best := 0.0
	for _, c := range cands {
		if c.evaluated {
			best = max(best, c.GoodputPerGPU)
		}
	}
	for _, i := range order {
		c := &cands[i]
		if c.evaluated {
			continue
		}
		if c.Bound/float64(c.GPUs) < best {
			c.Skipped = true
			continue
		}
		c.MaxRate = s.maxRate(c.Design, lower(*c))
		c.GoodputPerGPU = c.MaxRate / float64(c.GPUs)
		c.evaluated = true
		best = max(best, c.GoodputPerGPU)
	}
}

// searchColoc picks the chunk budget at the smallest count that meets the
// SLO at all, then evaluates every count with it.
func (s *searcher) searchColoc() ([]Candidate, int) {
	tp := s.cfg.colocatedProfile().Units()
	maxC := s.cfg.GPUBudget / tp
	chunks := ChunkCandidates
	if s.cfg.Limits.ChunkTokens != 0 {
		chunks = []int{s.cfg.Limits.ChunkTokens}
	}
	var tried []Candidate
	chunk := chunks[0]
	for c := 1; c <= maxC && len(chunks) > 1; c++ {
		bestRate := 0.0
		for _, ch := range chunks {
			des := Design{Colocated: c, Chunk: ch}
			cand := Candidate{Design: des, GPUs: s.gpus(des), Bound: s.bound(des)}
			cand.MaxRate = s.maxRate(des, 0)
			cand.GoodputPerGPU = cand.MaxRate / float64(cand.GPUs)
			cand.evaluated = true
			tried = append(tried, cand)
			if cand.MaxRate > bestRate {
				bestRate, chunk = cand.MaxRate, ch
			}
		}
		if bestRate > 0 {
			break
		}
	}
	var cands []Candidate
	for c := 1; c <= maxC; c++ {
		des := Design{Colocated: c, Chunk: chunk}
		if i := slices.IndexFunc(tried, func(t Candidate) bool { return t.Design == des }); i >= 0 {
			cands = append(cands, tried[i])
			continue
		}
		cands = append(cands, Candidate{Design: des, GPUs: s.gpus(des), Bound: s.bound(des)})
	}
	s.evaluate(cands, func(c Candidate) float64 {
		var lo float64
		for _, o := range cands {
			if o.MaxRate > lo && o.Design.Colocated <= c.Design.Colocated {
				lo = o.MaxRate
			}
		}
		return lo
	})
	return cands, chunk
}

// atRate returns the design with the fewest GPUs (then the largest bound)
// that meets the target at rate, or false.
func (s *searcher) atRate(cands []Candidate, rate float64) (Candidate, bool) {
	order := slices.Clone(cands)
	slices.SortStableFunc(order, func(a, b Candidate) int {
		return cmp.Or(cmp.Compare(a.GPUs, b.GPUs), cmp.Compare(b.Bound, a.Bound))
	})
	for _, c := range order {
		switch {
		case !c.Skipped && c.MaxRate >= rate:
			return c, true
		case !c.Skipped || c.Bound < rate:
			continue
		}
		if s.meets(c.Design, rate) {
			return c, true
		}
	}
	return Candidate{}, false
}

// bestPerGPU returns the candidate with the most goodput per GPU (ties:
// fewer GPUs), or false when none meets the SLO.
func bestPerGPU(cands []Candidate) (Candidate, bool) {
	var best Candidate
	ok := false
	for _, c := range cands {
		if c.Skipped || c.MaxRate <= 0 {
			continue
		}
		if !ok || c.GoodputPerGPU > best.GoodputPerGPU*(1+1e-9) ||
			(c.GoodputPerGPU >= best.GoodputPerGPU*(1-1e-9) && c.GPUs < best.GPUs) {
			best, ok = c, true
		}
	}
	return best, ok
}

// String describes a candidate for messages.
func (c Candidate) String() string {
	return fmt.Sprintf("%s on %d GPUs: %.3g req/s (%.3g per GPU)", c.Design, c.GPUs, c.MaxRate, c.GoodputPerGPU)
}

// MaxRate returns the highest rate (requests/s, to 1 %) at which design d
// meets cfg's SLO attainment target, 0 when it never does, searching no
// other design: the GPU budget does not bound d and cfg.Rate is ignored.
// A colocated d needs its Chunk (-1 or > 0). Errors wrap ErrConfig, or are
// ctx's error when it is cancelled between simulations. Deterministic in
// cfg and d.
func MaxRate(ctx context.Context, cfg *Config, d Design) (float64, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	switch {
	case d.Colocated == 0 && (d.Prefill < 1 || d.Decode < 1):
		return 0, fmt.Errorf("%w: design %s: a disaggregated design needs ≥ 1 prefill and ≥ 1 decode worker", ErrConfig, d)
	case d.Colocated != 0 && (d.Colocated < 1 || d.Prefill != 0 || d.Decode != 0 || d.Chunk == 0 || d.Chunk < -1):
		return 0, fmt.Errorf("%w: design %s: a colocated design needs ≥ 1 worker and a chunk budget of -1 or > 0", ErrConfig, d)
	}
	s := newSearcher(cfg)
	s.ctx = ctx
	r := s.maxRate(d, 0)
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return r, nil
}
