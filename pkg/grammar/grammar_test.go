package grammar

import (
	"errors"
	"math"
	"testing"
)

// jsonGBNF is llama.cpp's grammars/json.gbnf.
const jsonGBNF = `
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
`

func TestJSONGrammar(t *testing.T) {
	g, err := Parse(jsonGBNF, "root")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		text     string
		ok, done bool
	}{
		{`{}`, true, true},
		{`{"a": [1, 2.5e3, "x\n", true, null, {"b": -0}]}`, true, true},
		{`{"a": "\u00e9"}`, true, true},
		{`{"a": "é"}`, true, true},
		{`{"a"`, true, false},
		{`{"a":`, true, false},
		{`[]`, false, false},
		{`{"a" 1}`, false, false},
		{`{"a": 01}`, false, false},
		{`{"a": "\q"}`, false, false},
		{`{} {}`, false, false},
		{"{\"a\": \"\x01\"}", false, false},
	} {
		m, err := g.Matcher()
		if err != nil {
			t.Fatal(err)
		}
		err = m.Accept([]byte(tc.text))
		if (err == nil) != tc.ok {
			t.Errorf("Accept(%q) = %v, want ok=%v", tc.text, err, tc.ok)
			continue
		}
		if tc.ok && m.Complete() != tc.done {
			t.Errorf("after %q: Complete() = %v, want %v", tc.text, m.Complete(), tc.done)
		}
		if !tc.ok && !errors.Is(err, ErrRejected) {
			t.Errorf("Accept(%q) error %v does not wrap ErrRejected", tc.text, err)
		}
	}
}

func TestRepetitionBounds(t *testing.T) {
	g, err := Parse(`root ::= "a"{2,3} "b"? [x-z]+ `, "root")
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string]bool{"aax": true, "aaabyz": true, "ax": false, "aaaax": false, "aab": false, "aabb": false} {
		m, _ := g.Matcher()
		ok := m.Accept([]byte(text)) == nil && m.Complete()
		if ok != want {
			t.Errorf("%q: complete match = %v, want %v", text, ok, want)
		}
	}
}

func TestMask(t *testing.T) {
	g, err := Parse(`root ::= "ab" | "abc"`, "root")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := g.Matcher()
	pieces := [][]byte{[]byte("a"), []byte("ab"), []byte("b"), []byte("abcd"), nil, []byte("")}
	eog := func(t int32) bool { return t == 4 }
	logits := make([]float32, len(pieces))
	m.Mask(logits, pieces, eog)
	want := []bool{true, true, false, false, false, false} // allowed
	for i, l := range logits {
		if (l == 0) != want[i] {
			t.Errorf("token %d (%q): logit %v, allowed want %v", i, pieces[i], l, want[i])
		}
	}
	if err := m.Accept([]byte("ab")); err != nil {
		t.Fatal(err)
	}
	logits = make([]float32, len(pieces))
	m.Mask(logits, pieces, eog)
	if !math.IsInf(float64(logits[0]), -1) || logits[4] != 0 || logits[3] == 0 {
		t.Errorf("after ab: logits %v, want only eog (4) and none of a/abcd", logits)
	}
	if m.Allows([]byte("c")) != true {
		t.Errorf("after ab, c (for abc) refused")
	}
}

func TestParseErrors(t *testing.T) {
	for _, text := range []string{
		`root ::= foo`,
		`root ::= "a`,
		`root ::= [a-`,
		`root ::= ("a"`,
		`root ::= "a")`,
		`root ::= "a"{x}`,
		`root ::= "\q"`,
		`root "a"`,
		`root ::= "a" root ::= "b"`,
	} {
		if _, err := Parse(text, "root"); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) = %v, want ErrSyntax", text, err)
		}
	}
	if _, err := Parse(`a ::= "x"`, "root"); !errors.Is(err, ErrSyntax) {
		t.Errorf("missing root: %v", err)
	}
	// Left recursion, direct, through a nullable prefix, or through a
	// chain of tail calls (which the matcher would expand without end),
	// is refused when the grammar is parsed.
	for _, text := range []string{
		`root ::= root "a" | "a"`,
		`root ::= "b"? root "a" | "a"`,
		`root ::= x` + "\n" + `x ::= y | "a"` + "\n" + `y ::= root`,
	} {
		if _, err := Parse(text, "root"); !errors.Is(err, ErrLeftRecursion) || !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) = %v, want ErrLeftRecursion", text, err)
		}
	}
	// Right recursion is fine.
	if _, err := Parse(`root ::= "a" root | "a"`, "root"); err != nil {
		t.Errorf("right recursion: %v", err)
	}
}
