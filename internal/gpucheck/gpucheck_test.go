package gpucheck

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCompareGreedy(t *testing.T) {
	pt := func(n int, text string) TTFTPoint { return TTFTPoint{PromptTokens: n, Text: text} }
	for _, tc := range []struct {
		name  string
		modes []ModeReport
		want  *bool
		n     int
	}{
		{"one mode", []ModeReport{{TTFT: []TTFTPoint{pt(8, "a")}}}, nil, 0},
		{"same", []ModeReport{{TTFT: []TTFTPoint{pt(8, "a"), pt(16, "b")}}, {TTFT: []TTFTPoint{pt(8, "a"), pt(16, "b")}}}, ptr(true), 2},
		{"one differs", []ModeReport{{TTFT: []TTFTPoint{pt(8, "a"), pt(16, "b")}}, {TTFT: []TTFTPoint{pt(8, "a"), pt(16, "c")}}}, ptr(false), 2},
		{"a prompt one mode skipped is not compared", []ModeReport{{TTFT: []TTFTPoint{pt(8, "a"), pt(16, "b")}}, {TTFT: []TTFTPoint{pt(8, "a")}}}, ptr(true), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, n := compareGreedy(tc.modes)
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) || n != tc.n {
				t.Errorf("compareGreedy = %v, %d; want %v, %d", deref(got), n, deref(tc.want), tc.n)
			}
		})
	}
}

func ptr(b bool) *bool { return &b }

func deref(b *bool) any {
	if b == nil {
		return nil
	}
	return *b
}

func TestParseInts(t *testing.T) {
	got, err := ParseInts("2048, 512,8192")
	if err != nil || !slices.Equal(got, []int{512, 2048, 8192}) {
		t.Errorf("ParseInts = %v, %v", got, err)
	}
	for _, bad := range []string{"1,x", "0", "-4"} {
		if _, err := ParseInts(bad); err == nil {
			t.Errorf("ParseInts(%q): no error", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	good := Options{Coordinator: "c", Model: "m", LlamaLib: "l", Out: "o", Deadline: time.Now(),
		Modes: []string{Disaggregated, Colocated}, PromptTokens: []int{8}, Batches: []int{1, 4},
		TTFTOutputTokens: 2, DecodeTokens: 2, DecodePromptTokens: 1, CtxSize: 64, MaxSeqs: 4}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no model", func(o *Options) { o.Model = "" }, "required"},
		{"no deadline", func(o *Options) { o.Deadline = time.Time{} }, "deadline"},
		{"unknown mode", func(o *Options) { o.Modes = []string{"split"} }, `mode "split"`},
		{"batch over max-seqs", func(o *Options) { o.Batches = []int{8} }, "exceeds max-seqs"},
		{"one output token", func(o *Options) { o.DecodeTokens = 1 }, "at least 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.edit(&o)
			if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestPromptsShareNoPrefix(t *testing.T) {
	a, b := prompt(64, 1), prompt(64, 2)
	if a[0] == b[0] && a[1] == b[1] {
		t.Errorf("prompts of seeds 1 and 2 start alike: %v %v", a[:2], b[:2])
	}
	if !slices.Equal(a, prompt(64, 1)) {
		t.Error("prompt is not deterministic")
	}
	for _, id := range a {
		if id < 1000 || id >= 30000 {
			t.Fatalf("token id %d outside [1000, 30000)", id)
		}
	}
}
