package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// JSONObject is the GBNF of response_format {"type": "json_object"}: any
// JSON object (llama.cpp's grammars/json.gbnf, root an object).
const JSONObject = primitives + `root ::= object
value ::= object | array | string | number | boolean | null
object ::= "{" space ( string ":" space value ( "," space string ":" space value )* )? "}" space
array ::= "[" space ( value ( "," space value )* )? "]" space
`

// primitives are the rules every generated grammar shares, as llama.cpp's
// json-schema-to-grammar writes them, except that numbers are bounded so
// that every one is finite as an IEEE double and every integer exact in
// one (what JavaScript's JSON.parse and zod's .int(), Go's encoding/json
// and Python's json read): at most 15 integral digits (below 2^53), 16
// fraction digits, and an exponent of at most two digits, so the largest
// magnitude is under 1e115. llama.cpp's exponent takes up to 16 digits,
// and 46E87236 is Infinity to every one of those parsers.
const primitives = `space ::= | " " | "\n" [ \t]{0,20}
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\"" space
integral-part ::= [0] | [1-9] [0-9]{0,14}
number ::= ("-"? integral-part) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})? space
integer ::= ("-"? integral-part) space
boolean ::= ("true" | "false") space
null ::= "null" space
`

// UnsupportedError names a JSON Schema keyword (or keyword value) that
// FromSchema cannot turn into a grammar.
type UnsupportedError struct {
	Keyword string // e.g. "pattern", "type: \"foo\""
	Path    string // JSON pointer of the schema holding it; "" is the root
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("grammar: JSON Schema keyword %s (at %q) is not supported", e.Keyword, "#"+e.Path)
}

// annotations are keywords that do not constrain instances.
var annotations = []string{"$schema", "$id", "$comment", "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly"}

// Limits bound what a schema may make: each is checked while the schema
// is translated, before the grammar grows past it, and a schema over one
// gets a *LimitError naming it. Zero fields take DefaultLimits' values.
type Limits struct {
	// SchemaBytes bounds the schema's JSON text.
	SchemaBytes int
	// LiteralBytes bounds the JSON text of every const and enum value and
	// property name of the schema, together (OpenAI's structured outputs
	// allow 120,000 characters of them).
	LiteralBytes int
	// Alternatives bounds one anyOf, enum or type list, after identical
	// alternatives are merged.
	Alternatives int
	// Properties bounds the properties of one object.
	Properties int
	// Depth bounds the nesting of subschemas.
	Depth int
	// Rules and States bound the grammar: its rules, and its elements
	// (character classes and rule references, the positions a parse stack
	// holds), as Check counts them. Its text is bounded by MaxBytes.
	Rules, States int
}

// DefaultLimits are the limits of FromSchema and SchemaSet. A schema
// within them translates in milliseconds to a grammar under MaxBytes, and
// its matcher's stacks stay shallow (see Matcher).
var DefaultLimits = Limits{
	SchemaBytes:  256 << 10,
	LiteralBytes: 120_000,
	Alternatives: 1024,
	Properties:   2048,
	Depth:        32,
	Rules:        16384,
	States:       262144,
}

// MaxBytes bounds a grammar's GBNF text, as requests carry it to the
// workers.
const MaxBytes = 1 << 20

