package profiler

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner"
	"github.com/pdserve/pdserve/pkg/planner/plancli"
)

// fakeClock advances only when the sim engine sleeps: the engine's step
// times are exactly its model's, with no wall-clock noise.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.now = c.now.Add(d)
	}
	return ctx.Err()
}

// simProfile profiles the sim engine of the named profile on the fake
// clock (batches up to 32) and returns the built profile and the engine.
func simProfile(t *testing.T, name string) (*perfmodel.Profile, *sim.Engine) {
	t.Helper()
	e, clk := newFakeSim(t, name)
	res, err := Measure(t.Context(), e, Settings{Budget: time.Hour, Now: clk.Now, MaxBatch: 32})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Build(res, e.Spec(), Describe{Engine: "sim", EngineModel: name, Sim: e.Profile(), TimeScale: 1,
		Host: HostInfo(1), Budget: 3600, Tolerance: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	return p, e
}

func newFakeSim(t *testing.T, profile string) (*sim.Engine, *fakeClock) {
	t.Helper()
	clk := &fakeClock{now: time.Unix(1e9, 0)}
	e, err := sim.New(sim.Options{Profile: profile, Clock: clk.Now, Sleep: clk.Sleep, PayloadScale: 1.0 / 64})
	if err != nil {
		t.Fatal(err)
	}
	return e, clk
}

// Profiling the sim engine on a clock that only its model moves gives
// back the model: the pipeline (grid, medians, contexts, fit) is exact up
// to the rounding of a decode point's mean context to whole tokens (its
// sequences differ by the steps they took), here < 0.2%.
func TestProfileOfSimEngineRecoversItsModel(t *testing.T) {
	const name = "a100-80g/opt-13b/tp1"
	p, e := simProfile(t, name)
	want := e.Profile().DistServe // batches ≤ 32 < its threshold 95: the small-batch decode set
	for i := range 3 {
		for _, c := range [][2]float64{{p.DistServe.Prefill[i], want.Prefill[i]}, {p.DistServe.DecodeSmall[i], want.DecodeSmall[i]}} {
			if math.Abs(c[0]/c[1]-1) > 2e-3 {
				t.Errorf("fitted %+v, want prefill %v decode %v", p.DistServe, want.Prefill, want.DecodeSmall)
			}
		}
	}
	if f := p.Measured.Fit; f.MaxRelErr > 2e-3 || f.Points != len(p.Points) {
		t.Errorf("fit error %+v, want ~0 over every point", f)
	}
	kinds := map[string]int{}
	for _, pt := range p.Points {
		kinds[strings.Fields(pt.Name)[0]]++
	}
	if kinds["prefill"] < 5 || kinds["decode"] < 10 || kinds["mixed"] < 3 {
		t.Errorf("points by kind %v: the grid is too small", kinds)
	}
	if p.Name != name || p.KVBytesPerToken() != e.Profile().KVBytesPerToken() {
		t.Errorf("name %s, KV/token %d: want the sim profile's", p.Name, p.KVBytesPerToken())
	}
	if !strings.Contains(p.Measured.Grid, "context up to") || strings.Contains(p.Measured.Grid, "left out") {
		t.Errorf("grid %q: want all of it measured", p.Measured.Grid)
	}
}

// A small budget shrinks the grid: fewer points, the rest named, and the
// time spent (on the sim's own clock) stays near the budget.
func TestMeasureShrinksTheGridToTheBudget(t *testing.T) {
	const name = "a100-80g/opt-13b/tp1"
	full := func() int {
		e, clk := newFakeSim(t, name)
		res, err := Measure(t.Context(), e, Settings{Budget: time.Hour, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Points)
	}()
	e, clk := newFakeSim(t, name)
	budget := 5 * time.Second
	var seen []Progress
	res, err := Measure(t.Context(), e, Settings{Budget: budget, Now: clk.Now, Progress: func(p Progress) { seen = append(seen, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) >= full || !strings.Contains(res.Grid, "left out to fit the budget") {
		t.Errorf("%d points of %d, grid %q: want fewer, the rest named", len(res.Points), full, res.Grid)
	}
	if res.Elapsed > 2*budget {
		t.Errorf("took %v of a %v budget", res.Elapsed, budget)
	}
	if len(seen) != len(res.Points) || seen[len(seen)-1].Done != len(res.Points) {
		t.Errorf("progress reported %d times for %d points", len(seen), len(res.Points))
	}
	if _, err := Build(res, e.Spec(), Describe{Engine: "sim", EngineModel: name, Sim: e.Profile(), TimeScale: 1, Host: HostInfo(1), Tolerance: 0.1}); err != nil {
		t.Fatalf("a shrunk grid still fits: %v", err)
	}
}

func TestHostParsing(t *testing.T) {
	cpuinfo := "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R)  Xeon(R) Processor @ 2.1GHz\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Processor @ 2.1GHz\n"
	if got := cpuModel([]byte(cpuinfo)); got != "Intel(R) Xeon(R) Processor @ 2.1GHz" {
		t.Errorf("cpuModel = %q", got)
	}
	if got := cpuModel([]byte("processor\t: 0\nCPU part\t: 0xd0c\n")); got != "0xd0c" {
		t.Errorf("cpuModel (arm) = %q", got)
	}
	if got := memTotal([]byte("MemTotal:       16315000 kB\nMemFree: 1 kB\n")); got != 16315000*1024 {
		t.Errorf("memTotal = %d", got)
	}
	for in, want := range map[string]string{"random-tiny-llama": "random-tiny-llama", "Qwen2.5 0.5B Instruct": "qwen2.5-0.5b-instruct", "NVIDIA H200": "nvidia-h200"} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMainRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{},                                   // no --out
		{"--out", "x.json", "--budget", "0"}, // no budget
		{"--out", "x.json", "--engine", "ref"},
		{"--out", "x.json", "--engine", "sim", "--profile", "a100-80g/opt-13b/tp1", "--repeats", "0"},
		{"--out", "x.json", "--engine", "llamacpp"}, // no model
		{"--refit", "old.json"}, // no --out
	} {
		var out, errs bytes.Buffer
		if code := Main(t.Context(), args, &out, &errs); code != 2 {
			t.Errorf("Main(%q) = %d, want 2; stderr %s", args, code, errs.String())
		}
	}
}

// coordinator profile on a tiny random-weight llama.cpp model finishes in
// seconds and writes a file that every reader takes: the planner (its Go
// API and the plan CLI, which recommends a split of two cores), and the
// sim engine. Under CI=true a missing llama.cpp fails the test.
func TestProfileTinyLlamaModelAndPlanOnIt(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	dir := t.TempDir()
	model := filepath.Join(dir, "tiny.gguf")
	o, err := gguf.Shape("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	o.Vocab = filepath.Join(vocab, o.Vocab)
	if err := gguf.WriteRandom(model, o); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "cpu-t1.json")
	var stdout, stderr bytes.Buffer
	args := []string{"--engine", "llamacpp", "--model", model, "--llama-lib", lib, "--engine-threads", "1",
		"--ctx-size", "1024", "--max-seqs", "9", "--max-tokens", "256", "--max-batch", "8", "--repeats", "2",
		"--budget", "30s", "--out", out}
	if code := Main(t.Context(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("profile exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	t.Logf("coordinator profile:\n%s%s", stdout.String(), stderr.String())
	p, err := perfmodel.Resolve(out)
	if err != nil {
		t.Fatal(err)
	}
	if !p.CPU() || p.Threads != 1 || !strings.HasPrefix(p.Name, "cpu/") || !strings.HasSuffix(p.Name, "/t1") || p.Measured == nil {
		t.Fatalf("profile %s device %q threads %d measured %v", p.Name, p.Device, p.Threads, p.Measured != nil)
	}
	h := p.Measured.Hardware
	if h.Threads != 1 || h.LogicalCPUs < 1 || (h.CPU == "" && fileExists("/proc/cpuinfo")) {
		t.Errorf("hardware %+v", h)
	}
	for _, pt := range p.Points {
		if pt.RelErr == nil || pt.Samples != 2 {
			t.Errorf("point %s: rel_err %v, samples %d", pt.Name, pt.RelErr, pt.Samples)
		}
	}
	// 2 layers × 2 KV heads × head dim 16 × K and V × f16.
	if got := p.KVBytesPerToken(); got != 2*2*16*2*2 {
		t.Errorf("KV bytes per token %d, want 256", got)
	}
	if p.MaxKVTokens() != 1024 || p.Measured.CtxSize != 1024 {
		t.Errorf("KV pool %d tokens, ctx %d: want the engine's 1024", p.MaxKVTokens(), p.Measured.CtxSize)
	}

	// The planner's Go API on it, on two cores.
	codec, err := planner.CodecByName("none")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := planner.Run(t.Context(), &planner.Config{
		Prefill: p, Workload: planner.Fixed(64, 16), Codec: codec,
		SLO:             planner.SLO{TTFT: time.Second, TPOT: 200 * time.Millisecond, Attainment: 0.9},
		LinkBytesPerSec: 1e9, GPUBudget: 2, Requests: 100, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Unit != planner.UnitCore || plan.Recommended == "" || plan.Disaggregated == nil || plan.Disaggregated.GPUs != 2 {
		t.Errorf("plan unit %q, recommended %q, disaggregated %+v", plan.Unit, plan.Recommended, plan.Disaggregated)
	}

	// The plan CLI, its core budget from the profile's machine.
	stdout.Reset()
	stderr.Reset()
	code := plancli.Run(t.Context(), []string{"--profile", out, "--workload", "fixed:64/16", "--slo-ttft", "1s", "--slo-tpot", "200ms",
		"--gpu-budget", "2", "--requests", "100", "--output", "json"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("plan exit %d: %s", code, stderr.String())
	}
	if s := stdout.String(); !strings.Contains(s, `"unit": "core"`) || !strings.Contains(s, `"recommended"`) {
		t.Errorf("plan JSON lacks the core unit or a recommendation:\n%s", s)
	}

	// The sim engine runs on it.
	e, err := sim.New(sim.Options{Profile: out, TimeScale: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	if e.Profile().Name != p.Name {
		t.Errorf("sim profile %s", e.Profile().Name)
	}
}

func fileExists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}

func TestHostInfoCountsTheMachinesCPUs(t *testing.T) {
	h := HostInfo(1)
	if h.LogicalCPUs < 1 || h.Threads != 1 {
		t.Errorf("host %+v", h)
	}
}

// --refit fits a measured profile's stored points again: a profile whose
// coefficients an older fit wrote (here: b_p 20% off, with the rel_err and
// summary that went with it) comes back with this version's coefficients, every
// rel_err and summary recomputed, the method named, and nothing else
// changed; a profile that was not measured is refused with exit 1.
func TestMainRefit(t *testing.T) {
	const name = "a100-80g/opt-13b/tp1"
	p, _ := simProfile(t, name)
	want, err := perfmodel.FitDistServe(p.Points)
	if err != nil {
		t.Fatal(err)
	}
	const oldMethod = "an older fit"
	old := *p
	oldDS := *p.DistServe
	oldDS.Prefill[1] *= 1.2
	old.DistServe = &oldDS
	old.Points = append([]perfmodel.Point(nil), p.Points...)
	m := *p.Measured
	old.Measured = &m
	old.Measured.Fit = old.SetFitErrors()
	old.Measured.Fit.Method = oldMethod
	old.Calibration = strings.Replace(p.Calibration, perfmodel.FitMethod, oldMethod, 1)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "old.json"), filepath.Join(dir, "new.json")
	if err := old.WriteFile(in); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := Main(t.Context(), []string{"--refit", in, "--out", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("refit exit %d: %s", code, stderr.String())
	}
	got, err := perfmodel.LoadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if *got.DistServe != *want {
		t.Errorf("refitted %+v, want %+v", *got.DistServe, *want)
	}
	if got.Measured.Fit.Method != perfmodel.FitMethod || !strings.Contains(got.Calibration, perfmodel.FitMethod) || strings.Contains(got.Calibration, oldMethod) {
		t.Errorf("method %q, calibration %q", got.Measured.Fit.Method, got.Calibration)
	}
	if f := got.Measured.Fit; f.MaxRelErr > 2e-3 || old.Measured.Fit.MaxRelErr < 0.05 {
		t.Errorf("fit error %+v after, %+v before: want the refit's ~0", f, old.Measured.Fit)
	}
	if got.Name != p.Name || len(got.Points) != len(p.Points) || got.Measured.Hardware != p.Measured.Hardware {
		t.Errorf("refit changed what it should keep: %s, %d points, %+v", got.Name, len(got.Points), got.Measured.Hardware)
	}

	// A published profile has no measured points to refit.
	pub, err := perfmodel.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	pubFile := filepath.Join(dir, "published.json")
	if err := pub.WriteFile(pubFile); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	if code := Main(t.Context(), []string{"--refit", pubFile, "--out", out}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "not a measured profile") {
		t.Errorf("refit of a published profile: exit %d, stderr %q; want 1 and a clear error", code, stderr.String())
	}
}
