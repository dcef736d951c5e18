package budget

import (
	"github.com/pdserve/pdserve/pkg/wire/vocab"
	"math"
	"time"
)

// Pricing prices requests for the cost fields of the request log line and
// the `pdserve` object (and, through pkg/metrics, pdserve_cost_usd_total).
// It holds one of two models, never both (pkg/config validates the policy
// it comes from):
//
//   - GPU time: GPUHourUSD > 0 and the GPUs of one worker of each pool;
//     a request costs the GPU-seconds it used (see Cost) × GPUHourUSD / 3600.
//   - Token prices: PromptUSDPer1k and/or OutputUSDPer1k > 0; a request
//     costs its prompt and output tokens at those prices.
//
// A Pricing is plain data, read-only once set on a Trace: many traces
// share one.
type Pricing struct {
	// GPUHourUSD is USD per GPU-hour (≥ 0; 0: the token model).
	GPUHourUSD float64
	// PrefillGPUs is the GPUs of one prefill worker, DecodeGPUs those of
	// one decode or colocated worker (≥ 1 with GPUHourUSD; 0 counts as 1).
	PrefillGPUs, DecodeGPUs int
	// PromptUSDPer1k and OutputUSDPer1k are USD per 1000 prompt and output
	// tokens (≥ 0).
	PromptUSDPer1k, OutputUSDPer1k float64
}

// Cost is what a request cost under a Pricing.
type Cost struct {
	// USD is the request's cost in US dollars.
	USD float64
	// USDPer1kTokens is USD per 1000 tokens of the request (prompt plus
	// output); 0 when it has none.
	USDPer1kTokens float64
	// GPUSeconds is the GPU time charged to the request (GPU model only,
	// else 0): its prefill and decode shares, each × the worker's GPUs.
	GPUSeconds float64
}

// Cost prices the request with t.Pricing; ok is false when t.Pricing is
// nil (no price configured: no cost is reported).
//
// Under the GPU model the request is charged the share of the steps it
// was part of, from what the trace records:
//
//	prefill share = (PrefillEnd − PrefillStart) / PrefillBatch × GPUs of the worker that prefilled
//	decode share  = (LastToken − max(FirstToken, DecodeJoined)) / BatchSize × DecodeGPUs
//
// The prefill worker reports the batch its prompt was prefilled in; local
// and colocated prefill (on the decode worker, whose GPUs count) report
// none, so the whole prefill span is charged. The decode span starts when
// the sequence joined the decode batch (the first token of policy
// "prefill" comes earlier, from the prefill worker); BatchSize is the
// largest decode batch the request saw, so when the batch shrank during
// the request the decode share is a lower bound. Time spent queueing and
// in the part of the KV transfer not overlapped with compute is not
// charged: no GPU of the request's computes then.
func (t *Trace) Cost() (c Cost, ok bool) {
	p := t.Pricing
	if p == nil {
		return Cost{}, false
	}
	tokens := t.PromptTokens + t.OutputTokens
	if p.GPUHourUSD > 0 {
		prefillGPUs := p.DecodeGPUs
		if t.Mode == vocab.ModeDisaggregated {
			prefillGPUs = p.PrefillGPUs
		}
		prefill := share(span(t.PrefillStart, t.PrefillEnd), t.PrefillBatch) * float64(max(prefillGPUs, 1))
		start := t.FirstToken
		if t.DecodeJoined.After(start) {
			start = t.DecodeJoined
		}
		decode := share(span(start, t.LastToken), t.BatchSize) * float64(max(p.DecodeGPUs, 1))
		c.GPUSeconds = prefill + decode
		c.USD = c.GPUSeconds * p.GPUHourUSD / 3600
	} else {
		c.USD = (float64(t.PromptTokens)*p.PromptUSDPer1k + float64(t.OutputTokens)*p.OutputUSDPer1k) / 1000
	}
	if tokens > 0 {
		c.USDPer1kTokens = c.USD / float64(tokens) * 1000
	}
	return c, true
}

// share is d in seconds divided by the batch it was shared by (≤ 0
// counts as 1: not reported).
func share(d time.Duration, batch int) float64 {
	return d.Seconds() / float64(max(batch, 1))
}

// roundSig rounds x to 6 significant digits, so that logs and the
// `pdserve` object carry no float noise (1.59090909e-4, not
// 1.5909090909090909e-4).
func roundSig(x float64) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	e := math.Pow(10, 5-math.Floor(math.Log10(math.Abs(x))))
	return math.Round(x*e) / e
}
