package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pdserve/pdserve/loadtest/report"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner"
	"github.com/pdserve/pdserve/pkg/workerrun"
	"github.com/pdserve/pdserve/pkg/workload"
)

// splitAuto is the --pd-split value that lets the planner choose.
const splitAuto = "auto"

// unpacedLinkGbps stands for an unpaced KV link (--link-gbps 0) in the
// planner, which needs a bandwidth: at 10^6 Gb/s the transfer costs
// nothing.
const unpacedLinkGbps = 1e6

// planRequests is how many requests each of the planner's simulations
// runs when it weighs the splits (0: the planner's default); tests lower
// it, since no figure they check depends on it.
var planRequests = 0

// errNoPlan says why the planner cannot weigh the splits of a comparison.
var errNoPlan = errors.New("no plan")

// planSplit asks the planner which prefill:decode split of the local
// disaggregated deployment's workers serves wl best: the predicted max
// rate at target attainment of every split, with the workers' default
// prefix caches simulated on the prompts' shared prefix. It returns the
// choice with Ran unset; errors wrap errNoPlan when the comparison gives
// the planner nothing to plan on (no sim profile, an SLO without TTFT or
// TPOT).
func planSplit(ctx context.Context, d *deployFlags, o *benchOptions, target float64, wl *workload.Workload) (report.SplitChoice, error) {
	var c report.SplitChoice
	switch {
	case d.Engine != enginecfg.Sim:
		return c, fmt.Errorf("%w: the planner models the sim engine's profiles, not --engine %s", errNoPlan, d.Engine)
	case o.slo.TTFT <= 0 || o.slo.TPOT <= 0:
		return c, fmt.Errorf("%w: the planner needs TTFT and TPOT SLOs (--goodput ttft:MS tpot:MS)", errNoPlan)
	}
	p, err := perfmodel.Resolve(d.Profile)
	if err != nil {
		return c, fmt.Errorf("%w: --profile: %v", errUsage, err)
	}
	tp := p.Units()
	if d.GPUs < 2*tp || d.GPUs%tp != 0 {
		return c, fmt.Errorf("%w: --gpus %d: a disaggregated deployment needs two or more workers of %d GPUs", errUsage, d.GPUs, tp)
	}
	workers := d.GPUs / tp
	pw := planWorkload(wl, o.Burstiness)
	link := d.LinkGbps
	if link <= 0 {
		link = unpacedLinkGbps
	}
	codec, err := planner.CodecFor(d.Codec, link*1e9/8, planner.DefaultCodecCores)
	if err != nil {
		return c, fmt.Errorf("%w: --codec: %v", errUsage, err)
	}
	wo, po := workerrun.NewDecodeOptions(), workerrun.NewPrefillOptions()
	cfg := &planner.Config{
		Prefill: p, Workload: pw,
		SLO:             planner.SLO{TTFT: o.slo.TTFT, TPOT: o.slo.TPOT, Attainment: target},
		Burstiness:      o.Burstiness,
		LinkBytesPerSec: link * 1e9 / 8,
		Codec:           codec,
		Policy:          planner.Policy(d.Policy),
		GPUBudget:       d.GPUs,
		GPUCostPerHour:  2, // prices no split differently
		Limits: planner.Limits{
			MaxDecodeBatch:   orInt(d.MaxBatch, wo.Decode.MaxBatch),
			MaxPrefillTokens: orInt(d.MaxBatchTokens, po.Prefill.MaxBatchTokens),
		},
		Requests: planRequests,
		Seed:     o.Seed,
	}
	if pw.HasBlocks() {
		cfg.Cache = planner.Cache{EngineTokens: planner.CacheAuto}
		c.Cached = fmt.Sprintf("the %d-token prefix every prompt shares (at most %.0f%% of the prompt tokens)", wl.SharedPrefixLen(), 100*pw.PrefixCeiling())
	}
	best := 0.0
	for np := 1; np < workers; np++ {
		r, err := planner.MaxRate(ctx, cfg, planner.Design{Prefill: np, Decode: workers - np})
		if err != nil {
			if ctx.Err() != nil {
				return c, err
			}
			return c, fmt.Errorf("%w: %v", errUsage, err)
		}
		s := fmt.Sprintf("%d:%d", np, workers-np)
		c.Predicted = append(c.Predicted, report.SplitRate{Split: s, MaxRate: r})
		if r > best {
			best, c.Planner = r, s
		}
	}
	if c.Planner == "" {
		return c, fmt.Errorf("%w: the planner finds no split of %d workers that meets the SLOs at any rate", errNoPlan, workers)
	}
	return c, nil
}

// planWorkload is wl as the planner reads it: its requests' lengths in
// order, and, when its prompts share a prefix, their KV blocks: the
// prefix's blocks common to all, every other block a prompt's own.
func planWorkload(wl *workload.Workload, burstiness float64) *planner.Workload {
	pw := &planner.Workload{Description: wl.Description, Burstiness: burstiness, Lengths: make([]planner.Lengths, len(wl.Requests))}
	for i, r := range wl.Requests {
		pw.Lengths[i] = planner.Lengths{In: r.PromptLen, Out: max(r.OutputLen, 1)}
	}
	bt := workerrun.NewDecodeOptions().Decode.BlockTokens
	shared := wl.SharedPrefixLen() / bt
	if shared == 0 {
		return pw
	}
	pw.BlockTokens = bt
	pw.Blocks = make([][]int32, len(wl.Requests))
	next := int32(shared)
	for i, r := range wl.Requests {
		n := r.PromptLen / bt
		bs := make([]int32, n)
		for j := range bs {
			if j < shared {
				bs[j] = int32(j)
			} else {
				bs[j], next = next, next+1
			}
		}
		pw.Blocks[i] = bs
	}
	return pw
}

// splitChoice settles --pd-split before the deployments start: with auto,
// the planner's split; with P:D, the planner's opinion of it when it can
// give one. It returns nil for deployments given by URL.
func splitChoice(ctx context.Context, d *deployFlags, o *benchOptions, target float64, disaggURL string) (*report.SplitChoice, error) {
	auto := d.Split == splitAuto
	if disaggURL != "" {
		if auto {
			return nil, fmt.Errorf("%w: --pd-split auto sizes a local deployment; --disagg-url runs its own split", errUsage)
		}
		return nil, nil
	}
	if d.Engine == enginecfg.Llama && auto {
		return nil, fmt.Errorf("%w: --pd-split auto needs a performance profile (--engine sim); give P:D for llamacpp", errUsage)
	}
	wl, err := o.loadedWorkload()
	if err != nil {
		return nil, err
	}
	c, err := planSplit(ctx, d, o, target, wl)
	why := strings.TrimPrefix(fmt.Sprint(err), errNoPlan.Error()+": ")
	switch {
	case err == nil:
		c.Auto = auto
		if auto {
			d.Split = c.Planner
		}
	case errors.Is(err, errNoPlan) && !auto:
		c.Why = why
	case errors.Is(err, errNoPlan):
		return nil, fmt.Errorf("%w: --pd-split auto: %s", errUsage, why)
	default:
		return nil, err
	}
	c.Ran = d.Split
	return &c, nil
}

// orInt returns x, or def when x is 0 (a worker default).
func orInt(x, def int) int {
	if x == 0 {
		return def
	}
	return x
}
