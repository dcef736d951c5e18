package planner

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// Policy says which worker sends a disaggregated request's first token.
type Policy string

// First-token policies (the coordinator's --first-token-policy).
const (
	// PolicyPrefill: the prefill worker emits the first token when its
	// prefill ends; the KV transfer lands in the first inter-token gap.
	PolicyPrefill Policy = vocab.PolicyPrefill
	// PolicyDecode: the decode worker emits the first token after the KV
	// arrived and its first decode step; kv_transfer is part of TTFT.
	PolicyDecode Policy = vocab.PolicyDecode
)

// SLO is the service objective a request must meet to count as goodput.
type SLO struct {
	TTFT time.Duration `json:"ttft"` // time to first token, > 0
	TPOT time.Duration `json:"tpot"` // time per output token after the first (vLLM's definition), > 0
	// Attainment is the fraction of requests that must meet both TTFT
	// and TPOT (DistServe's definition), in (0, 1]. Reported latency
	// percentiles include this one.
	Attainment float64 `json:"attainment"`
}

// Limits are the batching limits of a plan. Zero fields are derived from
// the SLO by Config.Limits.
type Limits struct {
	// MaxDecodeBatch is the most sequences in one decode step (decode
	// pool and colocated workers).
	MaxDecodeBatch int `json:"max_decode_batch"`
	// MaxPrefillTokens is the most prompt tokens in one prefill step of a
	// prefill worker; a longer prompt runs alone.
	MaxPrefillTokens int `json:"max_prefill_tokens"`
	// ChunkTokens is a colocated worker's token budget per step (decode
	// tokens plus prefill chunk); -1 turns chunking off (prefill-priority
	// steps of whole prompts, vLLM without chunked prefill); 0 lets the
	// search choose among ChunkCandidates.
	ChunkTokens int `json:"colocated_chunk_tokens"`
}

// ChunkCandidates are the colocated token budgets the search tries when
// Limits.ChunkTokens is 0 (-1: no chunking).
var ChunkCandidates = []int{-1, 256, 512, 1024, 2048}

// Scale multiplies modelled times, to correct the model by observation
// (see Online). 0 fields mean 1.
type Scale struct {
	Prefill  float64 `json:"prefill"`  // prefill step times
	Decode   float64 `json:"decode"`   // decode step times
	Transfer float64 `json:"transfer"` // KV transfer times
}

func (s Scale) get(x float64) float64 {
	if x > 0 {
		return x
	}
	return 1
}

// Config is everything a plan depends on. Planning reads it and never
// modifies it.
type Config struct {
	// Prefill is the profile of prefill workers; its Units are the GPUs
	// (TP) or, for a CPU profile, the cores (threads) of each. The three
	// profiles must all be GPU or all CPU profiles.
	Prefill *perfmodel.Profile
	// Decode is the profile of decode workers; nil means Prefill.
	Decode *perfmodel.Profile
	// Colocated is the profile of colocated workers; nil means Prefill.
	Colocated *perfmodel.Profile

	Workload *Workload
	SLO      SLO
	// Rate, when > 0, is the request rate to plan for (requests/s):
	// the plan is the fewest GPUs that meet the SLO at it. 0 finds the
	// highest goodput per GPU.
	Rate float64
	// Burstiness overrides the workload's (gamma shape, 1 = Poisson);
	// when > 0 the workload's trace gaps are not replayed.
	Burstiness float64

	// LinkBytesPerSec is each worker's bandwidth to the other pool, each
	// direction, bytes/s (> 0).
	LinkBytesPerSec float64
	Codec           Codec
	// CodecCores is the cores a worker codes KV with (≥ 1; 0 means 16,
	// or for CPU profiles the threads of the smaller worker).
	CodecCores int
	// Policy is the first-token policy; "" means PolicyPrefill, the
	// coordinator's default, so that a plan and the server agree.
	Policy Policy
	// Ingress is the coordinator's own time before a request reaches
	// the prefill queue (parsing, tokenizing, routing), ≥ 0.
	Ingress time.Duration

	// GPUCostPerHour is the price of one GPU-hour (USD, ≥ 0) of the
	// Prefill profile's GPU (of one core-hour for a CPU profile);
	// DecodeGPUCostPerHour of the Decode profile's (0 means
	// GPUCostPerHour).
	GPUCostPerHour       float64
	DecodeGPUCostPerHour float64
	// GPUBudget is the most GPUs a design may use (≥ the GPUs of one
	// prefill plus one decode worker); for CPU profiles, the most cores,
	// a worker taking its profile's threads.
	GPUBudget int

	Limits Limits
	Scale  Scale
	// Cache is the workers' prefix caches, simulated on a workload that
	// names its prompts' blocks; the zero value simulates none.
	Cache Cache

	// Requests is how many requests each simulation runs (≥ 10; 0 means
	// 2000); Seed fixes them.
	Requests int
	Seed     uint64
}

