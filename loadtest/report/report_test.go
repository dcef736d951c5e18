package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/loadtest/client"
	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/sweep"
)

func outcomes() []client.Outcome {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	t0 := time.Unix(0, 0)
	return []client.Outcome{
		{Success: true, PromptLen: 10, Asked: 3, OutputTokens: 3, UsageReported: true, Start: t0, TTFT: ms(100),
			ITL: []time.Duration{ms(10), ms(10)}, Latency: ms(120), Events: 3, HasAnswer: true, TTFO: ms(100), GeneratedText: "abc"},
		{Success: true, PromptLen: 10, Asked: 3, OutputTokens: 2, UsageReported: true, Start: t0, TTFT: ms(200),
			ITL: []time.Duration{ms(20)}, Latency: ms(220), Events: 2, HasAnswer: true, TTFO: ms(200), GeneratedText: "ab"},
		{PromptLen: 10, Asked: 3, Error: "HTTP 500: boom"},
	}
}

func TestResultFields(t *testing.T) {
	outs := outcomes()
	s := metrics.Compute(outs, 2*time.Second, metrics.Options{Percentiles: []float64{50, 99.9}})
	m := Meta{Date: "20250101-000000", Backend: "openai", Model: "org/m", NumPrompts: 3, RequestRate: math.Inf(1), Burstiness: 1, TimeScale: 1}
	res := Result(m, s, outs, true)
	var keys []string
	for _, f := range res {
		keys = append(keys, f.Key)
	}
	wantPrefix := []string{"date", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness",
		"max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
		"request_goodput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
		"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p99.9_ttft_ms"}
	if diff := cmp.Diff(wantPrefix, keys[:len(wantPrefix)]); diff != "" {
		t.Errorf("leading keys (-want +got):\n%s", diff)
	}
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{
		"request_rate": "inf", "request_goodput": nil, "max_concurrency": nil, "completed": 2.0, "failed": 1.0,
		"total_output_tokens": 5.0, "output_len_mismatches": 1.0, "median_ttft_ms": 150.0,
		"output_lens": []any{3.0, 2.0, 0.0}, "errors": []any{"", "", "HTTP 500: boom"},
		"itls": []any{[]any{0.01, 0.01}, []any{0.02}, []any{}},
	} {
		if diff := cmp.Diff(want, got[k]); diff != "" {
			t.Errorf("%s (-want +got):\n%s", k, diff)
		}
	}
	if _, ok := got["pdserve"]; ok {
		t.Error("pdserve section without any budget object")
	}
	if _, ok := got["data_attribution"]; ok {
		t.Error("attribution on a random workload")
	}
	m.DatasetName = "azure"
	res = Result(m, s, outs, false)
	if v, _ := res.Get("data_attribution"); !strings.Contains(v.(string), "Splitwise") {
		t.Errorf("azure result attribution %v", v)
	}
	if _, ok := res.Get("ttfts"); ok {
		t.Error("per-request arrays without detailed")
	}
}

func TestObjectNonFinite(t *testing.T) {
	data, err := json.Marshal(Object{{"a", math.NaN()}, {"b", math.Inf(1)}, {"c", 1.5}})
	if err != nil || string(data) != `{"a":null,"b":null,"c":1.5}` {
		t.Errorf("got %s, %v", data, err)
	}
}

