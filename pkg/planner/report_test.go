package planner

import (
	"bytes"
	"encoding/json"
	"image/png"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var (
	smallMu    sync.Mutex
	smallPlans = map[string]*Plan{}
)

// smallPlan returns a quick plan of the OPT-13B workload on profile, one
// per test binary (plans are not modified after Run).
func smallPlan(t *testing.T, profile string) *Plan {
	t.Helper()
	smallMu.Lock()
	defer smallMu.Unlock()
	if p, ok := smallPlans[profile]; ok {
		return p
	}
	cfg := opt13(t)
	cfg.Prefill = mustProfile(t, profile)
	cfg.Requests, cfg.GPUBudget = 100, 4
	cfg.Limits.ChunkTokens = 512
	p := mustRun(t, cfg)
	smallPlans[profile] = p
	return p
}

// The JSON carries the fields the CLI promises, with one budget key per
// term.
func TestWriteJSON(t *testing.T) {
	p := smallPlan(t, "a100-80g/opt-13b/tp1")
	var buf bytes.Buffer
	if err := WriteJSON(&buf, p); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	for _, k := range []string{"prefill_replicas", "decode_replicas", "colocated_replicas", "goodput_per_gpu", "cost_per_1k_tokens",
		"ttft_budget_ms", "limits", "candidates", "first_token_policy", "feasible", "recommended"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	keys := func(v any) []string { return slices.Sorted(maps.Keys(v.(map[string]any))) }
	want := map[string][]string{
		"goodput_per_gpu":    {"colocated", "disaggregated"},
		"cost_per_1k_tokens": {"colocated", "disaggregated"},
		"ttft_budget_ms":     {"first_token", "ingress", "kv_transfer", "prefill", "queue", "total"},
		"limits":             {"colocated_chunk_tokens", "max_decode_batch", "max_prefill_tokens"},
	}
	for k, w := range want {
		if diff := cmp.Diff(w, keys(m[k])); diff != "" {
			t.Errorf("%s keys (-want +got):\n%s", k, diff)
		}
	}
	if m["prefill_replicas"].(float64) != float64(p.PrefillReplicas) || m["goodput_per_gpu"].(map[string]any)["disaggregated"].(float64) <= 0 {
		t.Errorf("JSON values disagree with the plan: %v", m)
	}
	if _, ok := m["what_if"]; ok {
		t.Error("one plan written with a what_if list")
	}
}

func TestWriteWhatIf(t *testing.T) {
	a, h := smallPlan(t, "a100-80g/llama-3-8b/tp1"), smallPlan(t, "h100/llama-3-8b/tp1")
	var buf bytes.Buffer
	if err := WriteJSON(&buf, a, h); err != nil {
		t.Fatal(err)
	}
	var m struct {
		Profile string   `json:"profile"`
		WhatIf  []WhatIf `json:"what_if"`
	}
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]WhatIf{a.WhatIf(), h.WhatIf()}, m.WhatIf); diff != "" || m.Profile != a.Profile {
		t.Errorf("what_if (-want +got):\n%s", diff)
	}
	// The faster GPU serves more per GPU, in both designs.
	if ga, gh := a.GoodputPerGPU, h.GoodputPerGPU; !(gh.Disaggregated > ga.Disaggregated && gh.Colocated > ga.Colocated) {
		t.Errorf("H100 %+v not ahead of A100 %+v", gh, ga)
	}
	buf.Reset()
	if err := WriteTable(&buf, a, h); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, s := range []string{"What-if, side by side", "a100-80g/llama-3-8b/tp1", "h100/llama-3-8b/tp1"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q", s)
		}
	}
}

