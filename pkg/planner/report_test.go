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
