package grammar

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// accepts reports whether text is a complete sentence of gbnf.
func accepts(t *testing.T, gbnf, text string) bool {
	t.Helper()
	g, err := Parse(gbnf, "root")
	if err != nil {
		t.Fatalf("generated grammar does not parse: %v\n%s", err, gbnf)
	}
	m, err := g.Matcher()
	if err != nil {
		t.Fatal(err)
	}
	return m.Accept([]byte(text)) == nil && m.Complete()
}

func TestJSONObjectGrammar(t *testing.T) {
	for text, want := range map[string]bool{
		`{}`: true, `{"a": [1, {"b": null}], "c": "d"}`: true, `{"a":true}`: true,
		`[]`: false, `"x"`: false, `{"a"}`: false, `{"a": tru}`: false,
	} {
		if got := accepts(t, JSONObject, text); got != want {
			t.Errorf("%s: accepted = %v, want %v", text, got, want)
		}
	}
}

func TestFromSchema(t *testing.T) {
	for _, tc := range []struct {
		name, schema string
		valid        []string
		invalid      []string
	}{
		{
			name:   "object with required and optional properties",
			schema: `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}},"ok":{"type":"boolean"}},"required":["name","age"],"additionalProperties":false}`,
			// In the order of properties, required first (llama.cpp's order).
			valid:   []string{`{"name": "x", "age": 3}`, `{"name": "", "age": -1, "ok": true}`, `{"name": "n", "age": 0, "tags": ["a", "b"], "ok": false}`, `{ "name" : "n", "age": 0, "tags": [ ] }`},
			invalid: []string{`{"name": "x"}`, `{"age": 3, "name": "x"}`, `{"name": "x", "age": 1.5}`, `{"name": "x", "age": 1,}`, `{"name": "x", "age": 1, "extra": 1}`, `{"name": 2, "age": 1}`, `{"name": "n", "age": 0, "ok": false, "tags": []}`},
		},
		{
			name:    "only optional properties",
			schema:  `{"type":"object","properties":{"a":{"type":"null"},"b":{"type":"number"}}}`,
			valid:   []string{`{}`, `{"a": null}`, `{"b": 2.5e3}`, `{"a": null, "b": 0}`},
			invalid: []string{`{,}`, `{"a": null,}`, `{"a": null "b": 0}`},
		},
		{
			name:    "enum, const and anyOf",
			schema:  `{"type":"object","properties":{"c":{"enum":["red","green",1]},"k":{"const":"v\"q"},"u":{"anyOf":[{"type":"integer"},{"type":"null"}]}},"required":["c","k","u"]}`,
			valid:   []string{`{"c": "red", "k": "v\"q", "u": 1}`, `{"c": 1, "k": "v\"q", "u": null}`},
			invalid: []string{`{"c": "blue", "k": "v\"q", "u": 1}`, `{"c": "red", "k": "v", "u": 1}`, `{"c": "red", "k": "v\"q", "u": "1"}`},
		},
		{
			name:    "array bounds and type lists",
			schema:  `{"type":"array","items":{"type":["string","null"]},"minItems":1,"maxItems":2}`,
			valid:   []string{`["a"]`, `[null, "b"]`},
			invalid: []string{`[]`, `["a", "b", "c"]`, `[1]`},
		},
		{
			name:    "any value",
			schema:  `{"description":"anything"}`,
			valid:   []string{`1`, `{"a": [true]}`, `"s"`},
			invalid: []string{`{`, `tru`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gbnf, err := FromSchema([]byte(tc.schema))
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range tc.valid {
				if !accepts(t, gbnf, v) {
					t.Errorf("valid %s refused by\n%s", v, gbnf)
				}
			}
			for _, v := range tc.invalid {
				if accepts(t, gbnf, v) {
					t.Errorf("invalid %s accepted by\n%s", v, gbnf)
				}
			}
		})
	}
}