func (l Limits) orDefault() Limits {
	d := DefaultLimits
	for _, f := range []struct{ v, def *int }{
		{&l.SchemaBytes, &d.SchemaBytes}, {&l.LiteralBytes, &d.LiteralBytes}, {&l.Alternatives, &d.Alternatives},
		{&l.Properties, &d.Properties}, {&l.Depth, &d.Depth}, {&l.Rules, &d.Rules}, {&l.States, &d.States},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return l
}

// LimitError is a schema or grammar over one of its Limits (or MaxBytes).
type LimitError struct {
	Limit string // "schema bytes", "literal bytes", "alternatives", "properties", "depth", "rules", "states", "grammar bytes"
	Max   int
	Path  string // JSON pointer of the schema where it was passed; "" is the root, or a grammar
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("grammar: over the limit of %d %s (at %q)", e.Max, e.Limit, "#"+e.Path)
}

// FromSchema returns a GBNF grammar (root rule "root") whose sentences
// are the JSON texts that validate against schema, for this subset of
// JSON Schema: type (a name or a list of names), properties, required,
// additionalProperties false (absent is treated as false: no other
// property is generated, which validates either way), items, minItems,
// maxItems, enum, const, anyOf, and the annotations. Properties are
// generated required first, then optional, each group in the order of
// properties. Any other keyword is refused with an *UnsupportedError.
// Errors also report a schema that is not JSON.
//
// The schema must lie within DefaultLimits (else a *LimitError), and so
// must the grammar (Check): a grammar over MaxBytes, or over the limits
// of rules and states, is refused here rather than by the workers.
func FromSchema(schema []byte) (string, error) {
	c := &converter{lim: DefaultLimits}
	root, err := c.add(schema)
	if err != nil {
		return "", err
	}
	g := primitives + "root ::= " + root + "\n" + c.rules.String()
	if _, err := Check(g, c.lim); err != nil {
		return "", err
	}
	return g, nil
}

type converter struct {
	lim      Limits
	rules    strings.Builder
	n        int
	literals int  // bytes of const and enum values and property names
	hasValue bool // the any-JSON rules are written
}

// add decodes one schema and returns its expression.
func (c *converter) add(schema []byte) (string, error) {
	c.lim = c.lim.orDefault()
	if len(schema) > c.lim.SchemaBytes {
		return "", &LimitError{Limit: "schema bytes", Max: c.lim.SchemaBytes}
	}
	var s any
	d := json.NewDecoder(bytes.NewReader(schema))
	d.UseNumber()
	if err := d.Decode(&s); err != nil {
		return "", fmt.Errorf("grammar: schema is not JSON: %w", err)
	}
	return c.visit(s, "", 0)
}

func (c *converter) rule(body string) (string, error) {
	if c.n++; c.n > c.lim.Rules {
		return "", &LimitError{Limit: "rules", Max: c.lim.Rules}
	}
	if c.rules.Len()+len(body) > MaxBytes {
		return "", &LimitError{Limit: "grammar bytes", Max: MaxBytes}
	}
	name := fmt.Sprintf("r%d", c.n)
	fmt.Fprintf(&c.rules, "%s ::= %s\n", name, body)
	return name, nil
}

// literal returns the GBNF literal of v's JSON text, counted against the
// literal bytes of the schema.
func (c *converter) literal(v any, path string) (string, error) {
	q, n, err := literal(v)
	if err != nil {
		return "", err
	}
	if c.literals += n; c.literals > c.lim.LiteralBytes {
		return "", &LimitError{Limit: "literal bytes", Max: c.lim.LiteralBytes, Path: path}
	}
	return q, nil
}

// alternatives joins exprs as a group, identical ones merged (an anyOf
// of 4,096 copies of one schema is one alternative, not 4,096 parse
// stacks). Errors: a *LimitError over Alternatives.
func (c *converter) alternatives(exprs []string, path string) (string, error) {
	seen := make(map[string]bool, len(exprs))
	out := exprs[:0:0]
	for _, e := range exprs {
		if !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	if len(out) > c.lim.Alternatives {
		return "", &LimitError{Limit: "alternatives", Max: c.lim.Alternatives, Path: path}
	}
	if len(out) == 1 {
		return out[0], nil
	}
	return "(" + strings.Join(out, " | ") + ")", nil
}

// literal returns the GBNF literal of v's JSON text followed by space,
// and the length of that JSON text.
func literal(v any) (string, int, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", 0, err
	}
	var q strings.Builder
	q.WriteByte('"')
	for _, ch := range string(b) {
		switch {
		case ch == '"' || ch == '\\':
			q.WriteByte('\\')
			q.WriteRune(ch)
		case ch < 0x20:
			fmt.Fprintf(&q, "\\x%02X", ch)
		default:
			q.WriteRune(ch)
		}
	}
	q.WriteString(`" space`)
	return q.String(), len(b), nil
}

func (c *converter) visit(s any, path string, depth int) (string, error) {
	if depth > c.lim.Depth {
		return "", &LimitError{Limit: "depth", Max: c.lim.Depth, Path: path}
	}
	switch s := s.(type) {
	case bool:
		if s {
			return "value", c.needValue()
		}
		return "", &UnsupportedError{Keyword: "false (a schema no instance matches)", Path: path}
	case map[string]any:
		return c.object(s, path, depth)
	}
	return "", &UnsupportedError{Keyword: "a schema that is not an object", Path: path}
}

// needValue makes sure the any-JSON rules exist once.
func (c *converter) needValue() error {
	if c.hasValue {
		return nil
	}
	c.hasValue = true
	_, after, _ := strings.Cut(JSONObject, "root ::= object\n")
	c.rules.WriteString(after)
	return nil
}

func (c *converter) object(s map[string]any, path string, depth int) (string, error) {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		switch {
		case slices.Contains(annotations, k):
		case k == "type", k == "properties", k == "required", k == "items", k == "minItems", k == "maxItems", k == "enum", k == "const", k == "anyOf":
		case k == "additionalProperties":
			if s[k] != false {
				return "", &UnsupportedError{Keyword: "additionalProperties other than false", Path: path}
			}
		default:
			return "", &UnsupportedError{Keyword: k, Path: path}
		}
	}
	if v, ok := s["const"]; ok {
		return c.literal(v, path)
	}
	if v, ok := s["enum"]; ok {
		vals, ok := v.([]any)
		if !ok || len(vals) == 0 {
			return "", &UnsupportedError{Keyword: "enum that is not a non-empty array", Path: path}
		}
		if len(vals) > c.lim.Alternatives {
			return "", &LimitError{Limit: "alternatives", Max: c.lim.Alternatives, Path: path}
		}
		alts := make([]string, len(vals))
		for i, v := range vals {
			var err error
			if alts[i], err = c.literal(v, path); err != nil {
				return "", err
			}
		}
		return c.alternatives(alts, path)
	}
	if v, ok := s["anyOf"]; ok {
		subs, ok := v.([]any)
		if !ok || len(subs) == 0 {
			return "", &UnsupportedError{Keyword: "anyOf that is not a non-empty array", Path: path}
		}
		if len(subs) > c.lim.Alternatives*4 {
			// Not even merging identical ones can bring it under the limit
			// cheaply: refuse before translating them all.
			return "", &LimitError{Limit: "alternatives", Max: c.lim.Alternatives, Path: path}
		}
		alts := make([]string, len(subs))
		for i, sub := range subs {
			var err error
			if alts[i], err = c.visit(sub, fmt.Sprintf("%s/anyOf/%d", path, i), depth+1); err != nil {
				return "", err
			}
		}
		return c.alternatives(alts, path)
	}
	var types []string
	switch t := s["type"].(type) {
	case nil:
		if _, ok := s["properties"]; ok {
			types = []string{"object"}
		} else if _, ok := s["items"]; ok {
			types = []string{"array"}
		} else {
			return "value", c.needValue()
		}
	case string:
		types = []string{t}
	case []any:
		for _, x := range t {
			name, ok := x.(string)
			if !ok {
				return "", &UnsupportedError{Keyword: "type list with a non-string", Path: path}
			}
			types = append(types, name)
		}
	default:
		return "", &UnsupportedError{Keyword: "type that is not a string or list", Path: path}
	}
	alts := make([]string, 0, len(types))
	for _, t := range types {
		var alt string
		var err error
		switch t {
		case "string", "number", "integer", "boolean", "null":
			alt = t
		case "object":
			alt, err = c.props(s, path, depth)
		case "array":
			alt, err = c.array(s, path, depth)
		default:
			err = &UnsupportedError{Keyword: fmt.Sprintf("type %q", t), Path: path}
		}
		if err != nil {
			return "", err
		}
		alts = append(alts, alt)
	}
	return c.alternatives(alts, path)
}

