package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// optionalProps is an object schema of n optional properties of type t.
func optionalProps(n int, t string) string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{"type":%q}`, i, t)
	}
	b.WriteString(`}}`)
	return b.String()
}

// anyOf is a schema of n alternatives, alt(i) each.
func anyOf(n int, alt func(i int) string) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = alt(i)
	}
	return `{"anyOf":[` + strings.Join(parts, ",") + `]}`
}

// maxDepth is the depth of m's deepest parse stack.
func (m *Matcher) maxDepth() int {
	d := 0
	for _, st := range m.stacks {
		d = max(d, len(st))
	}
	return d
}

// Optional properties compile to a grammar whose size grows linearly and
// whose parse stacks stay shallow (issue 40 §4): 1,100 of them passed
// MaxDepth on the old grammar (the chain of optional rules stacked one
// position a property), and the matcher allowed nothing, which the
// workers turned into NUL bytes; 2,048 passed the old rule bound.
func TestOptionalPropertiesAreLinear(t *testing.T) {
	size := map[int]int{}
	for _, n := range []int{1000, 1100, 2000, 2048} {
		g, err := FromSchema([]byte(optionalProps(n, "integer")))
		if err != nil {
			t.Fatalf("%d optional properties: %v", n, err)
		}
		size[n] = len(g)
		m := matcher(t, g)
		// The last property alone, then the first and the last.
		for _, text := range []string{fmt.Sprintf(`{"p%d": 7}`, n-1), fmt.Sprintf(`{"p0": 1, "p%d": 2}`, n-1), `{}`} {
			mm := matcher(t, g)
			if err := mm.Accept([]byte(text)); err != nil || !mm.Complete() {
				t.Errorf("%d optional properties: %s refused: %v", n, text, err)
			}
		}
		if err := m.Accept([]byte(`{`)); err != nil {
			t.Fatal(err)
		}
		if d := m.maxDepth(); d > 8 {
			t.Errorf("%d optional properties: parse stacks %d deep after {, want a depth that does not grow with them", n, d)
		}
		if bad := `{"p1": 1, "p0": 2}`; matcher(t, g).Accept([]byte(bad)) == nil {
			t.Errorf("%d optional properties: out of order %s accepted", n, bad)
		}
	}
	if r := float64(size[2000]) / float64(size[1000]); r > 2.2 {
		t.Errorf("grammar of 2,000 optional properties is %.2f times that of 1,000, want linear growth", r)
	}
}

func matcher(t *testing.T, gbnf string) *Matcher {
	t.Helper()
	g, err := Parse(gbnf, "root")
	if err != nil {
		t.Fatal(err)
	}
	m, err := g.Matcher()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Long anyOf lists: identical alternatives merge into one (4,096 copies
// of one string schema were 4,096 parse stacks, past the matcher's bound
// inside the string, and 1,367 already returned """… with 200); distinct
// ones past the limit are refused naming it.
func TestLongAnyOf(t *testing.T) {
	for _, n := range []int{1367, 4096} {
		g, err := FromSchema([]byte(anyOf(n, func(int) string { return `{"type":"string"}` })))
		if err != nil {
			t.Fatalf("%d identical alternatives: %v", n, err)
		}
		m := matcher(t, g)
		if err := m.Accept([]byte(`"some text"`)); err != nil || !m.Complete() {
			t.Errorf("%d identical alternatives: a string refused: %v", n, err)
		}
	}
	g, err := FromSchema([]byte(anyOf(1000, func(i int) string { return fmt.Sprintf(`{"const":"v%d"}`, i) })))
	if err != nil {
		t.Fatal(err)
	}
	if m := matcher(t, g); m.Accept([]byte(`"v999"`)) != nil || !m.Complete() {
		t.Error(`1,000 distinct alternatives: "v999" refused`)
	}
	_, err = FromSchema([]byte(anyOf(1367, func(i int) string { return fmt.Sprintf(`{"const":"v%d"}`, i) })))
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "alternatives" {
		t.Errorf("1,367 distinct alternatives: %v, want the alternatives limit", err)
	}
}

// Each limit is checked as the schema is translated and named in a
// *LimitError.
func TestFromSchemaLimits(t *testing.T) {
	big := strings.Repeat("x", 100_000)
	for _, tc := range []struct{ name, schema, limit, path string }{
		{"schema bytes", `{"description":"` + strings.Repeat("d", 300<<10) + `"}`, "schema bytes", ""},
		{"const bytes", `{"type":"object","properties":{"a":{"const":"` + big + `"},"b":{"const":"` + big + `"}}}`, "literal bytes", "/properties/b"},
		{"enum bytes", `{"enum":["` + big + `","` + big + `"]}`, "literal bytes", ""},
		{"enum alternatives", `{"enum":[` + strings.TrimSuffix(strings.Repeat(`1,`, 2000), ",") + `]}`, "alternatives", ""},
		{"type list", `{"type":["string","number","integer","boolean","null","object","array"]}`, "", ""},
		{"properties", optionalProps(3000, "null"), "properties", ""},
		{"depth", strings.Repeat(`{"type":"array","items":`, 40) + `{}` + strings.Repeat(`}`, 40), "depth", strings.Repeat("/items", 33)},
		{"nested arrays", `{"type":"object","properties":{` + strings.TrimSuffix(strings.Repeat(`"a":{"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"array"}}}}},`, 1), ",") + `}}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromSchema([]byte(tc.schema))
			if tc.limit == "" {
				if err != nil {
					t.Fatalf("within the limits: %v", err)
				}
				return
			}
			var le *LimitError
			if !errors.As(err, &le) || le.Limit != tc.limit || le.Path != tc.path {
				t.Fatalf("%v, want the %s limit at %q", err, tc.limit, tc.path)
			}
			if !strings.Contains(err.Error(), tc.limit) {
				t.Errorf("%q does not name the limit %q", err, tc.limit)
			}
		})
	}
	// Rules and states: checked on the grammar, by Check and FromSchema.
	many := anyOf(1000, func(i int) string { return fmt.Sprintf(`{"type":"array","items":{"const":%d},"minItems":2}`, i) })
	g, err := FromSchema([]byte(many))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		lim   Limits
		limit string
	}{{Limits{Rules: 100}, "rules"}, {Limits{States: 1000}, "states"}} {
		_, err := Check(g, tc.lim)
		var le *LimitError
		if !errors.As(err, &le) || le.Limit != tc.limit {
			t.Errorf("Check with %+v: %v, want the %s limit", tc.lim, err, tc.limit)
		}
	}
	if _, err := Check(g, Limits{}); err != nil {
		t.Errorf("Check with the default limits: %v", err)
	}
	if _, err := Check(strings.Repeat(" ", MaxBytes+1)+`root ::= "a"`, Limits{}); !errors.As(err, new(*LimitError)) {
		t.Errorf("Check of a grammar over MaxBytes: %v", err)
	}
	// A repetition that would expand past the states is refused while
	// parsing, before it is built.
	if _, err := Parse(`root ::= "`+strings.Repeat("ab", 300)+`"{1000}`, "root"); !errors.As(err, new(*LimitError)) {
		t.Errorf("Parse of a repetition of 600,000 states: %v", err)
	}
}

