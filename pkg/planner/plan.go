package planner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
)

// PerDesign holds one figure for each design.
type PerDesign struct {
	Disaggregated float64 `json:"disaggregated"`
	Colocated     float64 `json:"colocated"`
}

// BudgetMs is a TTFT budget in milliseconds: the mean of each term over
// the simulated requests (they add up to Total, the mean TTFT).
type BudgetMs struct {
	Ingress    float64 `json:"ingress"`
	Queue      float64 `json:"queue"`
	Prefill    float64 `json:"prefill"`
	KVTransfer float64 `json:"kv_transfer"`
	FirstToken float64 `json:"first_token"`
	Total      float64 `json:"total"`
}

func budgetMs(b Budget) BudgetMs {
	m := BudgetMs{
		Ingress: ms(b.Ingress.Mean), Queue: ms(b.Queue.Mean), Prefill: ms(b.Prefill.Mean),
		KVTransfer: ms(b.KVTransfer.Mean), FirstToken: ms(b.FirstToken.Mean),
	}
	m.Total = m.Ingress + m.Queue + m.Prefill + m.KVTransfer + m.FirstToken
	return m
}

func ms(s float64) float64 { return math.Round(s*1e6) / 1e3 }

// Prediction is what the simulation predicts for one design at its
// operating rate.
type Prediction struct {
	Design Design  `json:"design"`
	GPUs   int     `json:"gpus"`
	Rate   float64 `json:"rate"` // requests/s
	// Attainment is the fraction of requests meeting both SLOs;
	// TTFTAttainment the fraction meeting the TTFT SLO.
	Attainment     float64 `json:"attainment"`
	TTFTAttainment float64 `json:"ttft_attainment"`
	TTFTMs         LatMs   `json:"ttft_ms"`
	TPOTMs         LatMs   `json:"tpot_ms"`
	// Budget holds every term's percentiles, seconds.
	Budget Budget `json:"budget_s"`
	// Steps are the largest steps the prediction priced.
	Steps Steps `json:"largest_steps"`
	// PrefixCache is the simulated prefix caches' hits (nil when none
	// were simulated, see Config.Cache).
	PrefixCache *CacheStats `json:"prefix_cache,omitempty"`
}

// LatMs are latency percentiles in milliseconds.
type LatMs struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	At   float64 `json:"at_attainment"`
}

func latMs(q Quantiles) LatMs {
	return LatMs{Mean: ms(q.Mean), P50: ms(q.P50), P90: ms(q.P90), P99: ms(q.P99), At: ms(q.At)}
}

// WorkloadSummary describes the planned workload.
type WorkloadSummary struct {
	Description string      `json:"description"`
	Lengths     LengthStats `json:"lengths"`
	// Rate is the workload's own rate (requests/s, 0 when none).
	Rate float64 `json:"rate"`
	// Arrivals says how the simulation draws arrivals.
	Arrivals string `json:"arrivals"`
}

