package perfmodel

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// cpuTruth are coefficients of the size a 1-thread CPU shows for a
// 0.5B-parameter model, ms, with a mixed-step interaction of the size
// llama.cpp shows (a fixed 30 ms, 0.09 ms per decode context token, 3e-4
// ms per chunk token × decode context token) and a cross-prompt cost of
// 1e-4 ms per prompt token × another prompt's cell (7% of a 4×256 step).
var cpuTruth = DistServe{
	Prefill:             [3]float64{6, 0.9, 2e-4},
	DecodeSmall:         [3]float64{25, 0.004, 1.8},
	DecodeLarge:         [3]float64{25, 0.004, 1.8},
	LargeBatchThreshold: 1,
	Mixed:               [3]float64{30, 0.09, 3e-4},
	PrefillCross:        1e-4,
}

// twoRegimeTruth has llama.cpp's CPU decode shape: a batch of one token
// runs other kernels, cheaper per step than the line through larger
// batches (B ≥ 2) predicts.
var twoRegimeTruth = func() DistServe {
	d := cpuTruth
	d.DecodeSmall = [3]float64{20, 0.003, 0}
	d.DecodeLarge = [3]float64{30, 0.005, 1.2}
	d.LargeBatchThreshold = 2
	return d
}()

// syntheticPoints returns step_ms points of the grid coordinator profile
// measures, valued by truth, each multiplied by 1 + N(0, noise²) drawn
// from a fixed seed.
func syntheticPoints(truth DistServe, noise float64, seed uint64) []Point {
	p := &Profile{Form: FormDistServe, DistServe: &truth}
	rng := rand.New(rand.NewPCG(seed, 1))
	var pts []Point
	add := func(name string, pt Point) {
		pt.Name, pt.Metric, pt.Check, pt.Source = name, MetricStepMs, CheckFit, "synthetic"
		v := p.StepSeconds(pt.Batch()) * 1e3
		pt.Value = v * (1 + noise*rng.NormFloat64())
		pts = append(pts, pt)
	}
	for l := 16; l <= 2048; l *= 2 {
		add(fmt.Sprintf("prefill 1x%d", l), Point{Prefill: []int{l}})
		if l <= 256 {
			add(fmt.Sprintf("prefill 2x%d", l), Point{Prefill: []int{l, l}})
			add(fmt.Sprintf("prefill 4x%d", l), Point{Prefill: []int{l, l, l, l}})
		}
	}
	for _, n := range []int{32, 128, 512, 2048} {
		for b := 1; b <= 32; b *= 2 {
			add(fmt.Sprintf("decode %dx%d", b, n), Point{DecodeBatch: b, DecodeContext: n})
		}
	}
	for _, n := range []int{32, 512} {
		for _, l := range []int{16, 128, 384} {
			for _, b := range []int{2, 4, 16} {
				if b*n <= 2048 { // a 4096-cell cache, as the profiler limits it
					add(fmt.Sprintf("mixed %d+%dx%d", l, b, n), Point{Prefill: []int{l}, DecodeBatch: b, DecodeContext: n})
				}
			}
		}
	}
	return pts
}