// Every number and integer the grammar allows is finite as an IEEE
// double, and every integer exact (issue 40 §4): random sentences of the
// number and integer rules, each drawn character by character from what
// the matcher allows, parse with strconv and encoding/json. llama.cpp's
// rule (and the old one here) allowed 46E87236, which is +Inf.
func TestNumbersAreFinite(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	const alphabet = "0123456789-+.eE"
	integers := map[string]bool{`{"type":"integer"}`: true}
	for _, s := range []string{
		// zod 4's .int(), .int().nonnegative(), .int().positive(), .int().max(-3)
		`{"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991}`,
		`{"type":"integer","minimum":0}`,
		`{"type":"integer","exclusiveMinimum":0,"maximum":9007199254740991}`,
		`{"type":"integer","maximum":-3}`,
		`{"type":"integer","minimum":-1e300,"maximum":1e300}`,
	} {
		integers[s] = true
	}
	schemas := []string{`{"type":"number"}`}
	for s := range integers {
		schemas = append(schemas, s)
	}
	slices.Sort(schemas)
	for _, schema := range schemas {
		g, err := FromSchema([]byte(schema))
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"46E87236", "1e309", "1.5e100", "12345678901234567", "9007199254740992", "-9007199254740992"} {
			if m := matcher(t, g); m.Accept([]byte(bad)) == nil && m.Complete() {
				t.Errorf("%s: %s accepted", schema, bad)
			}
		}
		longest, draws := 0, 500
		if integers[schema] {
			draws = 150
		}
		for range draws {
			m := matcher(t, g)
			var text []byte
			for {
				var next []byte
				for i := range len(alphabet) {
					if m.Allows([]byte{alphabet[i]}) {
						next = append(next, alphabet[i])
					}
				}
				// Stop where the sentence may end, with probability 1/8.
				if len(next) == 0 || m.Complete() && rnd.IntN(8) == 0 {
					break
				}
				c := next[rnd.IntN(len(next))]
				if err := m.Accept([]byte{c}); err != nil {
					t.Fatal(err)
				}
				text = append(text, c)
			}
			if !m.Complete() {
				t.Fatalf("%s: %q is a dead end", schema, text)
			}
			longest = max(longest, len(text))
			f, err := strconv.ParseFloat(string(text), 64)
			if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				t.Fatalf("%s: %q parses to %v, %v", schema, text, f, err)
			}
			var v any
			if err := json.Unmarshal(text, &v); err != nil {
				t.Fatalf("%s: %q: %v", schema, text, err)
			}
			if integers[schema] {
				n, err := strconv.ParseInt(string(text), 10, 64)
				if err != nil || n > maxSafe || n < -maxSafe {
					t.Fatalf("%s: %q is not an integer exact as a double: %v", schema, text, err)
				}
				var lim struct{ Minimum, Maximum, ExclusiveMinimum *float64 }
				if err := json.Unmarshal([]byte(schema), &lim); err != nil {
					t.Fatal(err)
				}
				if lim.Minimum != nil && float64(n) < *lim.Minimum || lim.Maximum != nil && float64(n) > *lim.Maximum || lim.ExclusiveMinimum != nil && float64(n) <= *lim.ExclusiveMinimum {
					t.Fatalf("%s: %q is out of the range", schema, text)
				}
			}
		}
		if longest < 16 && strings.Contains(schema, "9007199254740991") {
			t.Errorf("%s: longest draw %d characters, the draws do not reach the bounds", schema, longest)
		}
		if longest < 20 && schema == `{"type":"number"}` {
			t.Errorf("%s: longest draw %d characters, the draws do not reach the bounds", schema, longest)
		}
	}
}