func TestWriteTable(t *testing.T) {
	p := smallPlan(t, "a100-80g/opt-13b/tp1")
	var buf bytes.Buffer
	if err := WriteTable(&buf, p); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, s := range []string{
		"pdserve plan: a100-80g/opt-13b/tp1", "disaggregated", "colocated", "GOODPUT/GPU", "$/1K TOK",
		"TTFT budget, disaggregated", "kv_transfer", "first_token", "= TTFT", "Batching limits", "Recommended:",
		"Goodput per GPU (req/s) by prefill",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
	if err := WriteTable(failWriter{}, p); err == nil {
		t.Error("WriteTable to a failing writer returned nil")
	}
}

func TestWritePNG(t *testing.T) {
	p := smallPlan(t, "a100-80g/opt-13b/tp1")
	var buf bytes.Buffer
	if err := WritePNG(&buf, p); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 300 {
		t.Errorf("image %v too small", b)
	}
	c := Chart(p)
	if len(c.Series) != 1 || len(c.Series[0].X) == 0 || len(c.Refs) != 1 {
		t.Errorf("chart has %d series, %d refs; want one of each with points", len(c.Series), len(c.Refs))
	}
	for i := 1; i < len(c.Series[0].X); i++ {
		if c.Series[0].X[i] <= c.Series[0].X[i-1] {
			t.Errorf("ratios not increasing: %v", c.Series[0].X)
		}
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, bytes.ErrTooLarge }

func TestMoney(t *testing.T) {
	for _, tc := range []struct {
		x    float64
		want string
	}{
		{0, "-"}, {9.65e-05, "$0.0000965"}, {0.0123, "$0.0123"}, {0.5, "$0.500"}, {0.0009996, "$0.00100"},
		{1.234, "$1.23"}, {1234.5, "$1234.50"},
	} {
		if got := money(tc.x); got != tc.want {
			t.Errorf("money(%v) = %q, want %q", tc.x, got, tc.want)
		}
	}
}

// With --rate the plan says that the fewest GPUs decided, compares the
// designs on that (not on goodput per GPU, which the grid shows), and
// says what the grid's best per GPU would be; without, the objective is
// goodput per GPU. Dollars print without an exponent.
func TestRecommendationObjective(t *testing.T) {
	cfg := opt13(t)
	cfg.Prefill = mustProfile(t, "h100/llama-3-8b/tp1")
	cfg.SLO.TTFT, cfg.SLO.TPOT = 500*time.Millisecond, 50*time.Millisecond
	cfg.Requests, cfg.GPUBudget, cfg.Rate = 200, 6, 20
	p := mustRun(t, cfg)
	if p.Objective != ObjectiveFewestGPUs || p.Recommended != "colocated" || p.Colocated.GPUs != 1 || p.Disaggregated.GPUs != 2 {
		t.Fatalf("objective %q, recommended %q, colocated %+v, disaggregated %+v; want the 1-GPU colocated design",
			p.Objective, p.Recommended, p.Colocated, p.Disaggregated)
	}
	var b strings.Builder
	if err := WriteTable(&b, p); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"Objective: the fewest GPUs that serve 20.00 req/s within the SLO",
		"Recommended: colocated, 1 replica: 1 GPU at 20.00 req/s, against 2 GPUs for disaggregated 1P+1D.",
		"Without --rate (the highest goodput per GPU) the grid's best are disaggregated ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"1 replicas", "goodput per GPU of disaggregated", "e-0"} {
		if strings.Contains(out, bad) {
			t.Errorf("table has %q:\n%s", bad, out)
		}
	}

	cfg.Rate = 0
	q := mustRun(t, cfg)
	b.Reset()
	if err := WriteTable(&b, q); err != nil {
		t.Fatal(err)
	}
	out = b.String()
	if q.Objective != ObjectiveGoodputPerGPU || !strings.Contains(out, "Objective: the highest goodput per GPU within 6 GPUs (no --rate).") ||
		!strings.Contains(out, "x the goodput per GPU of ") || strings.Contains(out, "Without --rate") {
		t.Errorf("objective %q:\n%s", q.Objective, out)
	}
	var best float64
	var bestOf string
	for _, c := range q.Candidates {
		if !c.Skipped && c.GoodputPerGPU > best {
			best, bestOf = c.GoodputPerGPU, "disaggregated"
		}
	}
	for _, c := range q.ColocatedCandidates {
		if !c.Skipped && c.GoodputPerGPU > best {
			best, bestOf = c.GoodputPerGPU, "colocated"
		}
	}
	if q.Recommended != bestOf {
		t.Errorf("recommended %s, but the grid's best per GPU is %s (%v)", q.Recommended, bestOf, best)
	}
}