// The fit recovers known coefficients from noisy points: with 2% noise
// (fixed seed) every prefill and decode coefficient lies within 12% of the
// truth, the mixed-step interaction's (m0, m1, m2) within 15% (fewer
// points fix them), the cross-prompt coefficient within 50% (it is at most
// 7% of any step, so 2% noise moves it most), and the fitted model within
// 4% of the noise-free step time at every point.
func TestFitDistServeRecoversCoefficients(t *testing.T) {
	const noise, coefTol, mixedTol, crossTol, stepTol = 0.02, 0.12, 0.15, 0.5, 0.04
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			pts := syntheticPoints(cpuTruth, noise, seed)
			got, err := FitDistServe(pts)
			if err != nil {
				t.Fatal(err)
			}
			want := [][3]float64{cpuTruth.Prefill, cpuTruth.DecodeSmall}
			for g, have := range [][3]float64{got.Prefill, got.DecodeSmall} {
				for i := range 3 {
					if e := math.Abs(have[i]/want[g][i] - 1); e > coefTol {
						t.Errorf("coefficient %d of group %d = %.6g, want %.6g (±%.0f%%, off by %.1f%%)", i, g, have[i], want[g][i], 100*coefTol, 100*e)
					}
				}
			}
			for i := range 3 {
				if e := math.Abs(got.Mixed[i]/cpuTruth.Mixed[i] - 1); e > mixedTol {
					t.Errorf("mixed coefficient m%d = %.6g, want %.6g (±%.0f%%, off by %.1f%%)", i, got.Mixed[i], cpuTruth.Mixed[i], 100*mixedTol, 100*e)
				}
			}
			if e := math.Abs(got.PrefillCross/cpuTruth.PrefillCross - 1); e > crossTol {
				t.Errorf("cross-prompt coefficient = %.6g, want %.6g (±%.0f%%, off by %.1f%%)", got.PrefillCross, cpuTruth.PrefillCross, 100*crossTol, 100*e)
			}
			if got.DecodeLarge != got.DecodeSmall || got.LargeBatchThreshold != 1 {
				t.Errorf("want one decode regime, got %+v", got)
			}
			fit := &Profile{Form: FormDistServe, DistServe: got}
			truth := &Profile{Form: FormDistServe, DistServe: &cpuTruth}
			for _, pt := range pts {
				m, w := fit.StepSeconds(pt.Batch()), truth.StepSeconds(pt.Batch())
				if e := math.Abs(m/w - 1); e > stepTol {
					t.Errorf("%s: model %.4g ms, truth %.4g ms (%.1f%% > %.0f%%)", pt.Name, m*1e3, w*1e3, 100*e, 100*stepTol)
				}
			}
		})
	}
}

// Without noise the fit is exact.
func TestFitDistServeExactWithoutNoise(t *testing.T) {
	got, err := FitDistServe(syntheticPoints(cpuTruth, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		for _, c := range [][2]float64{{got.Prefill[i], cpuTruth.Prefill[i]}, {got.DecodeSmall[i], cpuTruth.DecodeSmall[i]}, {got.Mixed[i], cpuTruth.Mixed[i]}} {
			if math.Abs(c[0]/c[1]-1) > 1e-6 {
				t.Errorf("got %+v, want %+v", got, cpuTruth)
			}
		}
	}
	if math.Abs(got.PrefillCross/cpuTruth.PrefillCross-1) > 1e-6 || got.LargeBatchThreshold != 1 {
		t.Errorf("cross %.6g, threshold %d: want %.6g, 1", got.PrefillCross, got.LargeBatchThreshold, cpuTruth.PrefillCross)
	}
}

// Two decode regimes are found where the points have them: the threshold
// is the truth's and, with 2% noise, every fixed and per-sequence cost
// lies within 12% of the truth and the per-context costs within 25% (a
// few ms of a step). The batch-of-one regime's per-sequence cost is the
// same column as its fixed cost at B = 1, so their sum is what is
// compared. Exact without noise.
func TestFitDistServeFindsTwoDecodeRegimes(t *testing.T) {
	truth := twoRegimeTruth
	for _, tc := range []struct {
		noise float64
		seed  uint64
		tol   float64
	}{{0, 1, 1e-6}, {0.02, 1, 0.12}, {0.02, 2, 0.12}, {0.02, 3, 0.12}} {
		ctxTol := tc.tol
		if tc.noise > 0 {
			ctxTol = 0.25
		}
		t.Run(fmt.Sprintf("noise %g seed %d", tc.noise, tc.seed), func(t *testing.T) {
			got, err := FitDistServe(syntheticPoints(truth, tc.noise, tc.seed))
			if err != nil {
				t.Fatal(err)
			}
			if got.LargeBatchThreshold != truth.LargeBatchThreshold {
				t.Fatalf("threshold %d, want %d: %+v", got.LargeBatchThreshold, truth.LargeBatchThreshold, got)
			}
			for _, c := range [][3]float64{
				{got.DecodeSmall[0] + got.DecodeSmall[2], truth.DecodeSmall[0] + truth.DecodeSmall[2], tc.tol},
				{got.DecodeSmall[1], truth.DecodeSmall[1], ctxTol},
				{got.DecodeLarge[0], truth.DecodeLarge[0], tc.tol},
				{got.DecodeLarge[1], truth.DecodeLarge[1], ctxTol},
				{got.DecodeLarge[2], truth.DecodeLarge[2], tc.tol},
			} {
				if math.Abs(c[0]/c[1]-1) > c[2] {
					t.Errorf("decode small %v large %v, want %v %v", got.DecodeSmall, got.DecodeLarge, truth.DecodeSmall, truth.DecodeLarge)
					break
				}
			}
		})
	}
}

// Noise alone does not split one decode regime in two: ten noisy draws of
// a one-regime truth keep one regime.
func TestFitDistServeNoiseKeepsOneRegime(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		got, err := FitDistServe(syntheticPoints(cpuTruth, 0.02, seed))
		if err != nil {
			t.Fatal(err)
		}
		if got.LargeBatchThreshold != 1 || got.DecodeSmall != got.DecodeLarge {
			t.Errorf("seed %d: threshold %d, decode small %v large %v: want one regime", seed, got.LargeBatchThreshold, got.DecodeSmall, got.DecodeLarge)
		}
	}
}