// Recursion ($ref cycles) and integer ranges stay within the limits: a
// $ref is translated once however often it is used, so a schema cannot
// multiply itself through references; a chain of references deeper than
// the depth limit is refused naming it; an integer range is at most a few
// hundred elements, so properties of ranges reach the states limit only
// past what the properties limit allows.
func TestRefsAndRangesWithinLimits(t *testing.T) {
	// 14 definitions each using the next one twice: 2^14 copies if
	// references were expanded.
	var defs []string
	for i := range 14 {
		defs = append(defs, fmt.Sprintf(`"d%d":{"type":"object","properties":{"a":{"$ref":"#/$defs/d%d"},"b":{"$ref":"#/$defs/d%d"}}}`, i, i+1, i+1))
	}
	defs = append(defs, `"d14":{"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991}`)
	g, err := FromSchema([]byte(`{"$ref":"#/$defs/d0","$defs":{` + strings.Join(defs, ",") + `}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(g) > 20_000 {
		t.Errorf("14 definitions used twice each: a grammar of %d bytes, want each translated once", len(g))
	}
	if m := matcher(t, g); m.Accept([]byte(`{"a": {"b": {}}, "b": {}}`)) != nil || !m.Complete() {
		t.Error("an instance of the referenced definitions refused")
	}

	// A chain of 40 distinct references passes the depth limit.
	defs = defs[:0]
	for i := range 40 {
		defs = append(defs, fmt.Sprintf(`"d%d":{"type":"array","items":{"$ref":"#/$defs/d%d"}}`, i, i+1))
	}
	defs = append(defs, `"d40":{"type":"null"}`)
	_, err = FromSchema([]byte(`{"$ref":"#/$defs/d0","$defs":{` + strings.Join(defs, ",") + `}}`))
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "depth" {
		t.Errorf("a chain of 40 references: %v, want the depth limit", err)
	}

	// Recursion: a tree of any depth, one rule for the cycle.
	tree := `{"type":"object","properties":{"v":{"type":"integer","minimum":1,"maximum":999},"kids":{"type":"array","items":{"$ref":"#"}}},"required":["v","kids"]}`
	g, err = FromSchema([]byte(tree))
	if err != nil {
		t.Fatal(err)
	}
	deep := strings.Repeat(`{"v": 7, "kids": [`, 50) + `{"v": 999, "kids": []}` + strings.Repeat(`]}`, 50)
	if m := matcher(t, g); m.Accept([]byte(deep)) != nil || !m.Complete() {
		t.Error("a tree 50 deep refused")
	}
	if m := matcher(t, g); m.Accept([]byte(`{"v": 1000, "kids": []}`)) == nil && m.Complete() {
		t.Error("v 1000 accepted, over the maximum 999")
	}

	// 2,048 properties of zod's .int(): one range rule for all of them.
	var props []string
	for i := range 2048 {
		props = append(props, fmt.Sprintf(`"p%d":{"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991}`, i))
	}
	g, err = FromSchema([]byte(`{"type":"object","properties":{` + strings.Join(props, ",") + `}}`))
	if err != nil {
		t.Fatalf("2,048 zod .int() properties: %v", err)
	}
	if m := matcher(t, g); m.Accept([]byte(`{"p0": -9007199254740991, "p2047": 9007199254740991}`)) != nil || !m.Complete() {
		t.Error("2,048 zod .int() properties: the bounds refused")
	}

	// 2,048 properties of distinct ranges: within the limits or refused
	// naming one, never a grammar past them.
	props = props[:0]
	for i := range 2048 {
		props = append(props, fmt.Sprintf(`"p%d":{"type":"integer","minimum":%d,"maximum":9007199254740991}`, i, -i*7919))
	}
	g, err = FromSchema([]byte(`{"type":"object","properties":{` + strings.Join(props, ",") + `}}`))
	switch {
	case errors.As(err, &le):
		t.Logf("2,048 integer ranges: refused over the %s limit", le.Limit)
	case err != nil:
		t.Fatal(err)
	default:
		if _, err := Check(g, Limits{}); err != nil {
			t.Fatalf("a grammar FromSchema returned fails Check: %v", err)
		}
		t.Logf("2,048 integer ranges: a grammar of %d bytes", len(g))
	}
}

// A number's bounds are a grammar (beyond llama.cpp, which ignores them):
// random walks of each schema's grammar end in numbers inside the range;
// numbers just outside it are refused; bounds the grammar cannot hold, and
// keywords no grammar here enforces, are refused naming them, never
// ignored.
func TestNumberBounds(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	const alphabet = "0123456789-+.eE"
	for _, tc := range []struct {
		schema string
		in     func(float64) bool
		out    []string
	}{
		{`{"type":"number","minimum":0,"maximum":1}`, func(v float64) bool { return v >= 0 && v <= 1 }, []string{"-0.5", "1.5", "2", "1.0001"}},
		{`{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":10}`, func(v float64) bool { return v > 0 && v < 10 }, []string{"0", "10", "10.5", "-1"}},
		{`{"type":"number","minimum":2.5}`, func(v float64) bool { return v >= 2.5 }, []string{"2", "2.4", "-3", "1e9"}},
		{`{"type":"number","maximum":100}`, func(v float64) bool { return v <= 100 }, []string{"101", "100.5", "1e3"}},
	} {
		g, err := FromSchema([]byte(tc.schema))
		if err != nil {
			t.Fatalf("%s: %v", tc.schema, err)
		}
		for _, bad := range tc.out {
			if m := matcher(t, g); m.Accept([]byte(bad)) == nil && m.Complete() {
				t.Errorf("%s: %s accepted", tc.schema, bad)
			}
		}
		complete := 0
		for range 300 {
			m := matcher(t, g)
			var text []byte
			for len(text) < 64 {
				var next []byte
				for i := range len(alphabet) {
					if m.Allows([]byte{alphabet[i]}) {
						next = append(next, alphabet[i])
					}
				}
				if len(next) == 0 || m.Complete() && rnd.IntN(4) == 0 {
					break
				}
				b := next[rnd.IntN(len(next))]
				if err := m.Accept([]byte{b}); err != nil {
					t.Fatal(err)
				}
				text = append(text, b)
			}
			if !m.Complete() {
				continue // the walk stopped early; nothing to check
			}
			complete++
			v, err := strconv.ParseFloat(string(text), 64)
			if err != nil || !tc.in(v) || math.IsInf(v, 0) {
				t.Errorf("%s: drew %q (%v, %v), outside the range", tc.schema, text, v, err)
			}
		}
		if complete < 100 {
			t.Errorf("%s: %d of 300 walks ended in a number, too few to check", tc.schema, complete)
		}
	}
	for _, s := range []string{
		`{"type":"number","minimum":-1,"maximum":1}`,
		`{"type":"number","maximum":-1}`,
		`{"minimum":0}`,
		`{"type":"string","not":{"const":"a"}}`,
		`{"type":"number","multipleOf":2}`,
		`{"type":"array","items":{"type":"integer"},"uniqueItems":true}`,
		`{"type":"object","properties":{"a":{"type":"string"}},"if":{"required":["a"]},"then":{"required":["b"]}}`,
		`{"type":"object","patternProperties":{"^x":{"type":"integer"}}}`,
	} {
		var ue *UnsupportedError
		if _, err := FromSchema([]byte(s)); !errors.As(err, &ue) {
			t.Errorf("%s: %v, want an UnsupportedError naming the keyword", s, err)
		}
	}
}