// Plan is the planner's answer for one Config.
type Plan struct {
	Profile          string `json:"profile"`
	DecodeProfile    string `json:"decode_profile"`
	ColocatedProfile string `json:"colocated_profile"`

	Workload        WorkloadSummary `json:"workload"`
	SLOTTFTMs       float64         `json:"slo_ttft_ms"`
	SLOTPOTMs       float64         `json:"slo_tpot_ms"`
	Attainment      float64         `json:"attainment"`
	LinkGbps        float64         `json:"link_gbps"`
	Codec           Codec           `json:"codec"`
	CodecCores      int             `json:"codec_cores"`
	KVTransferGBps  float64         `json:"kv_transfer_raw_gb_per_s"` // raw KV GB/s of one transfer
	KVBytesPerToken int64           `json:"kv_bytes_per_token"`
	Policy          Policy          `json:"first_token_policy"`
	// Unit is what GPUBudget, GPUs and GoodputPerGPU count: UnitGPU, or
	// UnitCore for CPU profiles (a worker takes its profile's threads).
	Unit string `json:"unit"`
	// UnitsPerWorker is the units (GPUs or cores) of one worker of each
	// pool.
	UnitsPerWorker UnitsPerWorker `json:"units_per_worker"`
	GPUBudget      int            `json:"gpu_budget"`
	// RequestedRate is Config.Rate (0: find the highest).
	RequestedRate float64 `json:"requested_rate"`

	// Feasible is false when no design within the budget meets the SLO
	// (at RequestedRate when set); the replica counts are then those of
	// the design that came closest, or 0.
	Feasible bool `json:"feasible"`
	// Objective is what decided Recommended: ObjectiveGoodputPerGPU, or
	// with RequestedRate ObjectiveFewestGPUs.
	Objective string `json:"objective"`
	// Recommended is "disaggregated" or "colocated": the design with more
	// goodput per GPU (at RequestedRate: the one needing fewer GPUs, at
	// equal GPUs the one with the higher MaxRate).
	Recommended       string `json:"recommended"`
	PrefillReplicas   int    `json:"prefill_replicas"`
	DecodeReplicas    int    `json:"decode_replicas"`
	ColocatedReplicas int    `json:"colocated_replicas"`

	GPUs PerDesign `json:"gpus"`
	// MaxRate is the chosen designs' highest rate meeting the SLO, req/s.
	MaxRate PerDesign `json:"max_rate"`
	// GoodputPerGPU is MaxRate / GPUs, requests/s per GPU.
	GoodputPerGPU PerDesign `json:"goodput_per_gpu"`
	// CostPer1kTokens is USD per 1000 tokens (prompt + output) served
	// within the SLO at the operating rate.
	CostPer1kTokens PerDesign `json:"cost_per_1k_tokens"`

	Limits Limits `json:"limits"`
	// PrefixCache describes the simulated prefix caches; nil when none
	// were simulated (see Config.Cache).
	PrefixCache *CacheSummary `json:"prefix_cache,omitempty"`
	// CacheSweep, when set (by the caller, from SweepCache), is what each
	// prefix-cache size buys.
	CacheSweep []CacheRow `json:"cache_sweep,omitempty"`
	// TTFTBudgetMs is the disaggregated design's mean TTFT budget at its
	// operating rate; TTFTBudgetColocatedMs the colocated one's.
	TTFTBudgetMs          BudgetMs `json:"ttft_budget_ms"`
	TTFTBudgetColocatedMs BudgetMs `json:"ttft_budget_colocated_ms"`
	// KVTransferMs is the mean exposed KV transfer whatever the policy
	// (with policy "prefill" it is in the first inter-token gap).
	KVTransferMs float64 `json:"kv_transfer_ms"`

	Disaggregated *Prediction `json:"disaggregated"`
	Colocated     *Prediction `json:"colocated"`

	Candidates          []Candidate `json:"candidates"`
	ColocatedCandidates []Candidate `json:"colocated_candidates"`
	Simulations         int         `json:"simulations"`
	SimulatedRequests   int         `json:"simulated_requests"`
	Seed                uint64      `json:"seed"`
	Notes               []string    `json:"notes,omitempty"`
	// Warnings say where the plan stands on weak ground: the workload
	// leaves a profile's measured range (see RangeWarnings).
	Warnings []string `json:"warnings,omitempty"`
}

// The objectives a plan optimizes (Plan.Objective).
const (
	// ObjectiveGoodputPerGPU: the highest goodput per GPU (per core on
	// CPU profiles) within the budget; without a rate.
	ObjectiveGoodputPerGPU = "goodput_per_gpu"
	// ObjectiveFewestGPUs: the fewest GPUs (cores) that meet the SLO at
	// the requested rate; at equal GPUs, the higher max rate.
	ObjectiveFewestGPUs = "fewest_gpus_at_rate"
)

// The units a plan counts.
const (
	UnitGPU  = "gpu"
	UnitCore = "core"
)

// UnitsPerWorker holds the GPUs (or cores) one worker of each pool takes.
type UnitsPerWorker struct {
	Prefill   int `json:"prefill"`
	Decode    int `json:"decode"`
	Colocated int `json:"colocated"`
}

// ErrInfeasible is wrapped by the error Run returns, together with a plan,
// when no design within the GPU budget meets the SLO; match with errors.Is.
var ErrInfeasible = errors.New("planner: no design within the GPU budget meets the SLO")