// A term the data do not support comes out 0, never negative.
func TestFitDistServeNonNegative(t *testing.T) {
	truth := cpuTruth
	truth.Prefill[2] = 0 // no quadratic term
	pts := syntheticPoints(truth, 0.03, 7)
	got, err := FitDistServe(pts)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range append(append(got.Prefill[:], got.DecodeSmall[:]...), got.Mixed[:]...) {
		if v < 0 {
			t.Fatalf("negative coefficient in %+v", got)
		}
	}
}

// Mixed points that cost no more than their parts give no interaction,
// and without mixed points there is none to fit.
func TestFitDistServeMixedTermZeroWithoutInteraction(t *testing.T) {
	truth := cpuTruth
	truth.Mixed = [3]float64{}
	got, err := FitDistServe(syntheticPoints(truth, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got.Mixed {
		if v > 1e-9*max(cpuTruth.Mixed[i], 1) {
			t.Errorf("mixed coefficients %v from points without interaction, want 0", got.Mixed)
		}
	}
	var pure []Point
	for _, pt := range syntheticPoints(cpuTruth, 0.02, 1) {
		if b := pt.Batch(); len(b.Prefill) == 0 || len(b.Decode) == 0 {
			pure = append(pure, pt)
		}
	}
	if got, err = FitDistServe(pure); err != nil || got.Mixed != [3]float64{} {
		t.Errorf("no mixed points: mixed %v, err %v; want 0", got.Mixed, err)
	}
}

func TestFitDistServeNeedsPoints(t *testing.T) {
	pts := []Point{
		{Metric: MetricStepMs, Prefill: []int{16}, Value: 10},
		{Metric: MetricStepMs, Prefill: []int{32}, Value: 20},
		{Metric: MetricStepMs, DecodeBatch: 1, DecodeContext: 16, Value: 5},
	}
	if _, err := FitDistServe(pts); !errors.Is(err, ErrFit) {
		t.Fatalf("err = %v, want ErrFit", err)
	}
}

// measuredProfile is a CPU profile as coordinator profile writes it.
func measuredProfile(t *testing.T) *Profile {
	t.Helper()
	pts := syntheticPoints(cpuTruth, 0.02, 1)
	d, err := FitDistServe(pts)
	if err != nil {
		t.Fatal(err)
	}
	p := &Profile{
		Name: "cpu/random-qwen2/t2", GPU: "cpu", Model: "random-qwen2", TP: 1, Device: DeviceCPU, Threads: 2,
		Spec: ModelShape{Params: 5e8, Layers: 24, Hidden: 896, Heads: 14, KVHeads: 2, HeadDim: 64,
			Intermediate: 4864, Vocab: 151936, MaxSeqLen: 4096, RopeTheta: 1e6},
		KVBytes:   12288,
		Form:      FormDistServe,
		DistServe: d,
		Memory:    Memory{MaxKVTokens: 4096},
		Source:    "synthetic points", Calibration: "fit", Tolerance: 0.2,
		Points: pts,
		Measured: &Measurement{Tool: "test", Engine: "llamacpp", EngineModel: "x.gguf", KVType: "f16", CtxSize: 4096,
			Hardware: Host{CPU: "Some CPU", LogicalCPUs: 2, Threads: 2, OS: "linux", Arch: "amd64"},
			BudgetS:  120, ElapsedS: 100, Repeats: 3, Grid: "all"},
	}
	p.Measured.Fit = p.SetFitErrors()
	p.Measured.Fit.Method = FitMethod
	return p
}

// A measured profile written to a file reads back equal, by path.
func TestMeasuredProfileRoundTrips(t *testing.T) {
	p := measuredProfile(t)
	fn := filepath.Join(t.TempDir(), "cpu.json")
	if err := p.WriteFile(fn); err != nil {
		t.Fatal(err)
	}
	got, err := Resolve(fn)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p, got); diff != "" {
		t.Errorf("round trip (-wrote +read):\n%s", diff)
	}
	if got.Units() != 2 || got.UnitName() != "core" || got.MaxKVTokens() != 4096 || got.KVBytesPerToken() != 12288 {
		t.Errorf("units %d %s, max KV %d, KV/token %d", got.Units(), got.UnitName(), got.MaxKVTokens(), got.KVBytesPerToken())
	}
	if f := got.Measured.Fit; f.Points != len(p.Points) || !(f.TotalRelErr > 0 && f.TotalRelErr < 0.05) {
		t.Errorf("fit summary %+v", f)
	}
}

func TestMeasuredProfileValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Profile)
	}{
		{"stale rel_err", func(p *Profile) { p.DistServe.Prefill[1] *= 1.1 }},
		{"missing rel_err", func(p *Profile) { p.Points[0].RelErr = nil }},
		{"stale total", func(p *Profile) { p.Measured.Fit.TotalRelErr += 0.01 }},
		{"negative mixed term", func(p *Profile) { p.DistServe.Mixed[1] = -0.01 }},
		{"negative cross term", func(p *Profile) { p.DistServe.PrefillCross = -1e-5 }},
		{"NaN cross term", func(p *Profile) { p.DistServe.PrefillCross = math.NaN() }},
		{"cpu without threads", func(p *Profile) { p.Threads = 0 }},
		{"cpu name", func(p *Profile) { p.Name = "cpu/random-qwen2/tp1" }},
		{"cpu roofline", func(p *Profile) { p.Form = FormRoofline }},
		{"no memory", func(p *Profile) { p.Memory.MaxKVTokens = 0 }},
		{"unknown device", func(p *Profile) { p.Device = "tpu" }},
		{"threads on a gpu", func(p *Profile) { p.Device = DeviceGPU; p.Name = "cpu/random-qwen2/tp1" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := measuredProfile(t)
			tc.mod(p)
			if err := p.Validate(); !errors.Is(err, ErrInvalidProfile) {
				t.Errorf("Validate = %v, want ErrInvalidProfile", err)
			}
		})
	}
	if err := measuredProfile(t).Validate(); err != nil {
		t.Fatalf("valid profile: %v", err)
	}
}

