package planner

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// cpuProfile is a CPU profile at threads threads whose step times shrink
// as 1/speedup (a measured profile has this shape: coordinator profile).
func cpuProfile(t *testing.T, threads int, speedup float64) *perfmodel.Profile {
	t.Helper()
	s := 1 / speedup
	p := &perfmodel.Profile{
		Name: "cpu/qwen2.5-0.5b/t" + string(rune('0'+threads)), GPU: "cpu", Model: "qwen2.5-0.5b", TP: 1,
		Device: perfmodel.DeviceCPU, Threads: threads,
		Spec: perfmodel.ModelShape{Params: 6.3e8, Layers: 24, Hidden: 896, Heads: 14, KVHeads: 2, HeadDim: 64,
			Intermediate: 4864, Vocab: 151936, MaxSeqLen: 8192, RopeTheta: 1e6},
		Form: perfmodel.FormDistServe,
		DistServe: &perfmodel.DistServe{Prefill: [3]float64{5 * s, 0.9 * s, 2e-4 * s},
			DecodeSmall: [3]float64{30 * s, 0.003 * s, 2 * s}, DecodeLarge: [3]float64{30 * s, 0.003 * s, 2 * s}, LargeBatchThreshold: 1},
		Memory: perfmodel.Memory{MaxKVTokens: 8192},
		Source: "test", Tolerance: 0.2,
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

func cpuConfig(t *testing.T, pd, coloc *perfmodel.Profile, cores int) *Config {
	return &Config{
		Prefill: pd, Colocated: coloc, Workload: Fixed(256, 32),
		SLO:             SLO{TTFT: 3 * time.Second, TPOT: 300 * time.Millisecond, Attainment: 0.9},
		LinkBytesPerSec: 1e9, Codec: mustCodec(t, "none"), GPUBudget: cores, GPUCostPerHour: 0.05,
		Requests: 200, Seed: 1,
	}
}

// On a CPU profile the budget counts cores, a worker its threads: two
// cores hold 1P+1D of one thread each, or one colocated worker of two
// threads, and the plan compares exactly those.
func TestCPUPlanSplitsCores(t *testing.T) {
	t1, t2 := cpuProfile(t, 1, 1), cpuProfile(t, 2, 1.8)
	p := mustRun(t, cpuConfig(t, t1, t2, 2))
	if p.Unit != UnitCore || p.UnitsPerWorker != (UnitsPerWorker{Prefill: 1, Decode: 1, Colocated: 2}) {
		t.Errorf("unit %q, units per worker %+v", p.Unit, p.UnitsPerWorker)
	}
	if p.Disaggregated == nil || p.Disaggregated.Design != (Design{Prefill: 1, Decode: 1}) || p.Disaggregated.GPUs != 2 {
		t.Errorf("disaggregated %+v, want 1P+1D on 2 cores", p.Disaggregated)
	}
	if p.Colocated == nil || p.Colocated.Design.Colocated != 1 || p.Colocated.GPUs != 2 {
		t.Errorf("colocated %+v, want one worker of 2 threads", p.Colocated)
	}
	if p.Recommended == "" || p.CodecCores != 1 {
		t.Errorf("recommended %q, codec cores %d (want a worker's threads, 1)", p.Recommended, p.CodecCores)
	}
	var b strings.Builder
	if err := WriteTable(&b, p); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"budget     2 cores", "GOODPUT/CORE", "CORES"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	if c := Chart(p); !strings.Contains(c.Title, "per core") || c.YLabel != "goodput per core (req/s per core)" ||
		len(c.Refs) != 1 || !strings.Contains(c.Refs[0].Label, "req/s per core") {
		t.Errorf("CPU plan's chart: title %q, y label %q, refs %+v; want per core", c.Title, c.YLabel, c.Refs)
	}
	// A GPU profile's plan is unchanged: its unit is the GPU.
	g := mustRun(t, opt66(t, 400, "none"))
	if g.Unit != UnitGPU || g.UnitsPerWorker.Prefill != 4 {
		t.Errorf("GPU plan unit %q, units per worker %+v", g.Unit, g.UnitsPerWorker)
	}
}

func TestCPUConfigErrors(t *testing.T) {
	t2 := cpuProfile(t, 2, 1.8)
	if err := cpuConfig(t, t2, nil, 3).Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "core budget 3 < 4") {
		t.Errorf("3 cores for two 2-thread workers: %v", err)
	}
	mixed := cpuConfig(t, cpuProfile(t, 1, 1), mustProfile(t, "h100/llama-3-8b/tp1"), 4)
	if err := mixed.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "mix CPU and GPU") {
		t.Errorf("CPU and GPU profiles together: %v", err)
	}
}

