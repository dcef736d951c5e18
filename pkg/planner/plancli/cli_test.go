package plancli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner"
)

// base are quick flags: a small budget and few simulated requests.
var base = []string{
	"--profile", "a100-80g/opt-13b/tp1", "--workload", "fixed:512/64",
	"--slo-ttft", "400ms", "--slo-tpot", "40ms", "--gpu-budget", "4", "--requests", "100", "--max-batch-tokens", "512",
}

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(t.Context(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestPlanTable(t *testing.T) {
	code, out, errs := run(t, base...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errs)
	}
	for _, s := range []string{"pdserve plan: a100-80g/opt-13b/tp1", "kv_transfer", "Recommended:"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	if !strings.Contains(errs, "simulations in") {
		t.Errorf("stderr lacks the timing: %q", errs)
	}
}

func TestPlanJSONAndPlot(t *testing.T) {
	pngFile := filepath.Join(t.TempDir(), "ratio.png")
	// Policy decode: the KV transfer is part of the TTFT budget.
	code, out, errs := run(t, append(base, "--output", "json", "--link-gbps", "25", "--codec", "fp8", "--codec-mbps", "300", "--rate", "2", "--plot", pngFile, "--first-token-policy", "decode")...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errs)
	}
	var m struct {
		Prefill       int                `json:"prefill_replicas"`
		Decode        int                `json:"decode_replicas"`
		GoodputPerGPU map[string]float64 `json:"goodput_per_gpu"`
		Cost          map[string]float64 `json:"cost_per_1k_tokens"`
		Budget        map[string]float64 `json:"ttft_budget_ms"`
		LinkGbps      float64            `json:"link_gbps"`
		Codec         struct{ Name string }
		RequestedRate float64 `json:"requested_rate"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out)
	}
	if m.Prefill < 1 || m.Decode < 1 || m.GoodputPerGPU["disaggregated"] <= 0 || m.GoodputPerGPU["colocated"] <= 0 ||
		m.Cost["disaggregated"] <= 0 || m.Budget["kv_transfer"] <= 0 || m.LinkGbps != 25 || m.Codec.Name != "fp8" || m.RequestedRate != 2 {
		t.Errorf("plan JSON %+v", m)
	}
	f, err := os.Open(pngFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("plot is not a PNG: %v", err)
	}
}

func TestPlanWhatIf(t *testing.T) {
	args := []string{
		"--profile", "a100-80g/llama-3-8b/tp1,h100/llama-3-8b/tp1", "--gpu-cost-per-hour", "a100-80g=1.5,h100=3",
		"--workload", "fixed:1024/128", "--slo-ttft", "500ms", "--slo-tpot", "50ms",
		"--gpu-budget", "3", "--requests", "100", "--max-batch-tokens", "512", "--output", "json",
	}
	code, out, errs := run(t, args...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errs)
	}
	var m struct {
		WhatIf []struct {
			Profile string             `json:"profile"`
			Cost    map[string]float64 `json:"cost_per_1k_tokens"`
		} `json:"what_if"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, w := range m.WhatIf {
		names = append(names, w.Profile)
		if w.Cost["disaggregated"] <= 0 {
			t.Errorf("%s: no cost", w.Profile)
		}
	}
	if diff := cmp.Diff([]string{"a100-80g/llama-3-8b/tp1", "h100/llama-3-8b/tp1"}, names); diff != "" {
		t.Errorf("what_if profiles (-want +got):\n%s", diff)
	}
}

func TestPlanBadFlags(t *testing.T) {
	without := func(flag string) []string {
		var out []string
		for i := 0; i < len(base); i += 2 {
			if base[i] != flag {
				out = append(out, base[i], base[i+1])
			}
		}
		return out
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no profile", without("--profile"), "--profile is required"},
		{"no workload", without("--workload"), "--workload is required"},
		{"no SLO", without("--slo-tpot"), "--slo-tpot are required"},
		{"bad output", append(base, "--output", "yaml"), "--output"},
		{"unknown codec", append(base, "--codec", "lz4"), "unknown codec"},
		{"unknown profile", append(without("--profile"), "--profile", "tpu/opt-13b/tp1"), "unknown profile"},
		{"bad workload", append(without("--workload"), "--workload", "fixed:1"), "fixed:IN/OUT"},
		{"bad cost", append(base, "--gpu-cost-per-hour", "h100=x"), "--gpu-cost-per-hour"},
		{"cost missing a GPU", append(base, "--gpu-cost-per-hour", "h100=3"), "no price for GPU a100-80g"},
		{"small budget", append(base, "--gpu-budget", "1"), "GPU budget 1"},
		{"decode profile of another model", append(base, "--decode-profile", "a100-80g/opt-66b/tp2"), "differs"},
		{"prefix cache below -1", append(base, "--prefix-cache-tokens", "-2"), "--prefix-cache-tokens -2"},
		{"negative host cache", append(base, "--host-cache-tokens", "-1"), "--host-cache-tokens -1"},
		{"host link 0", append(base, "--host-link-gbps", "0"), "--host-link-gbps 0"},
		{"unknown routing", append(base, "--prefix-routing", "random"), "--prefix-routing \"random\""},
		{"undefined flag", append(base, "--nope"), "flag provided but not defined"},
		{"argument", append(base, "extra"), "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := run(t, tt.args...)
			if code != 2 || out != "" || !strings.Contains(errs, tt.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing, %q", code, out, errs, tt.want)
			}
		})
	}
}

func TestPlanHelp(t *testing.T) {
	code, out, errs := run(t, "--help")
	if code != 0 || errs != "" {
		t.Fatalf("--help: exit %d, stderr %q; want the usage on stdout", code, errs)
	}
	for _, want := range []string{
		"--slo-ttft", "Examples:\n  coordinator plan --profile ",
		"-profile GPU/MODEL/tpN\n", // the flag's argument, not a word of its usage
		`(default "prefill")`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %q:\n%s", want, out)
		}
	}
}

