package grammar

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"
)

// checkPattern: FromSchema of a string schema with pattern p returns a
// grammar or a typed error (*UnsupportedError, *LimitError), never a
// grammar of its own that does not parse (which the frontend would
// report as "not a JSON Schema").
func checkPattern(t *testing.T, p string) {
	schema, _ := json.Marshal(map[string]any{"type": "string", "pattern": p})
	_, err := FromSchema(schema)
	var u *UnsupportedError
	var le *LimitError
	if err != nil && !errors.As(err, &u) && !errors.As(err, &le) {
		t.Errorf("pattern %q: %v", p, err)
	}
}

// FuzzPattern: go test -fuzz FuzzPattern ./pkg/grammar/. Its seeds are
// what a random search found: a quantifier after | and after {0} wrote a
// grammar that did not parse.
func FuzzPattern(f *testing.F) {
	for _, p := range []string{`^3|+$`, `^a|?b$`, `^xx{0}?$`, `^(a|*)$`, `^[\d\-]{2,}\.x{,3}$`, `^(?:a(?:b)+)*$`} {
		f.Add(p)
	}
	f.Fuzz(checkPattern)
}

// TestRandomPatterns draws short patterns from the characters that
// matter to the translation.
func TestRandomPatterns(t *testing.T) {
	rnd := rand.New(rand.NewPCG(2, 9))
	alpha := []rune(`ab^$.()[]{}*+?|\-"dwsSx0123,:é` + "\n\x00")
	for range 5000 {
		r := []rune{'^'}
		for range rnd.IntN(12) {
			r = append(r, alpha[rnd.IntN(len(alpha))])
		}
		checkPattern(t, string(append(r, '$')))
	}
}