// A profile without the mixed-step and cross-prompt terms (as written
// before they existed) has no mixed_ms or prefill_cross_ms in its JSON,
// reads back equal, and prices a mixed step as max(a_p, a_d) plus the
// parts' marginal costs; one with the terms carries them through the
// file.
func TestMeasuredProfileRoundTripsWithAndWithoutMixedTerm(t *testing.T) {
	for _, withTerm := range []bool{false, true} {
		t.Run(fmt.Sprint("term ", withTerm), func(t *testing.T) {
			p := measuredProfile(t)
			if !withTerm {
				p.DistServe.Mixed = [3]float64{}
				p.DistServe.PrefillCross = 0
				p.Measured.Fit = p.SetFitErrors()
				p.Measured.Fit.Method = FitMethod
			} else if p.DistServe.Mixed == [3]float64{} || p.DistServe.PrefillCross == 0 {
				t.Fatal("the fitted profile lacks the mixed or the cross-prompt term")
			}
			data, err := p.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{`"mixed_ms"`, `"prefill_cross_ms"`} {
				if got := bytes.Contains(data, []byte(key)); got != withTerm {
					t.Errorf("JSON has %s: %v, want %v", key, got, withTerm)
				}
			}
			got, err := Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(p, got); diff != "" {
				t.Errorf("round trip (-wrote +read):\n%s", diff)
			}
			d := got.DistServe
			b := Batch{Prefill: []int{128}, Decode: []int{300, 500}}
			want := max(d.Prefill[0], d.DecodeSmall[0]) + d.Prefill[1]*128 + d.Prefill[2]*128*128 +
				d.DecodeSmall[1]*800 + d.DecodeSmall[2]*2
			if withTerm {
				want += d.Mixed[0] + d.Mixed[1]*800 + d.Mixed[2]*128*800
			}
			if m := got.StepSeconds(b) * 1e3; math.Abs(m/want-1) > 1e-12 {
				t.Errorf("mixed step %.6g ms, want %.6g", m, want)
			}
		})
	}
}

