package grammar

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// relaxed returns schema without the keywords FromSchema, as llama.cpp,
// does not enforce (a number's minimum and maximum), so that a validator
// of it judges what the grammar promises.
func relaxed(t *testing.T, schema []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(schema, &v); err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if x["type"] == "number" {
				for _, k := range []string{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} {
					delete(x, k)
				}
			}
			for _, y := range x {
				walk(y)
			}
		case []any:
			for _, y := range x {
				walk(y)
			}
		}
	}
	walk(v)
	b, _ := json.Marshal(v)
	return string(b)
}

// TestZodCorpus: the JSON Schemas zod 4, the OpenAI SDK's
// zodResponseFormat and zodFunction, and the Agents SDK emit
// (testdata/zod, made by testdata/zod/gen.mjs) compile, every sentence
// drawn from the grammar validates against its schema, and so does every
// near miss the grammar accepts. A JSON Schema validator judges (formats
// asserted); the number bounds FromSchema does not enforce are left out.
func TestZodCorpus(t *testing.T) {
	files, err := filepath.Glob("testdata/zod/*.json")
	if err != nil || len(files) < 15 {
		t.Fatalf("corpus: %d files, %v", len(files), err)
	}
	for _, f := range files {
		if filepath.Base(f) == "versions.json" {
			continue
		}
		t.Run(strings.TrimSuffix(filepath.Base(f), ".json"), func(t *testing.T) {
			schema, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			gbnf, err := FromSchema(schema)
			if err != nil {
				t.Fatalf("FromSchema: %v", err)
			}
			g, err := Parse(gbnf, "root")
			if err != nil {
				t.Fatal(err)
			}
			v := validator(relaxed(t, schema))
			if v == nil {
				t.Fatal("the validator cannot compile the schema")
			}
			rnd := rand.New(rand.NewPCG(3, uint64(len(f))))
			s := newSampler(g, rnd)
			drawn, misses := 0, 0
			for range 100 {
				text, ok := s.sentence()
				if !ok {
					continue
				}
				drawn++
				if !member(g, text) {
					t.Fatalf("a sentence drawn from the grammar is not in it: %q", text)
				}
				if !valid(v, text) {
					t.Errorf("drawn %q does not validate against the schema", text)
				}
				for _, m := range nearMisses(text, rnd, 4) {
					if member(g, m) {
						if !valid(v, m) {
							t.Errorf("near miss %q accepted, but does not validate against the schema", m)
						}
					} else {
						misses++
					}
				}
			}
			if drawn < 90 || misses == 0 {
				t.Errorf("%d sentences drawn, %d near misses refused", drawn, misses)
			}
		})
	}
}

