package workload

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/repotest"
)

func TestRandomLengthsAndPrefix(t *testing.T) {
	o := RandomOptions{InputLen: 100, OutputLen: 20, RangeRatio: 0.5, PrefixLen: 16}
	w, err := Random(o, 200, 7, Synth{})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 200 {
		t.Fatalf("got %d requests, want 200", len(w.Requests))
	}
	prefix := promptText(&w.Requests[0])[:16]
	seenIn := map[int]bool{}
	for i, r := range w.Requests {
		text := promptText(&r)
		in := r.PromptLen - 16
		if in < 50 || in > 150 {
			t.Errorf("request %d: input length %d outside [50, 150]", i, in)
		}
		if r.OutputLen < 10 || r.OutputLen > 30 {
			t.Errorf("request %d: output length %d outside [10, 30]", i, r.OutputLen)
		}
		if len(text) != r.PromptLen {
			t.Errorf("request %d: %d bytes for %d byte tokens", i, len(text), r.PromptLen)
		}
		if !strings.HasPrefix(text, prefix) {
			t.Errorf("request %d does not start with the shared prefix", i)
		}
		if r.Index != i {
			t.Errorf("request %d has index %d", i, r.Index)
		}
		seenIn[in] = true
	}
	if len(seenIn) < 50 {
		t.Errorf("only %d distinct input lengths in 200 draws from 101 values", len(seenIn))
	}
	if promptText(&w.Requests[0])[16:40] == promptText(&w.Requests[1])[16:40] {
		t.Error("two prompts share content past the prefix")
	}
}

func TestRandomRepeatableBySeed(t *testing.T) {
	o := RandomOptions{InputLen: 64, OutputLen: 8, RangeRatio: 0.25}
	a, _ := Random(o, 20, 1, Synth{})
	b, _ := Random(o, 20, 1, Synth{})
	c, _ := Random(o, 20, 2, Synth{})
	if diff := cmp.Diff(bodies(a), bodies(b)); diff != "" {
		t.Errorf("same seed, different workloads (-a +b):\n%s", diff)
	}
	if cmp.Equal(bodies(a), bodies(c)) {
		t.Error("seeds 1 and 2 gave the same workload")
	}
}

func TestPromptFormats(t *testing.T) {
	o := RandomOptions{InputLen: 40, OutputLen: 4}
	text, _ := Random(o, 3, 5, Synth{Format: Text, Tokenizer: Bytes})
	toks, _ := Random(o, 3, 5, Synth{Format: Tokens, Tokenizer: Bytes})
	for i := range text.Requests {
		_, ids := toks.Requests[i].Body()
		var b strings.Builder
		for _, id := range ids {
			b.WriteByte(byte(id))
		}
		if want := promptText(&text.Requests[i]); b.String() != want {
			t.Errorf("request %d: byte-level token ids %q differ from the text prompt %q", i, b.String(), want)
		}
	}
	approx, _ := Random(o, 3, 5, Synth{Format: Tokens, Tokenizer: Approx, IDLo: 100, IDHi: 200})
	for i, r := range approx.Requests {
		text, ids := r.Body()
		if len(ids) != r.PromptLen || r.PromptLen != 40 || text != "" {
			t.Errorf("request %d: %d ids, text %q, PromptLen %d, want 40 ids", i, len(ids), text, r.PromptLen)
		}
		for _, id := range ids {
			if id < 100 || id >= 200 {
				t.Fatalf("request %d: id %d outside [100, 200)", i, id)
			}
		}
	}
	words, _ := Random(o, 1, 5, Synth{Format: Text, Tokenizer: Approx})
	if n := len(strings.Fields(promptText(&words.Requests[0]))); n != 40 {
		t.Errorf("approx text prompt has %d words, want 40", n)
	}
}

func TestRandomBadOptions(t *testing.T) {
	for _, o := range []RandomOptions{
		{InputLen: 0, OutputLen: 1},
		{InputLen: 1, OutputLen: 0},
		{InputLen: 1, OutputLen: 1, RangeRatio: 1},
		{InputLen: 1, OutputLen: 1, RangeRatio: -0.1},
		{InputLen: 1, OutputLen: 1, PrefixLen: -1},
	} {
		if _, err := Random(o, 1, 0, Synth{}); !errors.Is(err, ErrBadOption) {
			t.Errorf("%+v: got %v, want ErrBadOption", o, err)
		}
	}
}