// TestPlanPolicyDefault: the plan models the coordinator's default
// first-token policy unless told otherwise.
func TestPlanPolicyDefault(t *testing.T) {
	o := DefaultOptions()
	o.Profiles, o.Workload, o.SLOTTFT, o.SLOTPOT = []string{"h100/llama-3-8b/tp1"}, "fixed:64/8", time.Second, time.Second
	cfgs, err := o.Configs()
	if err != nil {
		t.Fatal(err)
	}
	if got := cfgs[0].Policy; got != planner.PolicyPrefill {
		t.Errorf("policy %q, want %q", got, planner.PolicyPrefill)
	}
}

// A plan that nothing meets is still written, with exit code 1.
func TestPlanInfeasible(t *testing.T) {
	code, out, errs := run(t, append(base, "--slo-ttft", "10ms", "--output", "json")...)
	if code != 1 || !strings.Contains(errs, "no design") {
		t.Errorf("exit %d, stderr %q; want 1 and the reason", code, errs)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil || m["feasible"] != false {
		t.Errorf("infeasible plan JSON %v (%v)", m, err)
	}
}

func TestPlanCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var out, errb bytes.Buffer
	if code := Run(ctx, base, &out, &errb); code != 1 || !strings.Contains(errb.String(), "canceled") {
		t.Errorf("cancelled: exit %d, stderr %q", code, errb.String())
	}
}

func TestMainHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"--help"}, &out, &errb); code != 0 {
		t.Errorf("Main --help = %d", code)
	}
}

