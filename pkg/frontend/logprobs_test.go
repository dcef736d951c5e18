package frontend

import (
	"slices"
	"testing"
)

func TestRuneCounterOffsets(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []string
		want   []int
	}{
		{"ascii", []string{"ab", "c", "de"}, []int{0, 2, 3}},
		{"a character over two tokens", []string{"a", "\xe2\x82", "\xac", "b"}, []int{0, 1, 1, 2}},
		// A lead byte whose character never completes is one character
		// (U+FFFD) of its own: the next token starts after it.
		{"broken character", []string{"s", "\xc8", "\"", "x"}, []int{0, 1, 2, 3}},
		{"two broken bytes", []string{"\xc8", "\xe2", "z"}, []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r runeCounter
			var got []int
			for _, tok := range tc.tokens {
				got = append(got, r.next([]byte(tok)))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("offsets %v, want %v", got, tc.want)
			}
		})
	}
}
