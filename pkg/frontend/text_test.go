package frontend

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

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

// pieces is a tokenizer whose tokens are byte strings that may cut a UTF-8
// sequence anywhere, as byte-level BPE vocabularies do: token i decodes to
// the bytes of pieces[i].
type pieces []string

func (p pieces) decodeToken(id int32) []byte { return []byte(p[id]) }

// ids returns the tokens of the given pieces, adding unknown ones to p.
func (p *pieces) ids(ps ...string) []int32 {
	out := make([]int32, len(ps))
	for i, x := range ps {
		j := slices.Index(*p, x)
		if j < 0 {
			*p = append(*p, x)
			j = len(*p) - 1
		}
		out[i] = int32(j)
	}
	return out
}

// Tokens that end or start inside a multi-byte character, pushed one
// token at a time: the text handed out is always valid UTF-8, and stop
// strings spanning several such tokens are caught.
func TestTextStreamPartialUTF8Tokens(t *testing.T) {
	type step struct {
		Tokens      []string // pushed together, one token each
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
			name: "three-byte rune over three tokens",
			steps: []step{
				{[]string{"a\xe2"}, "a", false},
				{[]string{"\x9c"}, "", false},
				{[]string{"\x93b"}, "✓b", false},
			},
		},
		{
			name:  "rune split inside one push",
			steps: []step{{[]string{"x\xc3", "\xa9y"}, "xéy", false}},
		},
		{
			name:  "four-byte rune, tail then the next rune's head",
			steps: []step{{[]string{"\xf0\x9f"}, "", false}, {[]string{"\x98\x80\xc3"}, "😀", false}, {[]string{"\xa9"}, "é", false}},
		},
		{
			name:  "stop string over three tokens",
			stops: []string{"STOP"},
			steps: []step{{[]string{"abS"}, "ab", false}, {[]string{"TO"}, "", false}, {[]string{"Pcd"}, "", true}},
		},
		{
			name:  "multi-byte stop string over three tokens cutting its runes",
			stops: []string{"é✓"},
			steps: []step{{[]string{"a\xc3"}, "a", false}, {[]string{"\xa9\xe2\x9c"}, "", false}, {[]string{"\x93z"}, "", true}},
		},
		{
			name:  "held multi-byte stop prefix released whole when it fails",
			stops: []string{"✓✓"},
			steps: []step{{[]string{"a✓"}, "a", false}, {[]string{"\xe2"}, "", false}, {[]string{"\x9c\x94"}, "✓✔", false}},
		},
		{
			name:      "incomplete rune at the end is flushed as is",
			steps:     []step{{[]string{"ok\xe2\x9c"}, "ok", false}},
			wantFlush: "\xe2\x9c",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var vocab pieces
			s := &textStream{decode: func(id int32) []byte { return vocab.decodeToken(id) }, stops: tc.stops}
			for i, st := range tc.steps {
				text, stopped := s.push(vocab.ids(st.Tokens...))
				if diff := cmp.Diff(st, step{st.Tokens, text, stopped}); diff != "" {
					t.Errorf("step %d (-want +got):\n%s", i, diff)
				}
				if !utf8.ValidString(text) {
					t.Errorf("step %d handed out invalid UTF-8 %q", i, text)
				}
			}
			if got := s.flush(); got != tc.wantFlush {
				t.Errorf("flush = %q, want %q", got, tc.wantFlush)
			}
		})
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