// Run plans for cfg: it searches disaggregated and colocated designs
// within the GPU budget and returns the plan. When nothing meets the SLO
// it returns the plan (Feasible false) and an error wrapping
// ErrInfeasible; other errors (ErrConfig, or ctx's error when it is
// cancelled between simulations) come with a nil plan. The plan is
// deterministic in cfg; Run takes from milliseconds to seconds of CPU.
func Run(ctx context.Context, cfg *Config) (*Plan, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := newSearcher(cfg)
	s.ctx = ctx
	pl := s.newPlan()

	disagg := s.searchDisagg()
	coloc, chunk := s.searchColoc()
	pl.Limits.ChunkTokens = chunk
	pl.Candidates, pl.ColocatedCandidates = disagg, coloc

	var dBest, cBest Candidate
	var dOK, cOK bool
	if cfg.Rate > 0 {
		dBest, dOK = s.atRate(disagg, cfg.Rate)
		cBest, cOK = s.atRate(coloc, cfg.Rate)
		// The fewest GPUs may be a design the per-GPU search skipped:
		// find its highest rate too.
		for _, b := range []struct {
			c     *Candidate
			ok    bool
			cands []Candidate
		}{{&dBest, dOK, disagg}, {&cBest, cOK, coloc}} {
			if b.ok && !b.c.evaluated {
				b.c.MaxRate = s.maxRate(b.c.Design, cfg.Rate)
				b.c.GoodputPerGPU = b.c.MaxRate / float64(b.c.GPUs)
				b.c.Skipped, b.c.evaluated = false, true
				if i := slices.IndexFunc(b.cands, func(x Candidate) bool { return x.Design == b.c.Design }); i >= 0 {
					b.cands[i] = *b.c
				}
			}
		}
	} else {
		dBest, dOK = bestPerGPU(disagg)
		cBest, cOK = bestPerGPU(coloc)
	}
	if dOK {
		pl.Disaggregated = s.predict(dBest)
	}
	if cOK {
		pl.Colocated = s.predict(cBest)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("planner: %w", err)
	}
	pl.fill(cfg, s)
	pl.Warnings, pl.Notes = rangeWarnings(cfg, s.sim.st, pl.Notes, pl.Disaggregated, pl.Colocated, true, true)
	pl.Simulations = s.sim.runs
	if !pl.Feasible {
		what := "at any rate"
		if cfg.Rate > 0 {
			what = fmt.Sprintf("at %.3g req/s", cfg.Rate)
		}
		return pl, fmt.Errorf("%w (%s, %s)", ErrInfeasible, plural(cfg.GPUBudget, pl.unit()), what)
	}
	return pl, nil
}

func (s *searcher) newPlan() *Plan {
	cfg, sm := s.cfg, s.sim
	w := cfg.Workload
	pl := &Plan{
		Profile:           cfg.Prefill.Name,
		DecodeProfile:     cfg.decodeProfile().Name,
		ColocatedProfile:  cfg.colocatedProfile().Name,
		Workload:          WorkloadSummary{Description: w.Description, Lengths: w.Stats(), Rate: w.Rate},
		SLOTTFTMs:         ms(cfg.SLO.TTFT.Seconds()),
		SLOTPOTMs:         ms(cfg.SLO.TPOT.Seconds()),
		Attainment:        cfg.SLO.Attainment,
		LinkGbps:          cfg.LinkBytesPerSec * 8 / 1e9,
		Codec:             cfg.Codec,
		CodecCores:        cfg.codecCores(),
		KVTransferGBps:    sm.xferRate / sm.scaleT / 1e9,
		KVBytesPerToken:   cfg.Prefill.KVBytesPerToken(),
		Policy:            cfg.policy(),
		GPUBudget:         cfg.GPUBudget,
		Unit:              UnitGPU,
		UnitsPerWorker:    UnitsPerWorker{Prefill: cfg.Prefill.Units(), Decode: cfg.decodeProfile().Units(), Colocated: cfg.colocatedProfile().Units()},
		RequestedRate:     cfg.Rate,
		Objective:         ObjectiveGoodputPerGPU,
		Limits:            s.lim,
		SimulatedRequests: cfg.requests(),
		Seed:              cfg.Seed,
		PrefixCache:       sm.cacheSummary(),
	}
	if cfg.Prefill.CPU() {
		pl.Unit = UnitCore
	}
	if cfg.Rate > 0 {
		pl.Objective = ObjectiveFewestGPUs
	}
	switch k := cfg.Burstiness; {
	case k <= 0 && len(w.Gaps) > 0:
		pl.Workload.Arrivals = fmt.Sprintf("trace inter-arrival gaps (CV %.2f) rescaled to the rate", cvOf(w.Gaps))
	default:
		if k <= 0 {
			k = w.Burstiness
		}
		if k <= 0 || k == 1 {
			pl.Workload.Arrivals = "Poisson"
		} else {
			pl.Workload.Arrivals = fmt.Sprintf("gamma, burstiness %.3g (CV %.2f)", k, 1/math.Sqrt(k))
		}
	}
	pl.Notes = append(pl.Notes, w.Notes...)
	if c := sm.st.clamped; c > 0 {
		pl.Notes = append(pl.Notes, fmt.Sprintf("%d of %d simulated requests were shortened to fit the model's context", c, len(sm.st.lens)))
	}
	return pl
}