// --design predicts one design at --rate: attainment falls from meeting
// the target at a light rate to missing it far past the design's
// capacity, and the JSON names the design and the rate asked.
func TestPlanDesign(t *testing.T) {
	type eval struct {
		Target     float64 `json:"attainment_target"`
		Meets      bool    `json:"meets_slo"`
		Measured   int     `json:"measured_requests"`
		Prediction struct {
			Design     map[string]int `json:"design"`
			GPUs       int            `json:"gpus"`
			Rate       float64        `json:"rate"`
			Attainment float64        `json:"attainment"`
		} `json:"prediction"`
	}
	tests := []struct {
		name, design, rate string
		wantDesign         map[string]int
		wantGPUs           int
		wantMeets          bool
	}{
		{"light, P:D", "2:1", "1", map[string]int{"prefill": 2, "decode": 1}, 3, true},
		{"overload, PP+DD", "1P+1D", "200", map[string]int{"prefill": 1, "decode": 1}, 2, false},
		{"colocated", "2C", "1", map[string]int{"colocated": 2, "chunk_tokens": 512}, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A design may exceed --gpu-budget: nothing is searched.
			code, out, errs := run(t, append(base, "--gpu-budget", "2", "--design", tt.design, "--rate", tt.rate, "--output", "json")...)
			if code != 0 {
				t.Fatalf("exit %d, stderr %s", code, errs)
			}
			var e eval
			if err := json.Unmarshal([]byte(out), &e); err != nil {
				t.Fatalf("stdout is not JSON: %v\n%s", err, out)
			}
			if diff := cmp.Diff(tt.wantDesign, e.Prediction.Design); diff != "" {
				t.Errorf("design (-want +got):\n%s", diff)
			}
			p := e.Prediction
			if p.GPUs != tt.wantGPUs || p.Rate == 0 || e.Target != 0.9 || e.Measured < 1 || e.Meets != tt.wantMeets ||
				!(p.Attainment >= 0 && p.Attainment <= 1) || (p.Attainment >= e.Target) != e.Meets {
				t.Errorf("evaluation %+v; want %d GPUs, meets %v", e, tt.wantGPUs, tt.wantMeets)
			}
		})
	}
	code, out, errs := run(t, append(base, "--design", "1P+1D", "--rate", "2")...)
	if code != 0 || !strings.Contains(out, "1P+1D") || !strings.Contains(out, "attainment") {
		t.Errorf("table: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestPlanDesignBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no rate", []string{"--design", "1:1"}, "--design needs --rate"},
		{"garbage", []string{"--design", "two", "--rate", "1"}, "want P:D"},
		{"zero workers", []string{"--design", "0:1", "--rate", "1"}, "want P:D"},
		{"colocated without chunk", []string{"--design", "2C", "--rate", "1", "--max-batch-tokens", "0"}, "needs --max-batch-tokens"},
		{"plot", []string{"--design", "1:1", "--rate", "1", "--plot", "x.png"}, "no plot"},
		{"what-if", []string{"--design", "1:1", "--rate", "1", "--profile", "a100-80g/opt-13b/tp2"}, "one --profile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := run(t, append(slices.Clone(base), tt.args...)...)
			if code != 2 || out != "" || !strings.Contains(errs, tt.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing, %q", code, out, errs, tt.want)
			}
		})
	}
}

// A trace with block hashes: the plan names its caches and the sweep
// prints what each size buys; --cache-sweep=false and
// --prefix-cache-tokens 0 take them away.
func TestPlanCacheSweep(t *testing.T) {
	trace := append(slices.Clone(base[:2]), "--workload", "../testdata/mooncake.jsonl")
	trace = append(trace, base[4:]...)
	tests := []struct {
		name          string
		args          []string
		caches, sweep bool
	}{
		{"default", nil, true, true},
		{"host tier", []string{"--host-cache-tokens", "4096", "--host-link-gbps", "100"}, true, true},
		{"least-loaded", []string{"--prefix-routing", "least-loaded"}, true, true},
		{"no sweep", []string{"--cache-sweep=false"}, true, false},
		{"no cache", []string{"--prefix-cache-tokens", "0"}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := run(t, append(slices.Clone(trace), tt.args...)...)
			if code != 0 {
				t.Fatalf("exit %d, stderr %s", code, errs)
			}
			if got := strings.Contains(out, "  caches     prefix caches per worker"); got != tt.caches {
				t.Errorf("caches line %v, want %v:\n%s", got, tt.caches, out)
			}
			if got := strings.Contains(out, "What each prefix-cache size buys"); got != tt.sweep {
				t.Errorf("sweep %v, want %v:\n%s", got, tt.sweep, out)
			}
		})
	}
}

// TestPlanRenamedFlags: the former names --chunk-tokens and --gpu-cost set
// --max-batch-tokens and --gpu-cost-per-hour, and plan warns of them.
func TestPlanRenamedFlags(t *testing.T) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	o.AddFlags(fs)
	var stdout, stderr bytes.Buffer
	if code, ok := cliflags.Parse(fs, []string{"--chunk-tokens", "384", "--gpu-cost", "3.5"}, &stdout, &stderr); !ok {
		t.Fatalf("parse: %d %s", code, stderr.String())
	}
	if o.Limits.ChunkTokens != 384 || o.GPUCost != "3.5" {
		t.Errorf("--chunk-tokens 384 --gpu-cost 3.5 gave the step budget %d and price %q", o.Limits.ChunkTokens, o.GPUCost)
	}
	args := append(slices.Clone(base[:len(base)-2]), "--chunk-tokens", "0", "--design", "2C", "--rate", "1")
	code, _, errs := run(t, args...)
	if code != 2 || !strings.Contains(errs, "flag --chunk-tokens is deprecated, use --max-batch-tokens") || !strings.Contains(errs, "needs --max-batch-tokens") {
		t.Errorf("exit %d, stderr %q; want 2, a deprecation and the error naming --max-batch-tokens", code, errs)
	}
}