func TestFromSchemaRefusals(t *testing.T) {
	for _, tc := range []struct{ schema, keyword, path string }{
		{`{"type":"string","pattern":"^(a$"}`, `pattern "^(a$" (unbalanced parentheses)`, ""},
		{`{"type":"object","properties":{"a":{"type":"string","pattern":"^a**[$"}}}`, `pattern "^a**[$" (unterminated character class)`, "/properties/a"},
		{`{"$ref":"#/$defs/x"}`, `$ref "#/$defs/x", which points to nothing in the schema`, ""},
		{`{"$ref":"other.json#/x"}`, `$ref "other.json#/x" (only local ones: # and #/...)`, ""},
		{`{"$ref":"#"}`, "$ref (a recursion that consumes no text)", ""},
		{`{"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]}`, "$ref (a recursion with no end: no finite instance)", ""},
		{`{"oneOf":[]}`, "oneOf that is not a non-empty array", ""},
		{`{"type":"integer","minimum":5,"exclusiveMaximum":5}`, "minimum above maximum (no integer in the range)", ""},
		{`{"type":"date"}`, `type "date"`, ""},
		{`{"type":123}`, "type that is not a string or list", ""},
		{`{"type":"array","items":{"type":"string","minLength":-1}}`, "minLength -1 (want a non-negative integer)", "/items"},
		{`{"type":"array","items":{},"minItems":3,"maxItems":2}`, "maxItems below minItems", ""},
		{`{"anyOf":[{"type":"string"},false]}`, "false (a schema no instance matches)", "/anyOf/1"},
	} {
		_, err := FromSchema([]byte(tc.schema))
		var u *UnsupportedError
		if !errors.As(err, &u) || u.Keyword != tc.keyword || u.Path != tc.path {
			t.Errorf("FromSchema(%s) = %v, want keyword %q at %q", tc.schema, err, tc.keyword, tc.path)
		}
	}
	if _, err := FromSchema([]byte(`{`)); err == nil {
		t.Errorf("FromSchema of broken JSON succeeded")
	}
	if _, err := FromSchema([]byte(strings.Repeat("[", 20000) + strings.Repeat("]", 20000))); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Errorf("FromSchema of JSON nested 20,000 deep: %v", err)
	}
	// Properties keep the order written; a repeated name its first place.
	g, err := FromSchema([]byte(`{"properties":{"z":{"const":1},"a":{"const":2},"z":{"const":3}},"required":["z","a"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !accepts(t, g, `{"z":3,"a":2}`) || accepts(t, g, `{"a":2,"z":3}`) || accepts(t, g, `{"z":1,"a":2}`) {
		t.Errorf("properties not in the order written, or the repeated one not the last value:\n%s", g)
	}
}

func TestSchemaSetComposes(t *testing.T) {
	var set SchemaSet
	a, err := set.Add([]byte(`{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := set.Add([]byte(`{"type":"object","properties":{"s":{"enum":["p","q"]}},"required":["s"]}`))
	if err != nil {
		t.Fatal(err)
	}
	g, err := Parse(set.Rules()+`root ::= "A" `+a+` | "B" `+b+"\n", "root")
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string]bool{`A{"x":1}`: true, `B{"s":"q"}`: true, `A{"s":"q"}`: false, `B{"x":1}`: false} {
		m, err := g.Matcher()
		if err != nil {
			t.Fatal(err)
		}
		got := m.Accept([]byte(text)) == nil && m.Complete()
		if got != want {
			t.Errorf("%s: accepted %v, want %v", text, got, want)
		}
	}
	if _, err := set.Add([]byte(`{"type":"string","pattern":"^(a+$"}`)); err == nil {
		t.Error("invalid pattern accepted")
	}
}

// Every string a pattern's grammar allows is a JSON string whose value
// matches the pattern (Go's regexp judges): llama.cpp's rules write " \
// and controls raw, so ^"$ gave """, which no parser reads. Sentences are
// drawn from the grammar, near misses it accepts are checked too.
func TestPatternsStayJSON(t *testing.T) {
	for _, p := range []string{
		`^"$`, `^a\\b$`, `^\d{3}-\w+$`, `^[^a-c]{2,4}$`, `^.{1,5}$`, `^x\sy$`, `^(?:ab|c\.d)+$`,
		`^[A-Za-z0-9_'+\-]+@[a-z\-]+\.[a-z]{2,}$`, `^\S+\D$`, `^é[東-東]\t$`,
	} {
		schema, _ := json.Marshal(map[string]any{"type": "string", "pattern": p})
		gbnf, err := FromSchema(schema)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if strings.Contains(gbnf, "root ::= string") {
			t.Fatalf("%s: translated as any string", p)
		}
		g, err := Parse(gbnf, "root")
		if err != nil {
			t.Fatal(err)
		}
		re := regexp.MustCompile(p)
		rnd := rand.New(rand.NewPCG(5, uint64(len(p))))
		s := newSampler(g, rnd)
		for range 50 {
			text, ok := s.sentence()
			if !ok {
				continue
			}
			for _, x := range append(nearMisses(text, rnd, 3), text) {
				if x != text && !member(g, x) {
					continue
				}
				var v string
				if err := json.Unmarshal([]byte(x), &v); err != nil {
					t.Errorf("%s: %q is not a JSON string: %v", p, x, err)
				} else if !re.MatchString(v) {
					t.Errorf("%s: %q does not match", p, v)
				}
			}
		}
	}
}

// No rule of a generated grammar ends with an empty alternative ("a |"):
// llama.cpp's GBNF parser, which the llamacpp engine compiles the same
// text with, reads past the line's end into the next rule's name and
// refuses the grammar (two optional properties made one; llama.cpp's
// sampler and the Go mask were checked to agree on the corpus's
// grammars with pkg/engine/llamacpp's TestGrammarMatchesGoMask).
func TestNoTrailingEmptyAlternative(t *testing.T) {
	for _, schema := range []string{
		optionalProps(5, "integer"),
		`{"type":"object","properties":{"v":{"type":"integer"},"w":{"type":"null"}},"additionalProperties":{"type":"string","maxLength":3}}`,
		`{"type":"array","items":{"type":"string","pattern":"^a{0}b?(c|)$"},"maxItems":3}`,
	} {
		g, err := FromSchema([]byte(schema))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(g, "\n") {
			if strings.HasSuffix(strings.TrimSpace(line), "|") {
				t.Errorf("%s: rule %q ends with an empty alternative", schema, line)
			}
		}
	}
}
