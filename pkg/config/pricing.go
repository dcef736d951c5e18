package config

import (
	"fmt"
	"math"

	"github.com/pdserve/pdserve/pkg/budget"
)

// Pricing prices requests: the cost in the request log line, in the
// `pdserve` object and in pdserve_cost_usd_total (see budget.Trace.Cost).
// Either GPU time (GPUUSDPerHour, with the GPUs of a worker of each pool)
// or token prices (PromptUSDPer1k, OutputUSDPer1k), not both. All zero
// (the default): no cost is reported; there is no built-in price.
type Pricing struct {
	// GPUUSDPerHour is USD per GPU-hour (≥ 0). A request costs the
	// GPU-seconds it used: its share of the prefill and decode steps it
	// was part of, × the GPUs of the worker.
	GPUUSDPerHour float64 `yaml:"gpu_usd_per_hour"`
	// PrefillGPUsPerWorker and DecodeGPUsPerWorker are the GPUs of one
	// prefill and one decode (or colocated) worker, e.g. the
	// tensor-parallel degree; ≥ 0, 0 meaning 1. Only with GPUUSDPerHour.
	PrefillGPUsPerWorker int `yaml:"prefill_gpus_per_worker"`
	DecodeGPUsPerWorker  int `yaml:"decode_gpus_per_worker"`
	// PromptUSDPer1k and OutputUSDPer1k are USD per 1000 prompt and
	// output tokens (≥ 0).
	PromptUSDPer1k float64 `yaml:"prompt_usd_per_1k_tokens"`
	OutputUSDPer1k float64 `yaml:"output_usd_per_1k_tokens"`
}

// validate reports the first problem, wrapping ErrInvalid.
func (p Pricing) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: pricing: "+format, append([]any{ErrInvalid}, a...)...)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"gpu_usd_per_hour", p.GPUUSDPerHour}, {"prompt_usd_per_1k_tokens", p.PromptUSDPer1k}, {"output_usd_per_1k_tokens", p.OutputUSDPer1k}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return bad("%s must be a finite number ≥ 0, got %v", f.name, f.v)
		}
	}
	switch tokens := p.PromptUSDPer1k > 0 || p.OutputUSDPer1k > 0; {
	case p.PrefillGPUsPerWorker < 0 || p.DecodeGPUsPerWorker < 0:
		return bad("prefill_gpus_per_worker and decode_gpus_per_worker must be ≥ 0 (0: 1)")
	case p.GPUUSDPerHour > 0 && tokens:
		return bad("gpu_usd_per_hour and token prices are two ways to price a request: set one")
	case p.GPUUSDPerHour == 0 && (p.PrefillGPUsPerWorker > 0 || p.DecodeGPUsPerWorker > 0):
		return bad("prefill_gpus_per_worker and decode_gpus_per_worker count only with gpu_usd_per_hour")
	}
	return nil
}

// Resolve returns the pricing requests are costed with, GPU counts
// defaulted, or nil when no price is set. The result is the caller's.
func (p Pricing) Resolve() *budget.Pricing {
	switch {
	case p.GPUUSDPerHour > 0:
		return &budget.Pricing{GPUHourUSD: p.GPUUSDPerHour, PrefillGPUs: max(p.PrefillGPUsPerWorker, 1), DecodeGPUs: max(p.DecodeGPUsPerWorker, 1)}
	case p.PromptUSDPer1k > 0 || p.OutputUSDPer1k > 0:
		return &budget.Pricing{PromptUSDPer1k: p.PromptUSDPer1k, OutputUSDPer1k: p.OutputUSDPer1k}
	}
	return nil
}