// TestPlanHostCacheBytes: --host-cache-bytes sizes the host tier as the
// workers' flag does, in bytes of true KV, planned as that many tokens of
// the profile's KV; it and --host-cache-tokens are one setting.
func TestPlanHostCacheBytes(t *testing.T) {
	o := DefaultOptions()
	o.Profiles, o.Workload, o.SLOTTFT, o.SLOTPOT = []string{"h100/llama-3-8b/tp1"}, "fixed:64/8", time.Second, time.Second
	p, err := perfmodel.Load("h100/llama-3-8b/tp1")
	if err != nil {
		t.Fatal(err)
	}
	o.HostCacheBytes = 3000 * p.KVBytesPerToken()
	cfgs, err := o.Configs()
	if err != nil {
		t.Fatal(err)
	}
	if got := cfgs[0].Cache.HostTokens; got != 3000 {
		t.Errorf("--host-cache-bytes %d: host tier %d tokens, want 3000", o.HostCacheBytes, got)
	}
	o.HostCacheTokens = 10
	if _, err := o.Configs(); err == nil || !strings.Contains(err.Error(), "give one") {
		t.Errorf("both host tier flags: %v, want an error", err)
	}
}

// TestPlanTiers: with --policy naming tiers, plan plans each served model
// of the tiers apart, with its own profile and rate, in model order; bad
// combinations are refused naming the flag.
func TestPlanTiers(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("tiers:\n  chat: {models: [opt-13b, llama-3-8b]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noTiers := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(noTiers, []byte("slo: {ttft_ms: 400, tpot_ms: 40}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	quick := base[2:] // base without --profile
	tiered := append(slices.Clone(quick), "--policy", policy,
		"--model-profile", "opt-13b=a100-80g/opt-13b/tp1", "--model-profile", "llama-3-8b=h100/llama-3-8b/tp1", "--model-rate", "opt-13b=2")
	code, out, errs := run(t, tiered...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errs)
	}
	want := []string{
		"== model llama-3-8b (tier chat), h100/llama-3-8b/tp1, rate highest goodput per GPU ==", "pdserve plan: h100/llama-3-8b/tp1",
		"== model opt-13b (tier chat), a100-80g/opt-13b/tp1, rate 2 req/s ==", "pdserve plan: a100-80g/opt-13b/tp1",
	}
	at := 0
	for _, s := range want {
		i := strings.Index(out[at:], s)
		if i < 0 {
			t.Fatalf("output lacks %q after offset %d:\n%s", s, at, out)
		}
		at += i + len(s)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a model without a profile", append(slices.Clone(quick), "--policy", policy, "--model-profile", "opt-13b=a100-80g/opt-13b/tp1"), "model llama-3-8b of the policy's tiers has no --model-profile"},
		{"a profile of a model of no tier", append(slices.Clone(tiered), "--model-profile", "mistral=h100/llama-3-8b/tp1"), "no tier of the policy serves model mistral"},
		{"a rate of a model of no tier", append(slices.Clone(tiered), "--model-rate", "mistral=1"), "--model-rate mistral"},
		{"--profile with --policy", append(slices.Clone(tiered), "--profile", "h100/llama-3-8b/tp1"), "not --profile"},
		{"--rate with --policy", append(slices.Clone(tiered), "--rate", "3"), "not --profile"},
		{"json", append(slices.Clone(tiered), "--output", "json"), "--output json"},
		{"model flags without --policy", append(slices.Clone(base), "--model-rate", "opt-13b=2"), "give --policy"},
		{"a policy without tiers", append(slices.Clone(quick), "--policy", noTiers, "--model-profile", "opt-13b=a100-80g/opt-13b/tp1"), "names no tiers"},
		{"a bad rate", append(slices.Clone(tiered), "--model-rate", "llama-3-8b=-1"), "want MODEL=RATE"},
		{"a profile twice", append(slices.Clone(tiered), "--model-profile", "opt-13b=h100/llama-3-8b/tp1"), "given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := run(t, tc.args...)
			if code != 2 || !strings.Contains(errs, tc.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, errs, tc.want)
			}
		})
	}
}
