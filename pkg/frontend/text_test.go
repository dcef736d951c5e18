package frontend

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/tokenizer"
)

func TestTextStream(t *testing.T) {
	tok := tokenizer.Bytes{}
	type step struct {
		In          string // bytes pushed as one token each
		WantText    string
		WantStopped bool
	}
	tests := []struct {
		name      string
		stops     []string
		steps     []step
		wantFlush string
	}{
		{
			name:  "no stops passes text through",
			steps: []step{{"ab", "ab", false}, {"c", "c", false}},
		},
		{
			name:  "multi-byte rune held until complete",
			steps: []step{{"a\xc3", "a", false}, {"\xa9b", "éb", false}},
		},
		{
			name:      "incomplete rune flushed at the end",
			steps:     []step{{"x\xe2\x9c", "x", false}},
			wantFlush: "\xe2\x9c",
		},
		{
			name:  "invalid byte not held",
			steps: []step{{"a\xff", "a\xff", false}},
		},
		{
			name:  "stop inside one push",
			stops: []string{"END"},
			steps: []step{{"helloENDmore", "hello", true}, {"x", "", true}},
		},
		{
			name:  "stop across pushes is held back then cut",
			stops: []string{"END"},
			steps: []step{{"abE", "ab", false}, {"N", "", false}, {"D", "", true}},
		},
		{
			name:      "held prefix released when it cannot match",
			stops:     []string{"END"},
			steps:     []step{{"abEN", "ab", false}, {"x", "ENx", false}},
			wantFlush: "",
		},
		{
			name:      "held prefix flushed at the end",
			stops:     []string{"END"},
			steps:     []step{{"abEN", "ab", false}},
			wantFlush: "EN",
		},
		{
			name:  "earliest of several stops",
			stops: []string{"yz", "b"},
			steps: []step{{"abcxyz", "a", true}},
		},
		{
			name:  "overlapping prefixes of two stops",
			stops: []string{"aab", "ac"},
			steps: []step{{"xaa", "x", false}, {"c", "a", true}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &textStream{decode: tok.DecodeToken, stops: tc.stops}
			for i, st := range tc.steps {
				text, stopped := s.push(tok.Encode(st.In))
				if diff := cmp.Diff(st, step{st.In, text, stopped}); diff != "" {
					t.Errorf("step %d (-want +got):\n%s", i, diff)
				}
			}
			if got := s.flush(); got != tc.wantFlush {
				t.Errorf("flush = %q, want %q", got, tc.wantFlush)
			}
		})
	}
}

// Pushing token by token or all at once yields the same text.
func TestTextStreamChunkingInvariant(t *testing.T) {
	tok := tokenizer.Bytes{}
	input := "héllo wörld ✓ STOP after"
	for _, stops := range [][]string{nil, {"STOP"}, {"wö", "✓"}} {
		whole := &textStream{decode: tok.DecodeToken, stops: stops}
		want, _ := whole.push(tok.Encode(input))
		want += whole.flush()

		split := &textStream{decode: tok.DecodeToken, stops: stops}
		var sb strings.Builder
		for _, id := range tok.Encode(input) {
			text, _ := split.push([]int32{id})
			sb.WriteString(text)
		}
		sb.WriteString(split.flush())
		if sb.String() != want {
			t.Errorf("stops %q: token by token %q, at once %q", stops, sb.String(), want)
		}
	}
}

// BenchmarkTextStream pushes 1 KiB of mixed text token by token with two
// stop strings.
func BenchmarkTextStream(b *testing.B) {
	tok := tokenizer.Bytes{}
	ids := tok.Encode(strings.Repeat("héllo wörld ✓ ", 64))
	b.SetBytes(int64(len(ids)))
	b.ReportAllocs()
	for b.Loop() {
		s := &textStream{decode: tok.DecodeToken, stops: []string{"STOP", "\n\n"}}
		for i := range ids {
			s.push(ids[i : i+1])
		}
		s.flush()
	}
}
