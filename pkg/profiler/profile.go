package profiler

import (
	"fmt"
	"math"
	"path/filepath"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// Describe says what ran, for the profile's name, source and record.
type Describe struct {
	Engine      string // llamacpp, ref or sim
	EngineModel string // the GGUF file, ref preset or sim profile
	// HardwareName and ModelName name the profile (HW/MODEL/tN or
	// HW/MODEL/tpN); "" derives them: "cpu" (or the GPU's name), and the
	// model's name.
	HardwareName, ModelName string
	Host                    perfmodel.Host
	// KVTokens is one worker's KV pool the profile states, tokens (> 0);
	// llama.cpp: its cache's cells.
	KVTokens int64
	// Sim, for a sim engine, is the profile it ran: the measured profile
	// keeps its device, hardware and memory, and TimeScale divides the
	// measured times back to the modeled GPU's.
	Sim       *perfmodel.Profile
	TimeScale float64
	Budget    float64 // seconds
	Tolerance float64 // the largest |rel_err| a point should have, for the profile's check
}

// Build fits the DistServe form to the measured points and returns the
// profile: the points with their rel_err, the coefficients, the total
// error and the hardware. Errors: perfmodel.ErrFit (too few points),
// perfmodel.ErrInvalidProfile.
func Build(res *Result, spec engine.ModelSpec, d Describe) (*perfmodel.Profile, error) {
	pts := append([]perfmodel.Point(nil), res.Points...)
	if d.Sim != nil && d.TimeScale > 0 && d.TimeScale != 1 {
		for i := range pts {
			pts[i].Value /= d.TimeScale
		}
	}
	ds, err := perfmodel.FitDistServe(pts)
	if err != nil {
		return nil, fmt.Errorf("profiler: %w", err)
	}
	model := d.ModelName
	if model == "" {
		model = slug(spec.Name)
		if d.Sim != nil {
			model = d.Sim.Model
		}
		if model == "" {
			model = slug(filepath.Base(d.EngineModel))
		}
	}
	p := &perfmodel.Profile{
		Model: model, TP: 1,
		Spec:      shapeOf(spec),
		KVBytes:   res.KVBytesPerToken,
		Form:      perfmodel.FormDistServe,
		DistServe: ds,
		Tolerance: d.Tolerance,
		Points:    pts,
	}
	what := fmt.Sprintf("%s engine running %s", d.Engine, d.EngineModel)
	switch {
	case d.Sim != nil:
		s := d.Sim
		p.Device, p.GPU, p.TP, p.Threads, p.Hardware, p.Memory = s.Device, s.GPU, s.TP, s.Threads, s.Hardware, s.Memory
		p.Spec = s.Spec // the modeled model's true shape
		p.KVBytes = s.KVBytesPerToken()
		what += fmt.Sprintf(" (time scale %g; times divided by it)", d.TimeScale)
	case d.Host.GPU != "":
		p.Device, p.GPU = perfmodel.DeviceGPU, slug(d.Host.GPU)
		p.Memory = perfmodel.Memory{MaxKVTokens: d.KVTokens}
		what += " on " + d.Host.GPU
	default:
		p.Device, p.GPU, p.TP, p.Threads = perfmodel.DeviceCPU, "cpu", 1, d.Host.Threads
		p.Memory = perfmodel.Memory{MaxKVTokens: d.KVTokens}
		what += fmt.Sprintf(" on %s, %d threads", cpuName(d.Host.CPU), d.Host.Threads)
	}
	if d.HardwareName != "" {
		p.GPU = d.HardwareName
	}
	p.Name = p.WantName()
	if p.KVBytes == int64(p.Spec.KVBytesPerToken()) {
		p.KVBytes = 0 // the bf16 size the shape gives anyway
	}
	p.Source = "measured by coordinator profile: " + what
	p.Calibration = fmt.Sprintf("each point is the median of %d timed steps; coefficients fitted to all points (%s); KV bytes per token %s",
		res.Repeats, perfmodel.FitMethod, res.KVNote)
	p.Measured = &perfmodel.Measurement{
		Tool: "coordinator profile", Engine: d.Engine, EngineModel: d.EngineModel, KVType: spec.KVDType.String(),
		Hardware: d.Host, BudgetS: d.Budget, ElapsedS: math.Round(res.Elapsed.Seconds()*1000) / 1000,
		Repeats: res.Repeats, Grid: res.Grid,
	}
	if d.Sim == nil {
		p.Measured.CtxSize = int(d.KVTokens)
	}
	p.Measured.Fit = p.SetFitErrors()
	p.Measured.Fit.Method = perfmodel.FitMethod
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("profiler: %w", err)
	}
	return p, nil
}

func cpuName(s string) string {
	if s == "" {
		return "an unknown CPU"
	}
	return s
}

// shapeOf is the model shape of an engine's spec. The parameter count is
// estimated from the shape (attention, SwiGLU MLP, norms, an untied
// embedding and head): the DistServe form does not use it.
func shapeOf(s engine.ModelSpec) perfmodel.ModelShape {
	h, q, kv, ffn := float64(s.Hidden), float64(s.Heads*s.HeadDim), float64(s.KVHeads*s.HeadDim), float64(max(s.Intermediate, 1))
	perLayer := h*q + 2*h*kv + q*h + 3*h*ffn + 2*h
	params := float64(s.Layers)*perLayer + 2*float64(s.Vocab)*h + h
	return perfmodel.ModelShape{
		Params: math.Round(params), Layers: s.Layers, Hidden: s.Hidden, Heads: s.Heads, KVHeads: s.KVHeads,
		HeadDim: s.HeadDim, Intermediate: max(s.Intermediate, 1), Vocab: s.Vocab, MaxSeqLen: s.MaxSeqLen,
		RopeTheta: s.RopeTheta,
	}
}