func (c *converter) props(s map[string]any, path string, depth int) (string, error) {
	props, _ := s["properties"].(map[string]any)
	if _, ok := s["properties"]; ok && props == nil {
		return "", &UnsupportedError{Keyword: "properties that is not an object", Path: path}
	}
	if len(props) > c.lim.Properties {
		return "", &LimitError{Limit: "properties", Max: c.lim.Properties, Path: path}
	}
	var required []string
	if v, ok := s["required"]; ok {
		list, ok := v.([]any)
		if !ok {
			return "", &UnsupportedError{Keyword: "required that is not an array", Path: path}
		}
		for _, x := range list {
			name, ok := x.(string)
			if _, defined := props[name]; !ok || !defined {
				return "", &UnsupportedError{Keyword: fmt.Sprintf("required %v without a schema in properties", x), Path: path}
			}
			required = append(required, name)
		}
	}
	names := make([]string, 0, len(props))
	for k := range props {
		names = append(names, k)
	}
	slices.Sort(names) // JSON objects carry no order; keep output deterministic
	kv := func(name string) (string, error) {
		key, err := c.literal(name, path)
		if err != nil {
			return "", err
		}
		val, err := c.visit(props[name], path+"/properties/"+name, depth+1)
		if err != nil {
			return "", err
		}
		return c.rule(key + ` ":" space ` + val)
	}
	var req, opt []string
	for _, name := range names {
		r, err := kv(name)
		if err != nil {
			return "", err
		}
		if slices.Contains(required, name) {
			req = append(req, r)
		} else {
			opt = append(opt, r)
		}
	}
	// tail(i) is a non-empty, comma-separated, in-order selection of
	// opt[i:]: opt[i] then rest(i+1), or tail(i+1); rest(i) is nothing or
	// a comma and tail(i). Every reference to the next rule ends its
	// alternative (a tail call, which the matcher does not stack), so the
	// grammar grows by three rules a property and its parse stacks by one
	// a property that may come next, never deeper.
	tail := ""
	for i := len(opt) - 1; i >= 0; i-- {
		body := opt[i]
		if tail != "" {
			rest, err := c.rule(`"," space ` + tail + ` |`)
			if err != nil {
				return "", err
			}
			body = fmt.Sprintf(`%s %s | %s`, opt[i], rest, tail)
		}
		var err error
		if tail, err = c.rule(body); err != nil {
			return "", err
		}
	}
	inner := strings.Join(req, ` "," space `)
	switch {
	case inner != "" && tail != "":
		inner += ` ( "," space ` + tail + ` )?`
	case tail != "":
		inner = tail + "?"
	}
	return c.rule(`"{" space ` + inner + ` "}" space`)
}