func TestDefaultFilename(t *testing.T) {
	for _, tc := range []struct {
		m    Meta
		want string
	}{
		{Meta{Backend: "openai", Model: "meta/llama", RequestRate: math.Inf(1), Date: "d"}, "openai-infqps-llama-d.json"},
		{Meta{Backend: "openai", Label: "x", Model: "m", RequestRate: 2.5, MaxConcurrency: 8, Date: "d"}, "x-2.5qps-concurrency8-m-d.json"},
	} {
		if got := DefaultFilename(tc.m); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}

func TestRegress(t *testing.T) {
	base := map[string]any{"p90_ttft_ms": 100.0, "p90_tpot_ms": 10.0, "failed": 0.0}
	checks := []Check{{"ttft", "p90"}, {"tpot", "p90"}}
	for _, tc := range []struct {
		name string
		cur  map[string]any
		d    Drift
		bad  []string
	}{
		{"equal", map[string]any{"p90_ttft_ms": 100.0, "p90_tpot_ms": 10.0, "failed": 0.0}, Drift{Max: 0.1}, nil},
		{"ttft +20%", map[string]any{"p90_ttft_ms": 120.0, "p90_tpot_ms": 10.0, "failed": 0.0}, Drift{Max: 0.1}, []string{"p90_ttft_ms"}},
		{"floor", map[string]any{"p90_ttft_ms": 100.0, "p90_tpot_ms": 12.0, "failed": 0.0}, Drift{Max: 0.1, FloorMs: 5}, nil},
		{"faster", map[string]any{"p90_ttft_ms": 50.0, "p90_tpot_ms": 10.0, "failed": 0.0}, Drift{Max: 0.1}, nil},
		{"faster two-sided", map[string]any{"p90_ttft_ms": 50.0, "p90_tpot_ms": 10.0, "failed": 0.0}, Drift{Max: 0.1, TwoSided: true}, []string{"p90_ttft_ms"}},
		{"failures", map[string]any{"p90_ttft_ms": 100.0, "p90_tpot_ms": 10.0, "failed": 3.0}, Drift{Max: 0.1}, []string{"failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, failed, err := Regress(base, tc.cur, checks, tc.d)
			if err != nil {
				t.Fatal(err)
			}
			var bad []string
			for _, f := range fs {
				if f.Failed {
					bad = append(bad, f.Key)
				}
			}
			if diff := cmp.Diff(tc.bad, bad); diff != "" || failed != (len(tc.bad) > 0) {
				t.Errorf("failed %v; failing figures (-want +got):\n%s", failed, diff)
			}
		})
	}
	if _, _, err := Regress(base, map[string]any{}, checks, Drift{}); !errors.Is(err, ErrBaseline) {
		t.Errorf("missing figure: got %v, want ErrBaseline", err)
	}
	for in, want := range map[string]string{"p90": "p90", "99": "p99", "99.9": "p99.9", "mean": "mean", "median": "median"} {
		if got, err := ParseStat(in); err != nil || got != want {
			t.Errorf("ParseStat(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseStat("p0"); err == nil {
		t.Error("ParseStat(p0) succeeded")
	}
}

func TestMarkdowns(t *testing.T) {
	outs := outcomes()
	outs[0].Budget = map[string]any{"queue_ms": 5.0, "kv_transfer_ms": 2.0, "kv_bytes_raw": 2048.0, "kv_bytes_wire": 1024.0, "codec": "zstd",
		"cost_usd": 0.003, "prompt_tokens": 1000.0, "output_tokens": 500.0, "warnings": []any{"the sim engine fell behind"}}
	slo := metrics.SLO{TTFT: 150 * time.Millisecond}
	s := metrics.Compute(outs, time.Second, metrics.Options{SLO: slo})
	m := Meta{Model: "m", BaseURL: "http://x", Endpoint: "/v1/completions", Workload: "w", Arrival: "Poisson 1 req/s", DatasetName: "azure", TimeScale: 1}
	var b bytes.Buffer
	if err := Markdown(&b, m, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| SLO attainment | 33.3% |", "| kv_transfer | 2.00 |", "2.00 KiB raw, 1.00 KiB on the wire (2.00×)", "codec zstd", "Splitwise",
		"Cost (server pricing): $0.003 over 1 requests, $0.002 per 1k tokens.", "**Server warnings on 1 of 1 requests**, e.g.: the sim engine fell behind"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("run summary lacks %q:\n%s", want, b.String())
		}
	}
	res := sweep.Result{MaxRate: 2, FailRate: 3, Points: []sweep.Point{
		{Rate: 2, Summary: s, Passed: true}, {Rate: 3, Summary: s, Search: true},
	}}
	b.Reset()
	if err := SweepMarkdown(&b, m, res, 0.9, slo, 2, ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 2 | 33.3% |", "fail (search)", "Max rate at 90.0% attainment: 2 req/s (1 req/s per GPU)**, below a failing 3 req/s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("sweep summary lacks %q:\n%s", want, b.String())
		}
	}
	c := Comparison{Meta: m, Target: 0.9, SLO: slo, CommonRate: 2, Sides: []Side{
		{Name: "disaggregated", GPUs: 3, Facts: Object{{"P:D split", "2:1"}}, Sweep: sweep.Result{MaxRate: 6, FailRate: 7}, At: &s},
		{Name: "colocated", GPUs: 3, Sweep: sweep.Result{MaxRate: 3, FailRate: 4}, At: &s},
	}}
	b.Reset()
	if err := c.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| P:D split | 2:1 | — |", "| **Max rate per GPU (req/s/GPU)** | **2** | **1** |", "| per GPU vs colocated: max rates | 2.00× | 1.00× |", "| per GPU vs colocated: crossings | [1.50×, 2.33×] | [0.75×, 1.33×] |",
		"| 90.0% crossing in (req/s): [last meeting, first failing] | [6, 7], 16.7% wide (over the 0.0% asked: raise --search-steps) |", "|   kv_transfer | 2.00 | 2.00 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("comparison lacks %q:\n%s", want, b.String())
		}
	}
}