// Pricing uses the mixed-step term, on mixed steps only: it fails if the
// term is ignored.
func TestMixedTermIsPriced(t *testing.T) {
	with := &Profile{Form: FormDistServe, DistServe: &cpuTruth}
	plain := cpuTruth
	plain.Mixed = [3]float64{}
	without := &Profile{Form: FormDistServe, DistServe: &plain}
	for _, tc := range []struct {
		b     Batch
		extra float64 // ms
	}{
		{Batch{Prefill: []int{256}, PrefillContext: []int{256}, Decode: []int{100, 200, 300}}, 30 + 0.09*600 + 3e-4*256*600},
		{Batch{Prefill: []int{16, 32}, Decode: []int{40}}, 30 + 0.09*40 + 3e-4*48*40},
		{Batch{Prefill: []int{256}}, 0},
		{Batch{Decode: []int{100, 200}}, 0},
	} {
		got := (with.StepSeconds(tc.b) - without.StepSeconds(tc.b)) * 1e3
		if math.Abs(got-tc.extra) > 1e-9 {
			t.Errorf("%+v: the mixed term adds %.6g ms, want %.6g", tc.b, got, tc.extra)
		}
	}
}

// Pricing uses the cross-prompt term on every step of several prompts,
// mixed or not, counting cached context as cells: it fails if the term
// is ignored or counts a prompt against itself.
func TestCrossTermIsPriced(t *testing.T) {
	with := &Profile{Form: FormDistServe, DistServe: &cpuTruth}
	plain := cpuTruth
	plain.PrefillCross = 0
	without := &Profile{Form: FormDistServe, DistServe: &plain}
	x := cpuTruth.PrefillCross
	for _, tc := range []struct {
		b     Batch
		extra float64 // ms
	}{
		{Batch{Prefill: []int{16, 32}}, x * (16*32 + 32*16)},
		{Batch{Prefill: []int{256, 256, 256, 256}}, x * 4 * 256 * 768},
		{Batch{Prefill: []int{100, 20}, PrefillContext: []int{50}}, x * (100*20 + 20*150)},
		{Batch{Prefill: []int{16, 32}, Decode: []int{40}}, x * (16*32 + 32*16)},
		{Batch{Prefill: []int{1024}}, 0},
		{Batch{Prefill: []int{256}, PrefillContext: []int{256}, Decode: []int{100}}, 0},
		{Batch{Decode: []int{100, 200}}, 0},
	} {
		got := (with.StepSeconds(tc.b) - without.StepSeconds(tc.b)) * 1e3
		if math.Abs(got-tc.extra) > 1e-9 {
			t.Errorf("%+v: the cross-prompt term adds %.6g ms, want %.6g", tc.b, got, tc.extra)
		}
	}
}