func (c *converter) array(s map[string]any, path string, depth int) (string, error) {
	item := "value"
	if v, ok := s["items"]; ok {
		var err error
		if item, err = c.visit(v, path+"/items", depth+1); err != nil {
			return "", err
		}
	} else if err := c.needValue(); err != nil {
		return "", err
	}
	count := func(k string) (int, bool, error) {
		v, ok := s[k]
		if !ok {
			return 0, false, nil
		}
		n, ok := v.(json.Number)
		i, err := n.Int64()
		if !ok || err != nil || i < 0 || i > MaxDepth {
			return 0, false, &UnsupportedError{Keyword: fmt.Sprintf("%s %v (want an integer in [0, %d])", k, v, MaxDepth), Path: path}
		}
		return int(i), true, nil
	}
	lo, _, err := count("minItems")
	if err != nil {
		return "", err
	}
	hi, bounded, err := count("maxItems")
	if err != nil {
		return "", err
	}
	if bounded && hi < lo {
		return "", &UnsupportedError{Keyword: "maxItems below minItems", Path: path}
	}
	var body string
	switch {
	case bounded && hi == 0:
		body = `"[" space "]" space`
	case lo == 0:
		rest := `( "," space ` + item + ` )*`
		if bounded {
			rest = fmt.Sprintf(`( "," space %s ){0,%d}`, item, hi-1)
		}
		body = `"[" space ( ` + item + " " + rest + ` )? "]" space`
	default:
		rest := fmt.Sprintf(`( "," space %s ){%d,}`, item, lo-1)
		if bounded {
			rest = fmt.Sprintf(`( "," space %s ){%d,%d}`, item, lo-1, hi-1)
		}
		body = `"[" space ` + item + " " + rest + ` "]" space`
	}
	return c.rule(body)
}
