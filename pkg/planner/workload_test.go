package planner

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

func TestLoadWorkload(t *testing.T) {
	tests := []struct {
		spec        string
		wantLengths []Lengths
		wantRate    float64
		wantBurst   float64 // 0: not checked
		wantGaps    int
		wantNote    string
	}{
		{spec: "fixed:512/64", wantLengths: []Lengths{{512, 64}}},
		{
			spec:        "testdata/azure.csv",
			wantLengths: []Lengths{{374, 44}, {396, 109}, {879, 1}, {91, 250}, {1200, 12}, {2048, 30}},
			wantRate:    5 / (58.90 - 46.68059), wantGaps: 5, wantNote: "0 output tokens",
		},
		{
			spec:        "testdata/mooncake.jsonl",
			wantLengths: []Lengths{{6755, 500}, {7319, 490}, {200, 10}},
			wantRate:    1, wantGaps: 2,
		},
		{
			spec:        "testdata/result_detailed.json",
			wantLengths: []Lengths{{100, 50}, {200, 100}, {300, 150}, {600, 100}},
			wantRate:    2.5, wantBurst: 0.5,
		},
		{
			// Its own arrivals (start_times, out of order): 4 gaps over 2 s.
			spec:        "testdata/result_arrivals.json",
			wantLengths: []Lengths{{100, 50}, {200, 100}, {300, 150}, {600, 100}},
			wantRate:    2, wantGaps: 4,
		},
		{
			spec:        "testdata/result_summary.json",
			wantLengths: []Lengths{{301, 100}},
			wantRate:    2, wantBurst: 1, wantNote: "mean lengths",
		},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			w, err := LoadWorkload(tt.spec, LoadOptions{})
			if err != nil {
				t.Fatalf("LoadWorkload: %v", err)
			}
			if diff := cmp.Diff(tt.wantLengths, w.Lengths); diff != "" {
				t.Errorf("lengths (-want +got):\n%s", diff)
			}
			if math.Abs(w.Rate-tt.wantRate) > 1e-6*max(tt.wantRate, 1) {
				t.Errorf("rate = %v, want %v", w.Rate, tt.wantRate)
			}
			if tt.wantBurst > 0 && w.Burstiness != tt.wantBurst {
				t.Errorf("burstiness = %v, want %v", w.Burstiness, tt.wantBurst)
			}
			if len(w.Gaps) != tt.wantGaps {
				t.Errorf("%d gaps, want %d", len(w.Gaps), tt.wantGaps)
			}
			if len(w.Gaps) > 0 {
				var sum float64
				for _, g := range w.Gaps {
					sum += g
				}
				if math.Abs(sum/float64(len(w.Gaps))-1) > 1e-9 {
					t.Errorf("gaps not normalised to mean 1: mean %v", sum/float64(len(w.Gaps)))
				}
			}
			if tt.wantNote != "" && !strings.Contains(strings.Join(w.Notes, "\n"), tt.wantNote) {
				t.Errorf("notes %q lack %q", w.Notes, tt.wantNote)
			}
			if w.Description == "" {
				t.Error("no description")
			}
		})
	}
}

func TestLoadShareGPT(t *testing.T) {
	w, err := LoadWorkload("testdata/sharegpt.json", LoadOptions{Samples: 8, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Lengths) != 8 || w.Rate != 0 || w.Gaps != nil {
		t.Fatalf("got %d samples, rate %v, gaps %v; want 8, 0, nil", len(w.Lengths), w.Rate, w.Gaps)
	}
	for _, l := range w.Lengths {
		if l.In < 4 || l.Out < 4 || l.In > 1024 {
			t.Errorf("sample %+v outside vLLM's ShareGPT filters", l)
		}
	}
	again, _ := LoadWorkload("testdata/sharegpt.json", LoadOptions{Samples: 8, Seed: 3})
	if diff := cmp.Diff(w, again); diff != "" {
		t.Errorf("same seed, different samples:\n%s", diff)
	}
}

func TestLoadWorkloadErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		spec string
		want error
	}{
		{"fixed:512", ErrWorkload},
		{"fixed:0/3", ErrWorkload},
		{"fixed:a/b", ErrWorkload},
		{"trace.txt", ErrWorkload},
		{write("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n"), ErrWorkload},
		{write("empty.json", "  "), ErrWorkload},
		{write("nothing.json", `{"completed": 0}`), ErrWorkload},
		{write("broken.json", `[{"conversations": 3}]`), ErrWorkload},
		{filepath.Join(dir, "missing.csv"), os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.spec), func(t *testing.T) {
			if _, err := LoadWorkload(tt.spec, LoadOptions{}); !errors.Is(err, tt.want) {
				t.Errorf("LoadWorkload(%q) = %v, want %v", tt.spec, err, tt.want)
			}
		})
	}
}