// measuredUpTo gives p measured step-time points up to prompts of prompt
// tokens (eight of them in one step) and decode batches of batch at context ctx, as `coordinator
// profile` writes them (values from p's own model, so the fit is exact).
func measuredUpTo(t *testing.T, p *perfmodel.Profile, prompt, batch, ctx int) *perfmodel.Profile {
	t.Helper()
	q := *p
	q.Points = nil
	for _, pt := range []perfmodel.Point{
		{Name: "prefill small", Prefill: []int{prompt / 4}},
		{Name: "prefill", Prefill: []int{prompt}},
		{Name: "prefill batch", Prefill: []int{prompt, prompt, prompt, prompt, prompt, prompt, prompt, prompt}},
		{Name: "decode", DecodeBatch: batch, DecodeContext: ctx},
	} {
		pt.Metric, pt.Check, pt.Source = perfmodel.MetricStepMs, perfmodel.CheckFit, "test"
		pt.Value = q.StepSeconds(pt.Batch()) * 1e3
		q.Points = append(q.Points, pt)
	}
	q.Measured = &perfmodel.Measurement{Tool: "test", Engine: "sim", Repeats: 1}
	q.Measured.Fit = q.SetFitErrors()
	if err := q.Validate(); err != nil {
		t.Fatal(err)
	}
	return &q
}

// A plan warns when the workload leaves the range its profile was
// measured over (here 256-token prompts on a profile measured up to 128),
// in the plan and its report; a profile measured over the whole workload
// gives no warning, and one without step-time points a note that its
// range is unknown (nothing to warn against).
func TestRangeWarnings(t *testing.T) {
	base := cpuProfile(t, 1, 1)
	narrow := measuredUpTo(t, base, 128, 64, 2048)
	p := mustRun(t, cpuConfig(t, narrow, nil, 2))
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "prompts up to 256 tokens (measured ≤ 128)") ||
		!strings.Contains(p.Warnings[0], "measured range of profile "+narrow.Name+" (prefill, decode, colocated)") {
		t.Errorf("warnings %q, want one on 256-token prompts beyond the measured 128", p.Warnings)
	}
	var b strings.Builder
	if err := WriteTable(&b, p); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "warning: the workload leaves the measured range") {
		t.Errorf("report lacks the warning:\n%s", b.String())
	}
	if p.Disaggregated == nil || p.Disaggregated.Steps.Prompt != 256 || p.Disaggregated.Steps.DecodeBatch < 1 {
		t.Errorf("largest steps %+v", p.Disaggregated)
	}

	// Decode batches beyond the measured ones warn too.
	tight := measuredUpTo(t, base, 512, 1, 2048)
	if p := mustRun(t, cpuConfig(t, tight, nil, 2)); p.Colocated == nil || p.Colocated.Steps.DecodeBatch <= 1 {
		t.Logf("colocated never batched two decodes: %+v", p.Colocated)
	} else if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "decode batches up to") || strings.Contains(p.Warnings[0], "prompts") {
		t.Errorf("warnings %q, want one on decode batches only", p.Warnings)
	}

	wide := measuredUpTo(t, base, 512, 64, 2048)
	if p := mustRun(t, cpuConfig(t, wide, nil, 2)); len(p.Warnings) != 0 {
		t.Errorf("a profile measured over the workload warns: %q", p.Warnings)
	}
	p = mustRun(t, cpuConfig(t, base, nil, 2))
	if len(p.Warnings) != 0 || !slices.ContainsFunc(p.Notes, func(n string) bool { return strings.Contains(n, "range its step times were checked over is unknown") }) {
		t.Errorf("profile without points: warnings %q, notes %q", p.Warnings, p.Notes)
	}
}