// TestComparisonCrossings: each side's crossing interval, the ratio's
// interval, failures by reason, and the diagnosis of a side that sheds
// load for lack of decode KV against one that queues.
func TestComparisonCrossings(t *testing.T) {
	kv := client.Outcome{FailKind: client.FailHTTP, Status: 429, ErrorType: "rate_limit_error", ErrorCode: "overloaded",
		ErrorMessage: "No decode worker has free KV cache for 1800 tokens now; retry later."}
	ok := func(ttft, lat time.Duration) client.Outcome {
		return client.Outcome{Success: true, OutputTokens: 11, TTFT: ttft, Latency: lat, Budget: map[string]any{"queue_ms": 20.0, "ttft_ms": 100.0, "mode": "disaggregated"}}
	}
	slo := metrics.SLO{TTFT: 250 * time.Millisecond, TPOT: 100 * time.Millisecond}
	sum := func(outs ...client.Outcome) metrics.Summary {
		return metrics.Compute(outs, time.Second, metrics.Options{SLO: slo})
	}
	good := ok(100*time.Millisecond, 600*time.Millisecond)
	// Disaggregated fails at 7.12 by refusing: 2 of 4 are 429s.
	dis := sweep.Result{MaxRate: 6.94, FailRate: 7.12, Tolerance: 0.05, Points: []sweep.Point{
		{Rate: 6.94, Passed: true, Summary: sum(good, good, good, good)},
		{Rate: 7.12, Summary: sum(good, good, kv, kv)},
	}}
	// Colocated fails at 5.2 by queueing: no failure, TTFT misses.
	q := client.Outcome{Success: true, OutputTokens: 11, TTFT: 400 * time.Millisecond, Latency: 900 * time.Millisecond,
		Budget: map[string]any{"queue_ms": 300.0, "ttft_ms": 390.0, "mode": "colocated"}}
	col := sweep.Result{MaxRate: 5, FailRate: 5.2, Tolerance: 0.05, Points: []sweep.Point{
		{Rate: 5, Passed: true, Summary: sum(good, good, good, good)},
		{Rate: 5.2, Summary: sum(good, q, q, good)},
	}}
	c := Comparison{Target: 0.9, SLO: slo, Sides: []Side{
		{Name: "disaggregated", GPUs: 3, Profile: "a100-80g/opt-13b/tp1", Sweep: dis},
		{Name: "colocated", GPUs: 3, Sweep: col},
	}}
	lo, hi := RatioInterval(c.Sides[0], c.Sides[1])
	if math.Abs(lo-6.94/5.2) > 1e-9 || math.Abs(hi-7.12/5) > 1e-9 {
		t.Errorf("ratio interval [%v, %v], want [%v, %v]", lo, hi, 6.94/5.2, 7.12/5)
	}
	var b bytes.Buffer
	if err := c.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| 90.0% crossing in (req/s): [last meeting, first failing] | [6.94, 7.12], 2.6% wide | [5, 5.2], 4.0% wide |",
		"| 90.0% crossing per GPU (req/s/GPU) | [2.31, 2.37] | [1.67, 1.73] |",
		"| per GPU vs colocated: crossings | [1.33×, 1.42×] | [0.96×, 1.04×] |",
		"**disaggregated vs colocated per GPU: 1.39× at the max rates; the 90.0% crossings put it in [1.33×, 1.42×].**",
		"7.12: 50.0% (2 HTTP 429 overloaded)",
		"| Failures at the first failing rate | 2 of 4 at 7.12 req/s: 2 × HTTP 429 rate_limit_error/overloaded: No decode worker has free KV cache for N tokens now; retry later. | none of 4 at 5.2 req/s (SLO misses only) |",
		"The disaggregated side sheds load (2 of 4 requests refused with HTTP 429 at 7.12 req/s) where the colocated side queues it: no 429 at 5.2 req/s, its requests miss the SLOs instead (server side: mean queue 160 ms of a 245 ms mean TTFT).",
		"The decode pool is the disaggregated side's bottleneck at 7.12 req/s: 2 requests refused with 429 for lack of decode KV cache. Size the pools for this load with `coordinator plan --profile a100-80g/opt-13b/tp1 --gpu-budget 3 --slo-ttft 250ms --slo-tpot 100ms --rate 7.12 --workload fixed:0/11`.",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("comparison lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "colocated pool") {
		t.Errorf("a pool named for the colocated side:\n%s", b.String())
	}
	// CPU sides say cores.
	c.Sides[0].Unit, c.Sides[1].Unit = "core", "core"
	b.Reset()
	if err := c.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| cores | 3 cores | 3 cores |", "| **Max rate per core (req/s/core)** |", "per core: 1.39×"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("CPU comparison lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "GPU") {
		t.Errorf("CPU comparison speaks of GPUs:\n%s", b.String())
	}
	data, err := json.Marshal(c.Result(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Ratio    []float64 `json:"ratio_per_gpu_interval"`
		Diagnose []string  `json:"diagnosis"`
		Sides    []struct {
			Interval []float64 `json:"crossing_interval"`
			Unit     string    `json:"unit"`
			Failures []struct {
				Reason string `json:"reason"`
				Status int    `json:"http_status"`
				Count  int    `json:"count"`
			} `json:"failures_at_fail_rate"`
		} `json:"sides"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Sides) != 2 || !cmp.Equal(got.Sides[0].Interval, []float64{6.94, 7.12}) || got.Sides[0].Unit != "core" ||
		len(got.Sides[0].Failures) != 1 || got.Sides[0].Failures[0].Status != 429 || got.Sides[0].Failures[0].Count != 2 ||
		len(got.Ratio) != 2 || len(got.Diagnose) != 4 {
		t.Errorf("comparison JSON %s", data)
	}
}

// The report says how the probes' prompts were drawn, and labels the
// cases where probes may hit KV an earlier one left.
func TestPromptsText(t *testing.T) {
	for _, tt := range []struct {
		m    Meta
		want string
	}{
		{Meta{Seed: 3, DatasetName: "dist"}, "Every probe sent prompts of its own: the lengths and arrivals of seed 3"},
		{Meta{Seed: 3, DatasetName: "dist", SharedPrefix: 512}, "beyond the 512-token prefix every prompt shares"},
		{Meta{Seed: 3, DatasetName: "random", SamePrompts: true}, "**Every probe sent the same prompts** (--same-prompts, seed 3)"},
		{Meta{Seed: 3, DatasetName: "sharegpt"}, "**Every probe sent the same ShareGPT texts**"},
	} {
		if got := PromptsText(tt.m); !strings.Contains(got, tt.want) {
			t.Errorf("%+v: %q, want it to contain %q", tt.m, got, tt.want)
		}
	}
}