// TestZodInstances: hand-written instances of the corpus's schemas, the
// valid ones accepted and the invalid ones refused.
func TestZodInstances(t *testing.T) {
	const person = `{"id": "123e4567-e89b-12d3-a456-426614174000", "email": "ann.o'neil+x@mail.example.org", "age": 41, "score": 0.5, "born": "1984-02-29", "seen": "2026-12-06T10:00:00.123Z", "code": "ABC-1234", "slug": "a-b-c", "tags": ["x", "yz"], "nick": null%s}`
	for _, tc := range []struct {
		file      string
		valid     []string
		invalid   []string
		validOnly bool
	}{
		{file: "zod-person", valid: []string{
			strings.Replace(person, "%s", "", 1),
			strings.Replace(person, "%s", `, "rank": 9007199254740991`, 1),
		}, invalid: []string{
			strings.Replace(person, "%s", `, "rank": 0`, 1),                                                                // exclusiveMinimum 0
			strings.Replace(person, "%s", `, "rank": 9007199254740992`, 1),                                                 // past MAX_SAFE_INTEGER
			strings.Replace(person, "%s", `, "extra": 1`, 1),                                                               // additionalProperties false
			strings.Replace(strings.Replace(person, "%s", "", 1), `"age": 41`, `"age": -1`, 1),                             // nonnegative
			strings.Replace(strings.Replace(person, "%s", "", 1), `"age": 41`, `"age": 4.5`, 1),                            // int
			strings.Replace(strings.Replace(person, "%s", "", 1), `mail.example.org`, `mail`, 1),                           // email
			strings.Replace(strings.Replace(person, "%s", "", 1), `1984-02-29`, `1985-02-29`, 1),                           // not a leap year
			strings.Replace(strings.Replace(person, "%s", "", 1), `.123Z`, `+01:00`, 1),                                    // zod's datetime: Z only
			strings.Replace(strings.Replace(person, "%s", "", 1), `-12d3-`, `-02d3-`, 1),                                   // uuid version
			strings.Replace(strings.Replace(person, "%s", "", 1), `ABC-1234`, `AB-1234`, 1),                                // regex
			strings.Replace(strings.Replace(person, "%s", "", 1), `["x", "yz"]`, `[]`, 1),                                  // minItems
			strings.Replace(strings.Replace(person, "%s", "", 1), `"yz"`, `"yz", "a", "b", "c", "d"`, 1),                   // maxItems
			strings.Replace(strings.Replace(person, "%s", "", 1), `"yz"`, `"abcdefghijk"`, 1),                              // maxLength
			strings.Replace(strings.Replace(person, "%s", "", 1), `"age": 41, "score": 0.5`, `"score": 0.5, "age": 41`, 1), // order
		}},
		{file: "openai-function-weather", valid: []string{`{"city": "Zürich", "days": 14, "units": "celsius"}`, `{"city":"x","days":1,"units":"fahrenheit"}`},
			invalid: []string{`{"city": "", "days": 3, "units": "celsius"}`, `{"city": "x", "days": 15, "units": "celsius"}`, `{"city": "x", "days": 0, "units": "celsius"}`, `{"city": "x", "days": 3, "units": "kelvin"}`}},
		{file: "zod-lazy-category", valid: []string{`{"name": "a", "subcategories": [{"name": "b", "subcategories": [{"name": "c", "subcategories": []}]}]}`},
			invalid: []string{`{"name": "a", "subcategories": [{"name": "b"}]}`, `{"name": "a", "subcategories": [1]}`}},
		{file: "zod-lazy-defs", valid: []string{`{"left": {"name": "a", "subcategories": []}, "right": {"value": -3, "next": {"value": 4, "next": null}}}`, `{"left": {"name": "a", "subcategories": []}, "right": null}`},
			invalid: []string{`{"left": null, "right": null}`, `{"left": {"name": "a", "subcategories": []}, "right": {"value": 1.5, "next": null}}`}},
		{file: "zod-discriminated", valid: []string{`{"kind": "circle", "r": 1.5e2}`, `{"kind": "square", "side": -7}`},
			invalid: []string{`{"kind": "square", "side": 101}`, `{"kind": "circle", "side": 1}`, `{"kind": "circle", "r": 1e300}`}},
		{file: "zod-int-positive", valid: []string{`{"n": 1, "m": 9}`, `{"n": 9007199254740991, "m": -9007199254740991}`},
			invalid: []string{`{"n": 0, "m": 9}`, `{"n": 1, "m": 10}`, `{"n": 1, "m": -9007199254740992}`, `{"n": 01, "m": 1}`}},
	} {
		schema, err := os.ReadFile("testdata/zod/" + tc.file + ".json")
		if err != nil {
			t.Fatal(err)
		}
		gbnf, err := FromSchema(schema)
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		v := validator(string(schema))
		for _, text := range tc.valid {
			if !valid(v, text) {
				t.Fatalf("%s: test instance %s is not valid", tc.file, text)
			}
			if !accepts(t, gbnf, text) {
				t.Errorf("%s: valid %s refused", tc.file, text)
			}
		}
		for _, text := range tc.invalid {
			if accepts(t, gbnf, text) {
				t.Errorf("%s: invalid %s accepted", tc.file, text)
			}
		}
	}
}