// predict simulates the candidate at its operating rate: the asked rate,
// or its highest rate meeting the SLO.
func (s *searcher) predict(c Candidate) *Prediction {
	rate := s.cfg.Rate
	if rate <= 0 {
		rate = c.MaxRate
	}
	r := s.sim.run(c.Design, rate, false)
	return s.sim.prediction(r, s.gpus(c.Design))
}

// prediction is r as a Prediction of a design on gpus GPUs.
func (s *simulator) prediction(r *simResult, gpus int) *Prediction {
	p := &Prediction{
		Design: r.Design, GPUs: gpus, Rate: r.Rate, Attainment: r.Attainment, TTFTAttainment: r.TTFTAttainment,
		TTFTMs: latMs(r.TTFT), TPOTMs: latMs(r.TPOT), Budget: r.Budget, Steps: r.Steps,
	}
	if s.cached {
		p.PrefixCache = &r.Cache
	}
	return p
}

// cacheSummary describes the simulated caches, nil when none.
func (s *simulator) cacheSummary() *CacheSummary {
	if !s.cached {
		return nil
	}
	c := s.cfg.Cache
	c.Routing, c.HostLinkBytesPerSec = c.routing(), c.hostLink()
	return &CacheSummary{
		Cache:                 c,
		EngineTokensPrefill:   int64(s.pEngine * s.blockTokens),
		EngineTokensColocated: int64(s.cEngine * s.blockTokens),
		BlockTokens:           s.blockTokens,
		Ceiling:               s.cfg.Workload.PrefixCeiling(),
	}
}

// fill sets the plan's answer fields from its predictions.
func (pl *Plan) fill(cfg *Config, s *searcher) {
	st := cfg.Workload.Stats()
	tokens := st.MeanIn + st.MeanOut
	costPerSec := func(d Design) float64 {
		if d.Disaggregated() {
			return (float64(d.Prefill*cfg.Prefill.Units())*cfg.GPUCostPerHour + float64(d.Decode*cfg.decodeProfile().Units())*cfg.decodeCost()) / 3600
		}
		return float64(d.Colocated*cfg.colocatedProfile().Units()) * cfg.GPUCostPerHour / 3600
	}
	maxRate := func(cands []Candidate, d Design) float64 {
		for _, c := range cands {
			if c.Design == d && !c.Skipped {
				return c.MaxRate
			}
		}
		return 0
	}
	var dPer, cPer float64
	if p := pl.Disaggregated; p != nil {
		pl.PrefillReplicas, pl.DecodeReplicas = p.Design.Prefill, p.Design.Decode
		pl.GPUs.Disaggregated = float64(p.GPUs)
		pl.MaxRate.Disaggregated = maxRate(pl.Candidates, p.Design)
		dPer = pl.MaxRate.Disaggregated / float64(p.GPUs)
		pl.GoodputPerGPU.Disaggregated = dPer
		pl.CostPer1kTokens.Disaggregated = costPerSec(p.Design) / (p.Rate * tokens) * 1000
		pl.TTFTBudgetMs = budgetMs(p.Budget)
		pl.KVTransferMs = ms(p.Budget.KVTransferAny.Mean)
	}
	if p := pl.Colocated; p != nil {
		pl.ColocatedReplicas = p.Design.Colocated
		pl.GPUs.Colocated = float64(p.GPUs)
		pl.MaxRate.Colocated = maxRate(pl.ColocatedCandidates, p.Design)
		cPer = pl.MaxRate.Colocated / float64(p.GPUs)
		pl.GoodputPerGPU.Colocated = cPer
		pl.CostPer1kTokens.Colocated = costPerSec(p.Design) / (p.Rate * tokens) * 1000
		pl.TTFTBudgetColocatedMs = budgetMs(p.Budget)
	}
	pl.Feasible = pl.Disaggregated != nil || pl.Colocated != nil
	switch {
	case pl.Disaggregated == nil && pl.Colocated == nil:
	case pl.Colocated == nil:
		pl.Recommended = "disaggregated"
	case pl.Disaggregated == nil:
		pl.Recommended = "colocated"
	case cfg.Rate > 0 && pl.Disaggregated.GPUs != pl.Colocated.GPUs:
		pl.Recommended = "disaggregated"
		if pl.Colocated.GPUs < pl.Disaggregated.GPUs {
			pl.Recommended = "colocated"
		}
	default:
		pl.Recommended = "disaggregated"
		if cPer > dPer {
			pl.Recommended = "colocated"
		}
	}
	if pl.Policy == PolicyPrefill {
		pl.Notes = append(pl.Notes, fmt.Sprintf("first-token policy prefill: the KV transfer (mean %.1f ms exposed) is in the first inter-token gap, not in TTFT", pl.KVTransferMs))
	}
}