func TestParseDist(t *testing.T) {
	for _, tc := range []struct {
		spec    string
		want    Dist
		wantErr bool
	}{
		{spec: "const:value=7", want: Dist{Kind: "const", Mean: 7, Min: 1}},
		{spec: "uniform:min=3,max=9", want: Dist{Kind: "uniform", Min: 3, Max: 9}},
		{spec: "lognormal:mean=755,std=400,max=4096", want: Dist{Kind: "lognormal", Mean: 755, Std: 400, Min: 1, Max: 4096}},
		{spec: "exponential:mean=20,min=2", want: Dist{Kind: "exponential", Mean: 20, Min: 2}},
		{spec: "normal:mean=5", wantErr: true},
		{spec: "pareto:alpha=2", wantErr: true},
		{spec: "const:value=x", wantErr: true},
		{spec: "const:value=3,bogus=1", wantErr: true},
		{spec: "uniform:min=9,max=3", wantErr: true},
		{spec: "uniform:min=0,max=3", wantErr: true},
		{spec: "lognormal:mean=0,std=1", wantErr: true},
		{spec: "normal:mean=5,std=-1", wantErr: true},
		{spec: "const:7", wantErr: true},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			d, err := ParseDist(tc.spec)
			if tc.wantErr {
				if !errors.Is(err, ErrBadOption) {
					t.Fatalf("got %v, want ErrBadOption", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.want.spec = tc.spec
			if diff := cmp.Diff(tc.want, d, cmp.AllowUnexported(Dist{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestDistMoments(t *testing.T) {
	for _, tc := range []struct {
		spec      string
		mean, std float64
	}{
		{"lognormal:mean=755,std=400", 755, 400},
		{"normal:mean=200,std=30", 200, 30},
		{"exponential:mean=50", 50, 50},
		{"uniform:min=10,max=30", 20, math.Sqrt((21*21 - 1) / 12.0)},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			d, err := ParseDist(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			rng := newRand(3, 0)
			const n = 40000
			var sum, sq float64
			for range n {
				x := float64(d.Draw(rng))
				sum += x
				sq += x * x
			}
			mean := sum / n
			std := math.Sqrt(sq/n - mean*mean)
			// Rounding to integers and the min=1 clamp move the moments
			// by well under 3% for these parameters.
			if math.Abs(mean-tc.mean) > 0.03*tc.mean {
				t.Errorf("mean %.1f, want %.1f ± 3%%", mean, tc.mean)
			}
			if math.Abs(std-tc.std) > 0.05*tc.std {
				t.Errorf("std %.1f, want %.1f ± 5%%", std, tc.std)
			}
		})
	}
	d, _ := ParseDist("normal:mean=10,std=100,min=5,max=12")
	rng := newRand(1, 1)
	for range 1000 {
		if x := d.Draw(rng); x < 5 || x > 12 {
			t.Fatalf("draw %d outside the clamp [5, 12]", x)
		}
	}
}

func TestShareGPT(t *testing.T) {
	data, err := os.ReadFile("testdata/sharegpt.json")
	if err != nil {
		t.Fatal(err)
	}
	convs, err := ParseShareGPT(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(convs) != 4 {
		t.Fatalf("got %d two-turn conversations, want 4", len(convs))
	}
	prompts := func(w *Workload) []string {
		var p []string
		for _, r := range w.Requests {
			p = append(p, promptText(&r))
		}
		sort.Strings(p)
		return p
	}
	w, err := ShareGPT(convs, ShareGPTOptions{}, 2, 0, Synth{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"Explain goodput in one sentence.", "What is the capital of France?"}
	if diff := cmp.Diff(want, prompts(w)); diff != "" {
		t.Errorf("kept prompts (-want +got):\n%s", diff)
	}
	for _, r := range w.Requests {
		if text := promptText(&r); r.PromptLen != len(text) {
			t.Errorf("prompt %q: length %d, want its byte count", text, r.PromptLen)
		}
	}
	if len(w.Notes) != 0 {
		t.Errorf("unexpected notes %v", w.Notes)
	}

	// A fixed output length lifts the completion filter: "ok" now passes.
	w, err = ShareGPT(convs, ShareGPTOptions{OutputLen: 10}, 3, 0, Synth{})
	if err != nil {
		t.Fatal(err)
	}
	want = []string{"Explain goodput in one sentence.", "What is the capital of France?", "Write a haiku about the sea."}
	if diff := cmp.Diff(want, prompts(w)); diff != "" {
		t.Errorf("kept prompts with a fixed output length (-want +got):\n%s", diff)
	}
	for _, r := range w.Requests {
		if r.OutputLen != 10 {
			t.Errorf("output length %d, want 10", r.OutputLen)
		}
	}

	// More prompts than pass the filters: oversampled, noted.
	w, err = ShareGPT(convs, ShareGPTOptions{}, 5, 0, Synth{})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 5 || len(w.Notes) != 1 {
		t.Errorf("got %d requests and notes %v, want 5 requests and one note", len(w.Requests), w.Notes)
	}
	if _, err := ShareGPT(convs, ShareGPTOptions{}, 1, 0, Synth{Format: Tokens, Tokenizer: Approx}); !errors.Is(err, ErrBadOption) {
		t.Errorf("tokens on the approx tokenizer: got %v, want ErrBadOption", err)
	}
}

func TestShareGPTMalformed(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"sharegpt_bad.json", "line 6"},
		{"sharegpt_type.json", "line 3"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			_, err = ParseShareGPT(data)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrMalformed naming %s", err, tc.want)
			}
		})
	}
}

func openFixture(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestParseAzure(t *testing.T) {
	rows, err := ParseAzure(openFixture(t, "azure_2023.csv"))
	if err != nil {
		t.Fatal(err)
	}
	want := []TraceRow{
		{Arrival: 0, InputLen: 374, OutputLen: 44, Line: 2},
		{Arrival: 4314579 * time.Microsecond, InputLen: 396, OutputLen: 109, Line: 3},
		{Arrival: 4541877 * time.Microsecond, InputLen: 879, OutputLen: 55, Line: 4},
		{Arrival: 4710427 * time.Microsecond, InputLen: 91, OutputLen: 16, Line: 5},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("2023 rows (-want +got):\n%s", diff)
	}

	// 2024 spelling: zone, fraction sometimes absent, rows out of order.
	rows, err = ParseAzure(openFixture(t, "azure_2024.csv"))
	if err != nil {
		t.Fatal(err)
	}
	want = []TraceRow{
		{Arrival: 0, InputLen: 2000, OutputLen: 20, Line: 3},
		{Arrival: 990070 * time.Microsecond, InputLen: 100, OutputLen: 0, Line: 2},
		{Arrival: 2490070 * time.Microsecond, InputLen: 50, OutputLen: 5, Line: 4},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("2024 rows (-want +got):\n%s", diff)
	}
	w, err := FromTrace("azure", rows, TraceOptions{}, 0, 1, Synth{})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Requests[1].OutputLen; got != 1 {
		t.Errorf("0 generated tokens became %d, want 1", got)
	}
	if len(w.Notes) != 1 || !w.Timestamps {
		t.Errorf("notes %v, timestamps %v: want one note and timestamps", w.Notes, w.Timestamps)
	}
}

func TestParseAzureMalformed(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"azure_bad_time.csv", "line 4"},
		{"azure_bad_count.csv", "line 3"},
		{"azure_short_row.csv", "line 4"},
		{"azure_bad_header.csv", "line 1"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			_, err := ParseAzure(openFixture(t, tc.file))
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrMalformed naming %s", err, tc.want)
			}
		})
	}
	if _, err := ParseAzure(strings.NewReader("")); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty file: got %v, want ErrEmpty", err)
	}
	if _, err := ParseAzure(strings.NewReader("TIMESTAMP,ContextTokens,GeneratedTokens\n")); !errors.Is(err, ErrEmpty) {
		t.Errorf("header only: got %v, want ErrEmpty", err)
	}
}

func TestMooncakeSharedPrefixes(t *testing.T) {
	rows, err := ParseMooncake(openFixture(t, "mooncake.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var arrivals []time.Duration
	var lines []int
	for _, r := range rows {
		arrivals = append(arrivals, r.Arrival)
		lines = append(lines, r.Line)
	}
	if diff := cmp.Diff([]time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second}, arrivals); diff != "" {
		t.Errorf("arrivals (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{1, 2, 5, 4}, lines); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	for _, s := range []Synth{{}, {Format: Tokens, Tokenizer: Approx}} {
		t.Run(s.Format.String()+"/"+s.Tokenizer.String(), func(t *testing.T) {
			w, err := FromTrace("mooncake", rows, TraceOptions{}, 0, 9, s)
			if err != nil {
				t.Fatal(err)
			}
			seq := func(i int) []int32 {
				text, ids := w.Requests[i].Body()
				if ids != nil {
					return ids
				}
				ids = make([]int32, len(text))
				for k := range ids {
					ids[k] = int32(text[k])
				}
				return ids
			}
			common := func(a, b []int32) int {
				n := 0
				for n < len(a) && n < len(b) && a[n] == b[n] {
					n++
				}
				return n
			}
			// Requests (time order): [0 1 2] 1200, [0 1 3] 1100, [0 5] 700, [4] 300.
			for i, want := range []int{1200, 1100, 700, 300} {
				if got := len(seq(i)); got != want || w.Requests[i].PromptLen != want {
					t.Errorf("request %d: %d tokens (PromptLen %d), want %d", i, got, w.Requests[i].PromptLen, want)
				}
			}
			for _, tc := range []struct{ a, b, lo, hi int }{
				{0, 1, 1024, 1024 + 8}, // blocks 0 and 1 shared, then 2 vs 3 differ
				{0, 2, 512, 512 + 8},   // block 0 shared
				{0, 3, 0, 8},           // nothing shared
			} {
				// Distinct random blocks may agree on a few tokens by
				// chance; allow a short run past the shared blocks.
				if n := common(seq(tc.a), seq(tc.b)); n < tc.lo || n > tc.hi {
					t.Errorf("requests %d and %d share %d tokens, want %d (+ at most 8 by chance)", tc.a, tc.b, n, tc.lo)
				}
			}
			if w.Requests[3].OutputLen != 1 {
				t.Errorf("output_length 0 became %d, want 1", w.Requests[3].OutputLen)
			}
		})
	}
}

func TestParseMooncakeMalformed(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"mooncake_bad_json.jsonl", "line 3"},
		{"mooncake_missing.jsonl", "line 2"},
		{"mooncake_negative.jsonl", "line 3"},
		{"mooncake_type.jsonl", "line 1"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			_, err := ParseMooncake(openFixture(t, tc.file))
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrMalformed naming %s", err, tc.want)
			}
		})
	}
	if _, err := ParseMooncake(strings.NewReader("\n\n")); !errors.Is(err, ErrEmpty) {
		t.Errorf("blank file: got %v, want ErrEmpty", err)
	}
}