// DefaultGPUBudget is the budget of a GPU plan whose budget is not given.
const DefaultGPUBudget = 16

// DefaultBudget is the budget of a plan on profile p whose budget is not
// given: DefaultGPUBudget GPUs, or for a CPU profile the logical CPUs of
// the machine it was measured on (a profile that does not say: this
// machine's), so that a plan on a small CPU box splits its cores.
func DefaultBudget(p *perfmodel.Profile) int {
	switch {
	case !p.CPU():
		return DefaultGPUBudget
	case p.Measured != nil && p.Measured.Hardware.LogicalCPUs > 0:
		return p.Measured.Hardware.LogicalCPUs
	}
	return runtime.NumCPU()
}

// ErrConfig reports an unusable Config; match with errors.Is.
var ErrConfig = errors.New("planner: bad config")

// Defaults.
const (
	DefaultRequests   = 2000
	DefaultCodecCores = 16
)

func (c *Config) decodeProfile() *perfmodel.Profile {
	if c.Decode != nil {
		return c.Decode
	}
	return c.Prefill
}

func (c *Config) colocatedProfile() *perfmodel.Profile {
	if c.Colocated != nil {
		return c.Colocated
	}
	return c.Prefill
}

func (c *Config) policy() Policy {
	if c.Policy == "" {
		return PolicyPrefill
	}
	return c.Policy
}

func (c *Config) requests() int {
	if c.Requests == 0 {
		return DefaultRequests
	}
	return c.Requests
}

func (c *Config) codecCores() int {
	switch {
	case c.CodecCores > 0:
		return c.CodecCores
	case c.Prefill.CPU():
		// A CPU worker codes KV with its own threads.
		return min(c.Prefill.Units(), c.decodeProfile().Units())
	}
	return DefaultCodecCores
}

func (c *Config) decodeCost() float64 {
	if c.DecodeGPUCostPerHour > 0 {
		return c.DecodeGPUCostPerHour
	}
	return c.GPUCostPerHour
}

