package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeServer is an OpenAI-compatible server that streams max_tokens
// one-byte tokens at once, with usage and a pdserve budget object, and
// fails every request whose prompt starts with "FAIL". It counts requests.
type fakeServer struct {
	*httptest.Server
	requests atomic.Int32
}

func newFakeServer(t *testing.T) *fakeServer {
	f := &fakeServer{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, `{"object":"list","data":[{"id":"fake-model","object":"model"}]}`)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		var body struct {
			MaxTokens int  `json:"max_tokens"`
			Stream    bool `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for range body.MaxTokens {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\n")
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}],"+
			"\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":%d},"+
			"\"pdserve\":{\"queue_ms\":1.5,\"prefill_ms\":3,\"kv_transfer_ms\":0.5,\"decode_ms\":2,\"kv_bytes_raw\":100,\"kv_bytes_wire\":50,\"codec\":\"zstd\",\"first_token_policy\":\"prefill\"}}\n\n", body.MaxTokens)
		io.WriteString(w, "data: [DONE]\n\n")
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestJoinNargs(t *testing.T) {
	got := joinNargs([]string{"--goodput", "ttft:300", "tpot:50", "--seed", "3", "-metadata", "a=1", "b=2", "--goodput=e2el:9", "--quiet"})
	want := []string{"--goodput=ttft:300 tpot:50", "--seed", "3", "--metadata=a=1 b=2", "--goodput=e2el:9", "--quiet"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"run", "--request-rate", "0"},
		{"run", "--goodput", "ttft"},
		{"run", "--metric-percentiles", "101"},
		{"run", "--dataset-name", "azure"},
		{"run", "--dataset-name", "dist", "--input-len-dist", "const:value=3"},
		{"run", "--backend", "openai-chat", "--prompt-format", "tokens"},
		{"run", "--trace-replay"},
		{"run", "--extra-body", "[1]"},
		{"run", "stray"},
		{"sweep", "--request-rates", "1,2"}, // no SLO
		{"sweep", "--goodput", "ttft:1", "--request-rates", "0"},
		{"regress"},
		{"compare", "--goodput", "ttft:1", "--request-rates", "1", "--pd-split", "2:2"},
		{"run", "--random-prefix-len", "-1"},
		{"run", "--dataset-name", "azure", "--dataset-path", "../data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv", "--random-prefix-len", "16"},
		{"compare", "--goodput", "ttft:1", "--request-rates", "1", "--pd-split", "auto"}, // no TPOT SLO to plan on
		{"compare", "--goodput", "ttft:1", "tpot:1", "--request-rates", "1", "--pd-split", "auto", "--disagg-url", "http://127.0.0.1:1", "--coloc-url", "http://127.0.0.1:1"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, _, stderr := runCLI(t, args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, exitUsage, stderr)
			}
		})
	}
	if code, _, _ := runCLI(t, "run", "-h"); code != exitOK {
		t.Errorf("run -h: exit %d, want 0", code)
	}
}

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("%s: %v", path, err)
	}
}

func TestRunWritesResultAndPlots(t *testing.T) {
	srv := newFakeServer(t)
	dir := t.TempDir()
	code, stdout, stderr := runCLI(t, "run", "--base-url", srv.URL, "--num-prompts", "12", "--random-input-len", "16",
		"--random-output-len", "4", "--max-concurrency", "3", "--goodput", "ttft:60000", "tpot:60000",
		"--save-result", "--save-detailed", "--result-dir", dir, "--result-filename", "r.json", "--label", "t", "--metadata", "k=v")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"## Benchmark result: t", "| Successful requests | 12 |", "| TTFT |", "| queue |", "| kv_transfer |", "KV moved"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
	if n := srv.requests.Load(); n != 12 {
		t.Errorf("server saw %d requests, want 12", n)
	}
	m := readJSON(t, filepath.Join(dir, "r.json"))
	for k, want := range map[string]any{
		"completed": 12.0, "failed": 0.0, "total_input_tokens": 192.0, "total_output_tokens": 48.0,
		"model_id": "fake-model", "backend": "openai", "request_rate": "inf", "max_concurrency": 3.0,
		"slo_attainment": 1.0, "label": "t", "metadata": map[string]any{"k": "v"},
	} {
		if diff := cmp.Diff(want, m[k]); diff != "" {
			t.Errorf("%s (-want +got):\n%s", k, diff)
		}
	}
	for _, k := range []string{"duration", "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
		"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "p90_tpot_ms", "mean_itl_ms", "p50_e2el_ms",
		"input_lens", "output_lens", "ttfts", "itls", "errors", "start_times"} {
		if _, ok := m[k]; !ok {
			t.Errorf("result lacks %s", k)
		}
	}
	// Send times, from the first request's: 12 of them, in [0, duration].
	if st, _ := m["start_times"].([]any); len(st) != 12 || slices.ContainsFunc(st, func(x any) bool { v, _ := x.(float64); return v < 0 || v > m["duration"].(float64) }) || !slices.Contains(st, any(0.0)) {
		t.Errorf("start_times %v: want 12 offsets in [0, duration], the first 0", st)
	}
	pd, _ := m["pdserve"].(map[string]any)
	for k, want := range map[string]any{"requests_with_budget": 12.0, "codec": "zstd", "kv_bytes_raw": 1200.0,
		"kv_compression_ratio": 2.0, "mean_queue_ms": 1.5, "p99_kv_transfer_ms": 0.5} {
		if diff := cmp.Diff(want, pd[k]); diff != "" {
			t.Errorf("pdserve.%s (-want +got):\n%s", k, diff)
		}
	}
	checkPNG(t, filepath.Join(dir, "r-ttft-cdf.png"))
	checkPNG(t, filepath.Join(dir, "r-tpot-cdf.png"))
}

func TestSweepAndRegress(t *testing.T) {
	srv := newFakeServer(t)
	dir := t.TempDir()
	common := []string{"--base-url", srv.URL, "--num-prompts", "6", "--random-input-len", "8", "--random-output-len", "3",
		"--goodput", "ttft:60000", "--quiet"}
	code, stdout, stderr := runCLI(t, append([]string{"sweep", "--request-rates", "50,100", "--search-steps", "1",
		"--gpus", "2", "--save-result", "--result-dir", dir, "--result-filename", "s.json", "--no-plots"}, common...)...)
	if code != exitOK {
		t.Fatalf("sweep exit %d; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "Max rate at 90.0% attainment: at least 200 req/s (100 req/s per GPU)") {
		t.Errorf("sweep summary:\n%s", stdout)
	}
	s := readJSON(t, filepath.Join(dir, "s.json"))
	if s["max_rate"] != 200.0 || s["bracketed"] != false || len(s["probes"].([]any)) != 3 {
		t.Errorf("sweep result: max_rate %v bracketed %v probes %d", s["max_rate"], s["bracketed"], len(s["probes"].([]any)))
	}
	if _, err := os.Stat(filepath.Join(dir, "s-attainment.png")); err == nil {
		t.Error("a plot was written with --no-plots")
	}

	base := filepath.Join(dir, "base.json")
	code, _, stderr = runCLI(t, append([]string{"regress", "--baseline", base, "--update-baseline"}, common...)...)
	if code != exitOK {
		t.Fatalf("regress --update-baseline exit %d; stderr:\n%s", code, stderr)
	}
	// The same workload on the same server is within a generous limit.
	code, stdout, stderr = runCLI(t, append([]string{"regress", "--baseline", base, "--max-drift", "1000", "--drift-floor-ms", "1000"}, common...)...)
	if code != exitOK || !strings.Contains(stdout, "No regression") {
		t.Fatalf("regress exit %d; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

func TestRegressSavedResults(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, v map[string]any) string {
		p := filepath.Join(dir, name)
		data, _ := json.Marshal(v)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := write("base.json", map[string]any{"p90_ttft_ms": 100.0, "p90_tpot_ms": 20.0, "failed": 0.0})
	for _, tc := range []struct {
		name  string
		cur   map[string]any
		extra []string
		want  int
	}{
		{"same", map[string]any{"p90_ttft_ms": 100.0, "p90_tpot_ms": 20.0, "failed": 0.0}, nil, exitOK},
		{"ttft slower", map[string]any{"p90_ttft_ms": 130.0, "p90_tpot_ms": 20.0, "failed": 0.0}, nil, exitFail},
		{"within limit", map[string]any{"p90_ttft_ms": 120.0, "p90_tpot_ms": 24.0, "failed": 0.0}, nil, exitOK},
		{"tpot slower", map[string]any{"p90_ttft_ms": 100.0, "p90_tpot_ms": 26.0, "failed": 0.0}, nil, exitFail},
		{"below the floor", map[string]any{"p90_ttft_ms": 100.0, "p90_tpot_ms": 26.0, "failed": 0.0}, []string{"--drift-floor-ms", "10"}, exitOK},
		{"faster", map[string]any{"p90_ttft_ms": 50.0, "p90_tpot_ms": 20.0, "failed": 0.0}, nil, exitOK},
		{"faster, two-sided", map[string]any{"p90_ttft_ms": 50.0, "p90_tpot_ms": 20.0, "failed": 0.0}, []string{"--two-sided"}, exitFail},
		{"failures", map[string]any{"p90_ttft_ms": 100.0, "p90_tpot_ms": 20.0, "failed": 2.0}, nil, exitFail},
		{"missing figure", map[string]any{"p90_ttft_ms": 100.0}, nil, exitFail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := write(strings.ReplaceAll(tc.name, " ", "_")+".json", tc.cur)
			code, stdout, stderr := runCLI(t, append([]string{"regress", "--baseline", base, "--current", cur}, tc.extra...)...)
			if code != tc.want {
				t.Errorf("exit %d, want %d; stdout:\n%s\nstderr:\n%s", code, tc.want, stdout, stderr)
			}
		})
	}
}

func TestCompareTargets(t *testing.T) {
	a, b := newFakeServer(t), newFakeServer(t)
	dir := t.TempDir()
	code, stdout, stderr := runCLI(t, "compare", "--disagg-url", a.URL, "--coloc-url", b.URL, "--gpus", "3",
		"--disagg-desc", "2P+1D h100", "--coloc-desc", "3 colocated h100", "--num-prompts", "5",
		"--random-input-len", "8", "--random-output-len", "3", "--goodput", "ttft:60000", "tpot:60000",
		"--request-rates", "40", "--search-steps", "0", "--quiet", "--save-result", "--result-dir", dir, "--result-filename", "c.json")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"| GPUs | 3 GPUs | 3 GPUs |", "2P+1D h100", "3 colocated h100", "### Both at 40 req/s", "kv_transfer", "per GPU vs colocated: max rates | 1.00× | 1.00× |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("comparison lacks %q:\n%s", want, stdout)
		}
	}
	c := readJSON(t, filepath.Join(dir, "c.json"))
	sides := c["sides"].([]any)
	if len(sides) != 2 || sides[0].(map[string]any)["name"] != "disaggregated" {
		t.Errorf("sides: %v", sides)
	}
	for _, f := range []string{"c-attainment.png", "c-goodput.png", "c-ttft-cdf.png", "c-tpot-cdf.png"} {
		checkPNG(t, filepath.Join(dir, f))
	}
}

func TestProgress(t *testing.T) {
	var b bytes.Buffer
	if p := newProgress(&b, false, "x"); p.w != nil {
		t.Error("progress bar on a buffer, which is not a terminal")
	}
	t0 := time.Unix(0, 0)
	clock := t0
	p := &progress{w: &b, title: "run", start: t0, now: func() time.Time { return clock }}
	clock = t0.Add(time.Second)
	p.update(5, 10) // first draw
	clock = clock.Add(50 * time.Millisecond)
	p.update(6, 10) // within 100 ms: not drawn
	clock = clock.Add(50 * time.Millisecond)
	p.update(10, 10)
	p.finish()
	out := b.String()
	if !strings.Contains(out, "run [===============               ] 5/10 1.0s 5.00 req/s") || !strings.Contains(out, "10/10") || strings.Contains(out, "6/10") || !strings.HasSuffix(out, "\n") {
		t.Errorf("progress output %q", out)
	}
}