func TestFromTraceWindow(t *testing.T) {
	rows, err := ParseAzure(openFixture(t, "azure_2023.csv"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := FromTrace("azure", rows, TraceOptions{Skip: 1}, 2, 0, Synth{})
	if err != nil {
		t.Fatal(err)
	}
	got := []time.Duration{w.Requests[0].Arrival, w.Requests[1].Arrival}
	if diff := cmp.Diff([]time.Duration{0, 227298 * time.Microsecond}, got); diff != "" {
		t.Errorf("arrivals after skipping one row (-want +got):\n%s", diff)
	}
	if _, err := FromTrace("azure", rows, TraceOptions{Skip: 4}, 1, 0, Synth{}); !errors.Is(err, ErrBadOption) {
		t.Errorf("skip past the end: got %v, want ErrBadOption", err)
	}
	w, err = FromTrace("azure", rows, TraceOptions{}, 10, 0, Synth{})
	if err != nil || len(w.Requests) != 4 || len(w.Notes) != 1 {
		t.Errorf("asking for more rows than the trace has: %v, %d requests, notes %v", err, len(w.Requests), w.Notes)
	}
}

func promptText(r *Request) string {
	text, _ := r.Body()
	return text
}

// bodies returns every request's lengths and prompt.
func bodies(w *Workload) []string {
	var out []string
	for _, r := range w.Requests {
		text, ids := r.Body()
		out = append(out, fmt.Sprint(r.PromptLen, r.OutputLen, text, ids))
	}
	return out
}

func TestAzureSharedTraces(t *testing.T) {
	dir := filepath.Join(repotest.Traces(t), "azure-llm-2023")
	for _, tc := range []struct {
		file  string
		rows  int
		rate  float64
		meanP float64
	}{
		{"AzureLLMInferenceTrace_code.csv", 8819, 2.57, 2048},
		{"AzureLLMInferenceTrace_conv.csv", 19366, 5.53, 1155},
	} {
		t.Run(tc.file, func(t *testing.T) {
			w, err := Load(Options{Name: "azure", Path: filepath.Join(dir, tc.file), Seed: 1, Synth: Synth{Format: Tokens, Tokenizer: Approx}})
			if err != nil {
				t.Fatal(err)
			}
			if len(w.Requests) != tc.rows {
				t.Fatalf("%d requests, want %d", len(w.Requests), tc.rows)
			}
			span := w.Requests[len(w.Requests)-1].Arrival.Seconds()
			if rate := float64(tc.rows-1) / span; math.Abs(rate-tc.rate) > 0.02 {
				t.Errorf("mean rate %.3f req/s, want %.2f", rate, tc.rate)
			}
			if m := float64(w.TotalPromptTokens()) / float64(tc.rows); math.Abs(m-tc.meanP) > 1 {
				t.Errorf("mean context tokens %.1f, want %.0f", m, tc.meanP)
			}
		})
	}
}

func TestDistPrefix(t *testing.T) {
	in, _ := ParseDist("uniform:min=20,max=40")
	out, _ := ParseDist("const:value=4")
	w, err := FromDists(in, out, 32, 50, 3, Synth{})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.SharedPrefixLen(); got != 32 {
		t.Errorf("SharedPrefixLen = %d, want 32", got)
	}
	prefix := promptText(&w.Requests[0])[:32]
	for i, r := range w.Requests {
		text := promptText(&r)
		if len(text) != r.PromptLen || r.PromptLen < 52 || r.PromptLen > 72 {
			t.Errorf("request %d: %d bytes, PromptLen %d, want 32 + [20, 40]", i, len(text), r.PromptLen)
		}
		if !strings.HasPrefix(text, prefix) {
			t.Errorf("request %d does not start with the shared prefix", i)
		}
	}
	if _, err := FromDists(in, out, -1, 5, 3, Synth{}); !errors.Is(err, ErrBadOption) {
		t.Errorf("prefix -1: err %v, want ErrBadOption", err)
	}
}

// WithContentSeed keeps lengths and the shared prefix and changes the rest:
// the load generator's probes rely on it to send fresh prompts.
func TestWithContentSeed(t *testing.T) {
	in, _ := ParseDist("uniform:min=40,max=80")
	out, _ := ParseDist("const:value=4")
	w, err := FromDists(in, out, 16, 30, 5, Synth{})
	if err != nil {
		t.Fatal(err)
	}
	before := promptText(&w.Requests[3])
	c := w.WithContentSeed(99)
	if got := promptText(&w.Requests[3]); got != before {
		t.Fatal("WithContentSeed modified the original workload")
	}
	for i := range w.Requests {
		a, b := promptText(&w.Requests[i]), promptText(&c.Requests[i])
		if w.Requests[i].PromptLen != c.Requests[i].PromptLen || w.Requests[i].OutputLen != c.Requests[i].OutputLen || len(a) != len(b) {
			t.Fatalf("request %d: lengths changed", i)
		}
		if a[:16] != b[:16] {
			t.Errorf("request %d: the shared prefix changed", i)
		}
		if a[16:32] == b[16:32] {
			t.Errorf("request %d: the content after the prefix did not change", i)
		}
	}
	if d := c.WithContentSeed(5); promptText(&d.Requests[7]) != promptText(&w.Requests[7]) {
		t.Error("the loaded seed does not give the loaded content back")
	}

	// Mooncake blocks: requests that share a block still share it.
	rows, err := ParseMooncake(strings.NewReader(`{"timestamp": 0, "input_length": 32, "output_length": 2, "hash_ids": [1, 2]}
{"timestamp": 1, "input_length": 32, "output_length": 2, "hash_ids": [1, 3]}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := FromTrace("mooncake", rows, TraceOptions{BlockSize: 16}, 0, 1, Synth{})
	if err != nil {
		t.Fatal(err)
	}
	mc := m.WithContentSeed(2)
	a0, a1 := promptText(&mc.Requests[0]), promptText(&mc.Requests[1])
	if a0[:16] != a1[:16] {
		t.Error("reseeded requests no longer share their common block")
	}
	if a0[:16] == promptText(&m.Requests[0])[:16] {
		t.Error("the reseeded block has the old content")
	}
}