// The Azure traces load with the rates and burstiness their README states.
func TestAzureSharedTraces(t *testing.T) {
	data := repotest.Traces(t)
	for _, tt := range []struct {
		file        string
		rate, cv    float64
		meanIn, out float64
	}{
		{"AzureLLMInferenceTrace_conv.csv", 5.53, 1.09, 1155, 211},
		{"AzureLLMInferenceTrace_code.csv", 2.57, 13.2, 2048, 27.9},
	} {
		t.Run(tt.file, func(t *testing.T) {
			w, err := LoadWorkload(filepath.Join(data, "azure-llm-2023", tt.file), LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			st := w.Stats()
			if relErr(w.Rate, tt.rate) > 0.01 || relErr(cvOf(w.Gaps), tt.cv) > 0.02 || relErr(st.MeanIn, tt.meanIn) > 0.01 || relErr(st.MeanOut, tt.out) > 0.02 {
				t.Errorf("rate %.3f, CV %.3f, mean in %.0f, out %.1f; README: %v, %v, %v, %v",
					w.Rate, cvOf(w.Gaps), st.MeanIn, st.MeanOut, tt.rate, tt.cv, tt.meanIn, tt.out)
			}
			if !strings.Contains(strings.Join(w.Notes, " "), "CC-BY") {
				t.Error("no attribution note for the Azure trace")
			}
		})
	}
}

func TestStats(t *testing.T) {
	w := &Workload{Lengths: []Lengths{{10, 1}, {20, 2}, {30, 3}, {40, 4}}}
	want := LengthStats{Samples: 4, MeanIn: 25, MeanOut: 2.5, P50In: 20, P99In: 40, P50Out: 2, P99Out: 4, MaxTotal: 44}
	if diff := cmp.Diff(want, w.Stats()); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}

// The planner models every codec of package kv/codec; the lossy codecs'
// ratio is what they really produce.
func TestCodecModelsMatchCodecs(t *testing.T) {
	if diff := cmp.Diff(codec.Names(), CodecNames(), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("codec names (-kv/codec +planner):\n%s", diff)
	}
	raw := make([]byte, 1<<16)
	for i := range raw {
		raw[i] = byte(i * 7)
	}
	for _, name := range codec.Names() {
		real, err := codec.ByName(name)
		if err != nil {
			t.Fatal(err)
		}
		model := mustCodec(t, name)
		if model.Lossless != real.Lossless() {
			t.Errorf("%s: lossless %v, codec says %v", name, model.Lossless, real.Lossless())
		}
		if real.Lossless() {
			continue
		}
		enc, err := real.Encode(nil, raw, engine.BF16)
		if err != nil {
			t.Fatal(err)
		}
		if got := float64(len(raw)) / float64(len(enc)); relErr(model.Ratio, got) > 1e-3 {
			t.Errorf("%s: modelled ratio %.4f, encoded %.4f", name, model.Ratio, got)
		}
	}
	if _, err := CodecByName("lz4"); !errors.Is(err, ErrUnknownCodec) {
		t.Errorf("CodecByName(lz4) = %v, want ErrUnknownCodec", err)
	}
}

// A Mooncake trace's hash ids become dense block ids, in order of first
// appearance, and its infinite-cache ceiling counts the full blocks an
// earlier prompt named: the second prompt's first two (1024 tokens).
func TestMooncakeBlocks(t *testing.T) {
	dir := t.TempDir()
	f := dir + "/t.jsonl"
	trace := `{"timestamp": 0, "input_length": 1600, "output_length": 5, "hash_ids": [70, 8, 9, 10]}
{"timestamp": 10, "input_length": 1100, "output_length": 5, "hash_ids": [70, 8, 11]}
{"timestamp": 20, "input_length": 200, "output_length": 5, "hash_ids": [70]}
`
	if err := os.WriteFile(f, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := LoadWorkload(f, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]int32{{0, 1, 2, 3}, {0, 1, 4}, {0}}, w.Blocks); diff != "" || w.BlockTokens != MooncakeBlockTokens {
		t.Errorf("blocks of %d tokens (-want +got):\n%s", w.BlockTokens, diff)
	}
	// The third prompt fills no block: its 200 tokens never hit.
	if got, want := w.PrefixCeiling(), 1024.0/2900; math.Abs(got-want) > 1e-12 {
		t.Errorf("ceiling %v, want %v", got, want)
	}
	if !strings.Contains(w.Description, "512-token hash blocks (infinite-cache hit ratio 0.353)") {
		t.Errorf("description %q lacks the blocks", w.Description)
	}
	az, err := LoadWorkload("testdata/azure.csv", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if az.HasBlocks() || az.PrefixCeiling() != 0 {
		t.Error("an Azure trace names blocks")
	}
}