// Validate reports, wrapped in ErrConfig, the first problem of c.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if c.Prefill == nil {
		return bad("no profile")
	}
	if c.Workload == nil {
		return bad("no workload")
	}
	if err := c.Workload.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if c.SLO.TTFT <= 0 || c.SLO.TPOT <= 0 {
		return bad("SLO TTFT %v and TPOT %v must be > 0", c.SLO.TTFT, c.SLO.TPOT)
	}
	if !(c.SLO.Attainment > 0 && c.SLO.Attainment <= 1) {
		return bad("attainment %v must lie in (0, 1]", c.SLO.Attainment)
	}
	if !finiteNonNeg(c.Rate) || !finiteNonNeg(c.Burstiness) {
		return bad("rate %v and burstiness %v must be finite and ≥ 0", c.Rate, c.Burstiness)
	}
	if !(c.LinkBytesPerSec > 0) || math.IsInf(c.LinkBytesPerSec, 0) {
		return bad("link bandwidth %v bytes/s must be finite and > 0", c.LinkBytesPerSec)
	}
	if err := c.Codec.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if c.CodecCores < 0 {
		return bad("codec cores %d < 0", c.CodecCores)
	}
	switch c.Policy {
	case "", PolicyDecode, PolicyPrefill:
	default:
		return bad("first-token policy %q: want %s or %s", c.Policy, PolicyPrefill, PolicyDecode)
	}
	if c.Ingress < 0 {
		return bad("ingress %v < 0", c.Ingress)
	}
	if !finiteNonNeg(c.GPUCostPerHour) || !finiteNonNeg(c.DecodeGPUCostPerHour) {
		return bad("GPU cost must be finite and ≥ 0")
	}
	for _, p := range []*perfmodel.Profile{c.decodeProfile(), c.colocatedProfile()} {
		if p.CPU() != c.Prefill.CPU() {
			return bad("profiles %s and %s mix CPU and GPU workers: the budget counts one kind", c.Prefill.Name, p.Name)
		}
	}
	if need := c.Prefill.Units() + c.decodeProfile().Units(); c.GPUBudget < need {
		return bad("%s budget %d < %d, the %ss of one prefill and one decode worker", c.Prefill.UnitName(), c.GPUBudget, need, c.Prefill.UnitName())
	}
	if c.Requests != 0 && c.Requests < 10 {
		return bad("requests per simulation %d < 10", c.Requests)
	}
	if err := c.Cache.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	l := c.Limits
	if l.MaxDecodeBatch < 0 || l.MaxPrefillTokens < 0 || l.ChunkTokens < -1 {
		return bad("limits must be ≥ 0 (chunk tokens ≥ -1)")
	}
	for _, s := range []float64{c.Scale.Prefill, c.Scale.Decode, c.Scale.Transfer} {
		if !finiteNonNeg(s) {
			return bad("scale factors must be finite and ≥ 0")
		}
	}
	return nil
}

// Limits returns c.Limits with zero fields derived from the SLO and the
// workload (ChunkTokens stays 0 when the search is to choose it):
//
//   - MaxDecodeBatch: the largest B such that every decode step of up to
//     B sequences at the workload's mean context (prompt + half the
//     output) takes at most 90% of the TPOT SLO on the decode profile
//     (scaled by Scale.Decode); at least 1. The 10% margin absorbs the
//     steps that carry longer contexts and, under the prefill policy,
//     the transfer gap.
//   - MaxPrefillTokens: k mean-length prompts, with k the largest count
//     whose batch prefills within half the TTFT SLO (at least 1), so that
//     queueing and transfer keep the other half.
func (c *Config) limits() Limits {
	l := c.Limits
	st := c.Workload.Stats()
	if l.MaxDecodeBatch == 0 {
		p := c.decodeProfile()
		ctx := max(int(math.Round(st.MeanIn+st.MeanOut/2)), 1)
		limit := 0.9 * c.SLO.TPOT.Seconds() / c.Scale.get(c.Scale.Decode)
		b := 0
		batch := make([]int, 0, 64)
		for b < maxDecodeBatchCap {
			batch = append(batch, ctx)
			if p.StepSeconds(perfmodel.Batch{Decode: batch}) > limit {
				break
			}
			b++
		}
		l.MaxDecodeBatch = max(b, 1)
	}
	if l.MaxPrefillTokens == 0 {
		p := c.Prefill
		in := max(int(math.Round(st.MeanIn)), 1)
		limit := 0.5 * c.SLO.TTFT.Seconds() / c.Scale.get(c.Scale.Prefill)
		k := 0
		batch := make([]int, 0, 16)
		for (k+1)*in <= maxPrefillTokensCap {
			batch = append(batch, in)
			if p.StepSeconds(perfmodel.Batch{Prefill: batch}) > limit {
				break
			}
			k++
		}
		l.MaxPrefillTokens = max(k, 1) * in
	}
	return l
}

// Caps on derived limits.
const (
	maxDecodeBatchCap   = 1024
	maxPrefillTokensCap = 65536
)
