package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// JSONObject is the GBNF of response_format {"type": "json_object"}: any
// JSON object, with llama.cpp's object rule.
const JSONObject = primitives + "root ::= object\n"

// primitives are the rules every generated grammar shares, as llama.cpp's
// json-schema-to-grammar writes them (its PRIMITIVE_RULES and
// STRING_FORMAT_RULES, with whitespace where it allows it: after { [ , :
// and a key, before } ]), except that numbers are bounded so that every
// one is finite as an IEEE double and every integer exact in one (what
// JavaScript's JSON.parse and zod's .int(), Go's encoding/json and
// Python's json read): at most 15 integral digits (below 2^53), 16
// fraction digits, and an exponent of at most two digits, so the largest
// magnitude is under 1e115. llama.cpp's integral part and exponent take
// up to 16 digits, and 46E87236 is Infinity to every one of those
// parsers.
const primitives = `space ::= | " " | "\n"{1,2} [ \t]{0,20}
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\""
integral-part ::= [0] | [1-9] [0-9]{0,14}
decimal-part ::= [0-9]{1,16}
number ::= ("-"? integral-part) ("." decimal-part)? ([eE] [-+]? ([0] | [1-9] [0-9]?))?
integer ::= ("-"? integral-part)
boolean ::= ("true" | "false")
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" space ( string ":" space value ("," space string ":" space value)* )? space "}"
array ::= "[" space ( value ("," space value)* )? space "]"
uuid ::= "\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\""
date ::= [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )
time ::= ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )
date-time ::= date "T" time
date-string ::= "\"" date "\""
time-string ::= "\"" time "\""
date-time-string ::= "\"" date-time "\""
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

// unenforceable are keywords that constrain instances in ways no grammar
// here enforces. llama.cpp's converter accepts and ignores them; pdserve
// refuses them, so that no response is sent as valid under a schema it
// was not held to.
var unenforceable = []string{"not", "if", "then", "else", "multipleOf", "uniqueItems", "minProperties", "maxProperties",
	"patternProperties", "propertyNames", "contains", "minContains", "maxContains", "dependentRequired", "dependentSchemas",
	"dependencies", "unevaluatedProperties", "unevaluatedItems"}

// unenforced returns the UnsupportedError of the first keyword of s that
// its grammar would not enforce: one of unenforceable, or a numeric bound
// on a schema not typed integer (integer bounds are digit grammars; a
// number's are not).
func unenforced(s *object, path string) error {
	for _, k := range unenforceable {
		if s.has(k) {
			return &UnsupportedError{Keyword: k, Path: path}
		}
	}
	typ, _ := s.get("type")
	if _, list := typ.([]any); list || typ == "integer" || typ == "number" {
		return nil // a list is checked type by type; number and integer bounds are grammars
	}
	for _, k := range []string{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} {
		if s.has(k) {
			return &UnsupportedError{Keyword: k + " (without type integer or number)", Path: path}
		}
	}
	return nil
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
	Limit string // "schema bytes", "literal bytes", "alternatives", "properties", "depth", "repetitions", "rules", "states", "grammar bytes"
	Max   int
	Path  string // JSON pointer of the schema where it was passed; "" is the root, or a grammar
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("grammar: over the limit of %d %s (at %q)", e.Max, e.Limit, "#"+e.Path)
}

// FromSchema returns a GBNF grammar (root rule "root") whose sentences
// are the JSON texts of schema's instances, for every schema llama.cpp's
// json-schema-to-grammar converts, with the same language (see
// docs/api.md's table of keywords): type (a name or a list), properties
// in the order written (required ones first, then the optional ones, each
// group in that order), required, additionalProperties (false, true or a
// schema), items, prefixItems, minItems, maxItems, enum, const, anyOf,
// oneOf (as anyOf), allOf (of objects and enums), $ref (local, "#" and
// "#/..." pointers into $defs, definitions or anywhere, recursion
// included), integer minimum, maximum, exclusiveMinimum and
// exclusiveMaximum, string minLength and maxLength, an anchored pattern
// (^...$), and format date, time, date-time and uuid. As llama.cpp does,
// other keywords do not constrain the grammar (a number's minimum, format
// email, an unanchored pattern or one GBNF cannot express: any string),
// and {} is any object. It departs from llama.cpp where llama.cpp's
// grammar allows what no client can read: numbers are bounded (see
// primitives), integer ranges lie within ±(2^53-1), and strings stay
// JSON strings (a pattern's . and negated classes exclude ", \ and the
// controls, as does the key of an additional property).
//
// Errors: an *UnsupportedError naming what cannot be translated (a type
// that is not a JSON type, a $ref that does not resolve or is not local,
// an invalid pattern, false, an empty range, a recursion that consumes no
// text or never ends), a schema that is not JSON, a *LimitError: the
// schema must lie within DefaultLimits, and so must the grammar (Check).
func FromSchema(schema []byte) (string, error) {
	c := &converter{lim: DefaultLimits}
	root, err := c.add(schema)
	if err != nil {
		return "", err
	}
	g := primitives + "root ::= " + root + "\n" + c.rules.String()
	if _, err := Check(g, c.lim); err != nil {
		switch {
		case errors.Is(err, ErrLeftRecursion):
			return "", &UnsupportedError{Keyword: "$ref (a recursion that consumes no text)"}
		case errors.Is(err, ErrNoSentence):
			return "", &UnsupportedError{Keyword: "$ref (a recursion with no end: no finite instance)"}
		}
		return "", err
	}
	return g, nil
}

type converter struct {
	lim      Limits
	rules    bytes.Buffer
	n        int
	literals int // bytes of const and enum values and property names

	doc  any               // the schema being added, which $ref points into
	refs map[string]string // $ref → its rule

	memo    map[string]string // rule body → its rule
	memoLog []string          // the bodies of memo, in the order added
}

// add decodes one schema and returns its expression.
func (c *converter) add(schema []byte) (string, error) {
	c.lim = c.lim.orDefault()
	if len(schema) > c.lim.SchemaBytes {
		return "", &LimitError{Limit: "schema bytes", Max: c.lim.SchemaBytes}
	}
	s, err := decodeOrdered(schema)
	if err != nil {
		return "", fmt.Errorf("grammar: schema is not JSON: %w", err)
	}
	c.doc, c.refs = s, map[string]string{}
	return c.visit(s, "", 0)
}

// reserve counts a rule and returns its name.
func (c *converter) reserve() (string, error) {
	if c.n++; c.n > c.lim.Rules {
		return "", &LimitError{Limit: "rules", Max: c.lim.Rules}
	}
	return fmt.Sprintf("r%d", c.n), nil
}

func (c *converter) define(name, body string) error {
	if c.rules.Len()+len(body) > MaxBytes {
		return &LimitError{Limit: "grammar bytes", Max: MaxBytes}
	}
	fmt.Fprintf(&c.rules, "%s ::= %s\n", name, body)
	return nil
}

// rule returns the rule of body: one rule per distinct body (every
// zod .int() of a schema shares one range).
func (c *converter) rule(body string) (string, error) {
	if name, ok := c.memo[body]; ok {
		return name, nil
	}
	name, err := c.reserve()
	if err != nil {
		return "", err
	}
	if c.memo == nil {
		c.memo = map[string]string{}
	}
	c.memo[body] = name
	c.memoLog = append(c.memoLog, body)
	return name, c.define(name, body)
}

// literal returns the GBNF literal of v's JSON text, counted against the
// literal bytes of the schema.
func (c *converter) literal(v any, path string) (string, error) {
	var b strings.Builder
	if err := encodeJSON(&b, v); err != nil {
		return "", err
	}
	if c.literals += b.Len(); c.literals > c.lim.LiteralBytes {
		return "", &LimitError{Limit: "literal bytes", Max: c.lim.LiteralBytes, Path: path}
	}
	return Literal(b.String()), nil
}

// Literal quotes s as a GBNF string literal (package chattmpl's tool
// grammars use it too).
func Literal(s string) string {
	var q strings.Builder
	q.WriteByte('"')
	for _, ch := range s {
		switch {
		case ch == '"' || ch == '\\':
			q.WriteByte('\\')
			q.WriteRune(ch)
		case ch == '\n':
			q.WriteString(`\n`)
		case ch < 0x20:
			fmt.Fprintf(&q, "\\x%02X", ch)
		default:
			q.WriteRune(ch)
		}
	}
	q.WriteByte('"')
	return q.String()
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

func (c *converter) visit(s any, path string, depth int) (string, error) {
	if depth > c.lim.Depth {
		return "", &LimitError{Limit: "depth", Max: c.lim.Depth, Path: path}
	}
	switch s := s.(type) {
	case bool:
		if s {
			return "value", nil
		}
		return "", &UnsupportedError{Keyword: "false (a schema no instance matches)", Path: path}
	case *object:
		return c.schema(s, path, depth)
	}
	return "", &UnsupportedError{Keyword: "a schema that is not an object", Path: path}
}

// schema translates one schema object, its keywords taken in llama.cpp's
// order of precedence (visit in json-schema-to-grammar.cpp).
func (c *converter) schema(s *object, path string, depth int) (string, error) {
	if err := unenforced(s, path); err != nil {
		return "", err
	}
	if ref, ok := s.get("$ref"); ok {
		return c.ref(ref, path, depth)
	}
	for _, k := range []string{"oneOf", "anyOf"} {
		if v, ok := s.get(k); ok {
			return c.union(v, k, path, depth)
		}
	}
	typ, _ := s.get("type")
	if list, ok := typ.([]any); ok {
		if len(list) == 0 {
			return "", &UnsupportedError{Keyword: "type that is an empty list", Path: path}
		}
		if len(list) > c.lim.Alternatives {
			return "", &LimitError{Limit: "alternatives", Max: c.lim.Alternatives, Path: path}
		}
		alts := make([]string, len(list))
		for i, t := range list {
			if _, ok := t.(string); !ok {
				return "", &UnsupportedError{Keyword: "type list with a non-string", Path: path}
			}
			var err error
			if alts[i], err = c.schema(s.with("type", t), path, depth); err != nil {
				return "", err
			}
		}
		return c.alternatives(alts, path)
	}
	if v, ok := s.get("const"); ok {
		return c.literal(v, path)
	}
	if v, ok := s.get("enum"); ok {
		return c.enum(v, path)
	}
	tn, isStr := typ.(string)
	if typ != nil && !isStr {
		return "", &UnsupportedError{Keyword: "type that is not a string or list", Path: path}
	}
	untyped := typ == nil
	ap, hasAP := s.get("additionalProperties")
	if (untyped || tn == "object") && (s.has("properties") || hasAP && ap != true) {
		return c.object(s, path, depth)
	}
	if (untyped || tn == "object" || tn == "string") && s.has("allOf") {
		return c.allOf(s, path, depth)
	}
	if (untyped || tn == "array") && (s.has("items") || s.has("prefixItems")) {
		return c.array(s, path, depth)
	}
	if p, ok := s.get("pattern"); ok && (untyped || tn == "string") {
		return c.pattern(p, path)
	}
	format, hasFormat := s.get("format")
	if f, ok := format.(string); hasFormat && !ok {
		return "", &UnsupportedError{Keyword: "format that is not a string", Path: path}
	} else if untyped || tn == "string" {
		switch {
		case f == "uuid" || len(f) == 5 && strings.HasPrefix(f, "uuid") && f[4] >= '1' && f[4] <= '5':
			return "uuid", nil
		case f == "date" || f == "time" || f == "date-time":
			return f + "-string", nil
		}
	}
	if tn == "string" && (s.has("minLength") || s.has("maxLength")) {
		lo, hi, err := c.bounds(s, "minLength", "maxLength", path)
		if err != nil {
			return "", err
		}
		return c.rule(`"\"" ` + repetition("char", lo, hi, "") + ` "\""`)
	}
	if tn == "integer" && (s.has("minimum") || s.has("maximum") || s.has("exclusiveMinimum") || s.has("exclusiveMaximum")) {
		return c.integer(s, path)
	}
	if tn == "number" && (s.has("minimum") || s.has("maximum") || s.has("exclusiveMinimum") || s.has("exclusiveMaximum")) {
		return c.number(s, path)
	}
	if len(s.keys) == 0 || tn == "object" {
		return "object", nil
	}
	if untyped {
		return "value", nil
	}
	switch tn {
	case "string", "number", "integer", "boolean", "null", "array":
		return tn, nil
	}
	return "", &UnsupportedError{Keyword: fmt.Sprintf("type %q", tn), Path: path}
}

// bound is one of a schema's numeric bounds: its keyword and value.
type bound struct {
	k string
	v float64
}

// numericBounds returns the minimum, exclusiveMinimum, maximum and
// exclusiveMaximum s gives, in that order; an UnsupportedError for one
// that is not a finite number.
func numericBounds(s *object, path string) ([]bound, error) {
	var out []bound
	for _, k := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		v, ok := s.get(k)
		if !ok {
			continue
		}
		n, isNum := v.(json.Number)
		f, err := n.Float64()
		if !isNum || err != nil || math.IsInf(f, 0) {
			return nil, &UnsupportedError{Keyword: fmt.Sprintf("%s %v (want a number)", k, v), Path: path}
		}
		out = append(out, bound{k, f})
	}
	return out, nil
}

// number translates a number with bounds, beyond llama.cpp (which
// ignores them): a range whose lower bound is at least 0, or that has
// only an upper bound of at least 0, as the numbers of the range written
// without an exponent: an integer part within the range (a digit
// grammar), optionally a fraction of at most 15 digits ending in a
// non-zero one where the integer part + 1 still fits under the upper
// bound. The grammar is sound (every number it allows is in the range)
// but not complete (e.g. 0.7 for a minimum of 0.5 is left out, and no
// exponent is written). Other bounds (a negative minimum, a negative
// maximum) are refused.
func (c *converter) number(s *object, path string) (string, error) {
	lo, hi := math.Inf(-1), math.Inf(1)
	loX, hiX := false, false
	bs, err := numericBounds(s, path)
	if err != nil {
		return "", err
	}
	for _, b := range bs {
		k, f := b.k, b.v
		switch k {
		case "minimum":
			if f > lo || f == lo && loX {
				lo, loX = f, false
			}
		case "exclusiveMinimum":
			if f >= lo {
				lo, loX = f, true
			}
		case "maximum":
			if f < hi || f == hi && hiX {
				hi, hiX = f, false
			}
		case "exclusiveMaximum":
			if f <= hi {
				hi, hiX = f, true
			}
		}
	}
	neg := false
	switch {
	case lo >= 0:
	case math.IsInf(lo, -1) && hi >= 0:
		neg, lo, loX = true, 0, false // every negative number, then [0, hi]
	default:
		return "", &UnsupportedError{Keyword: "minimum below 0 or maximum below 0 on a number (an integer's is supported)", Path: path}
	}
	hi = min(hi, maxSafe)
	// Integers in the range.
	iLo, iHi := math.Ceil(lo), math.Floor(hi)
	if loX && iLo == lo {
		iLo++
	}
	if hiX && iHi == hi {
		iHi--
	}
	// Integer parts that take any fraction: I.F > I >= lo, and I + 1 <= hi.
	fLo, fHi := math.Ceil(lo), math.Floor(hi)-1
	if hi-math.Floor(hi) > 0 {
		fHi = math.Floor(hi) - 1
	}
	var alts []string
	if iLo <= iHi && iLo <= maxSafe {
		alts = append(alts, "("+intRange(int64(iLo), int64(iHi), false)+")")
	}
	if fLo <= fHi && fLo <= maxSafe {
		alts = append(alts, "("+intRange(int64(fLo), int64(fHi), false)+`) "." [0-9]{0,14} [1-9]`)
	}
	if neg {
		alts = append(alts, `"-" ([1-9] [0-9]{0,15} | ("0" | [1-9] [0-9]{0,15}) "." [0-9]{0,14} [1-9])`)
	}
	if len(alts) == 0 {
		return "", &UnsupportedError{Keyword: "minimum above maximum (no number written without an exponent in the range)", Path: path}
	}
	return c.rule(strings.Join(alts, " | "))
}

// ref resolves a local $ref ("#" or a JSON pointer "#/...") to one rule
// per target, defined on first use, so that recursion refers back to it.
func (c *converter) ref(v any, path string, depth int) (string, error) {
	ref, ok := v.(string)
	if !ok {
		return "", &UnsupportedError{Keyword: "$ref that is not a string", Path: path}
	}
	if name, ok := c.refs[ref]; ok {
		return name, nil
	}
	target, ok := c.resolve(ref)
	if !ok {
		return "", &UnsupportedError{Keyword: refProblem(ref), Path: path}
	}
	name, err := c.reserve()
	if err != nil {
		return "", err
	}
	c.refs[ref] = name
	body, err := c.visit(target, strings.TrimPrefix(ref, "#"), depth+1)
	if err != nil {
		return "", err
	}
	return name, c.define(name, body)
}

// refProblem says why ref does not resolve.
func refProblem(ref string) string {
	if ref == "#" || strings.HasPrefix(ref, "#/") {
		return fmt.Sprintf("$ref %q, which points to nothing in the schema", ref)
	}
	return fmt.Sprintf("$ref %q (only local ones: # and #/...)", ref)
}

// resolve returns what the local JSON pointer ref points to in the
// schema being added.
func (c *converter) resolve(ref string) (any, bool) {
	if ref == "#" {
		return c.doc, true
	}
	if !strings.HasPrefix(ref, "#/") {
		return nil, false
	}
	cur := c.doc
	for _, tok := range strings.Split(ref[2:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := cur.(type) {
		case *object:
			var ok bool
			if cur, ok = x.get(tok); !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			cur = x[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

func (c *converter) union(v any, key, path string, depth int) (string, error) {
	subs, ok := v.([]any)
	if !ok || len(subs) == 0 {
		return "", &UnsupportedError{Keyword: key + " that is not a non-empty array", Path: path}
	}
	if len(subs) > c.lim.Alternatives*4 {
		// Not even merging identical ones can bring it under the limit
		// cheaply: refuse before translating them all.
		return "", &LimitError{Limit: "alternatives", Max: c.lim.Alternatives, Path: path}
	}
	alts := make([]string, len(subs))
	for i, sub := range subs {
		var err error
		if alts[i], err = c.visit(sub, fmt.Sprintf("%s/%s/%d", path, key, i), depth+1); err != nil {
			return "", err
		}
	}
	return c.alternatives(alts, path)
}

func (c *converter) enum(v any, path string) (string, error) {
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

// count returns the non-negative integer keyword k of s: ok false when
// absent. Counts over maxRepeat are a *LimitError.
func count(s *object, k, path string) (int, bool, error) {
	v, ok := s.get(k)
	if !ok {
		return 0, false, nil
	}
	n, isNum := v.(json.Number)
	i, err := n.Int64()
	if !isNum || err != nil || i < 0 {
		return 0, false, &UnsupportedError{Keyword: fmt.Sprintf("%s %v (want a non-negative integer)", k, v), Path: path}
	}
	if i > maxRepeat {
		return 0, false, &LimitError{Limit: "repetitions", Max: maxRepeat, Path: path}
	}
	return int(i), true, nil
}

// bounds returns the counts minK (0 when absent) and maxK (-1 when
// absent) of s.
func (c *converter) bounds(s *object, minK, maxK, path string) (int, int, error) {
	lo, _, err := count(s, minK, path)
	if err != nil {
		return 0, 0, err
	}
	hi, bounded, err := count(s, maxK, path)
	if err != nil {
		return 0, 0, err
	}
	if !bounded {
		hi = -1
	} else if hi < lo {
		return 0, 0, &UnsupportedError{Keyword: maxK + " below " + minK, Path: path}
	}
	return lo, hi, nil
}

// integer is the range of an integer schema's minimum, maximum,
// exclusiveMinimum and exclusiveMaximum (each that is given), within
// ±maxSafe.
func (c *converter) integer(s *object, path string) (string, error) {
	lo, hi := float64(-maxSafe), float64(maxSafe)
	hasMin := s.has("minimum") || s.has("exclusiveMinimum")
	bs, err := numericBounds(s, path)
	if err != nil {
		return "", err
	}
	for _, b := range bs {
		k, f := b.k, b.v
		switch k {
		case "minimum":
			lo = max(lo, math.Ceil(f))
		case "exclusiveMinimum":
			lo = max(lo, math.Floor(f)+1)
		case "maximum":
			hi = min(hi, math.Floor(f))
		case "exclusiveMaximum":
			hi = min(hi, math.Ceil(f)-1)
		}
	}
	lo, hi = max(lo, -maxSafe), min(hi, maxSafe)
	if lo > hi {
		return "", &UnsupportedError{Keyword: "minimum above maximum (no integer in the range)", Path: path}
	}
	return c.rule(intRange(int64(lo), int64(hi), hasMin && lo < 0))
}

func (c *converter) pattern(v any, path string) (string, error) {
	p, ok := v.(string)
	if !ok {
		return "", &UnsupportedError{Keyword: "pattern that is not a string", Path: path}
	}
	// The rules of a pattern given up on are taken back.
	n, size, memoed := c.n, c.rules.Len(), len(c.memoLog)
	body, err := patternRule(p, c.rule)
	var le *LimitError
	switch {
	case errors.Is(err, errPatternUnsupported):
		c.n = n
		c.rules.Truncate(size)
		for _, b := range c.memoLog[memoed:] {
			delete(c.memo, b)
		}
		c.memoLog = c.memoLog[:memoed]
		return "string", nil
	case errors.As(err, &le):
		le.Path = path
		return "", le
	case err != nil:
		return "", &UnsupportedError{Keyword: fmt.Sprintf("pattern %q (%v)", p, err), Path: path}
	}
	return c.rule(body)
}

type prop struct {
	name   string
	schema any
}

// object translates properties, required and additionalProperties.
func (c *converter) object(s *object, path string, depth int) (string, error) {
	var props []prop
	if v, ok := s.get("properties"); ok {
		po, ok := v.(*object)
		if !ok {
			return "", &UnsupportedError{Keyword: "properties that is not an object", Path: path}
		}
		for _, k := range po.keys {
			props = append(props, prop{k, po.m[k]})
		}
	}
	required := map[string]bool{}
	if list, ok := s.m["required"].([]any); ok {
		for _, x := range list {
			if name, ok := x.(string); ok {
				required[name] = true
			}
		}
	}
	ap, _ := s.get("additionalProperties")
	return c.objectRule(props, required, ap, path, depth)
}

// objectRule is llama.cpp's _build_object_rule: the required properties
// in order, then any selection of the optional ones in order, then (with
// additionalProperties true or a schema) any number of other keys. Its
// size grows linearly with the properties: one rule per property for
// what may follow it.
func (c *converter) objectRule(props []prop, required map[string]bool, ap any, path string, depth int) (string, error) {
	if len(props) > c.lim.Properties {
		return "", &LimitError{Limit: "properties", Max: c.lim.Properties, Path: path}
	}
	var req, opt []string // their key-value rules
	var names []string
	for _, p := range props {
		key, err := c.literal(p.name, path)
		if err != nil {
			return "", err
		}
		val, err := c.visit(p.schema, path+"/properties/"+p.name, depth+1)
		if err != nil {
			return "", err
		}
		kv, err := c.rule(key + ` space ":" space ` + val)
		if err != nil {
			return "", err
		}
		if required[p.name] {
			req = append(req, kv)
		} else {
			opt = append(opt, kv)
		}
		names = append(names, p.name)
	}
	additional := ""
	if _, isObj := ap.(*object); ap == true || isObj {
		val := "value"
		if isObj {
			var err error
			if val, err = c.visit(ap, path+"/additionalProperties", depth+1); err != nil {
				return "", err
			}
		}
		key := "string"
		if len(names) > 0 {
			var err error
			if key, err = c.rule(notStrings(names)); err != nil {
				return "", err
			}
		}
		var err error
		if additional, err = c.rule(key + ` ":" space ` + val); err != nil {
			return "", err
		}
		opt = append(opt, additional)
	}
	if len(req) == 0 && len(opt) == 0 {
		return c.rule(`"{" space "}"`)
	}
	// tail(i) is a non-empty, comma-separated, in-order selection of
	// opt[i:]: opt[i] then rest(i+1), or tail(i+1); rest(i) is nothing or
	// a comma and tail(i); the additional properties, last, repeat. Every
	// reference to the next rule ends its alternative (a tail call, which
	// the matcher does not stack), and the comma is shared, so the grammar
	// grows by three rules a property and its parse stacks by one a
	// property that may come next, never deeper.
	tail := ""
	for i := len(opt) - 1; i >= 0; i-- {
		body := opt[i]
		switch {
		case opt[i] == additional:
			body += ` ( "," space ` + additional + ` )*`
		case tail != "":
			// The empty alternative first: llama.cpp's GBNF parser reads a
			// line that ends in "|" as going on with the next rule's name.
			rest, err := c.rule(`| "," space ` + tail)
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
	rule := `"{" space ` + strings.Join(req, ` "," space `)
	switch {
	case len(req) > 0 && tail != "":
		rule += ` ( "," space ` + tail + ` )?`
	case tail != "":
		rule += tail + "?"
	}
	return c.rule(rule + ` space "}"`)
}

// notStrings is the GBNF of a JSON string that is none of names (the key
// of an additional property), over a trie of their JSON text: llama.cpp's
// _not_strings, with every character a JSON string may hold (its
// negated classes let through " and \ unescaped, and read the backslash
// of an escape as a character).
func notStrings(names []string) string {
	type node struct {
		children map[rune]*node
		order    []rune
		end      bool
	}
	root := &node{children: map[rune]*node{}}
	for _, name := range names {
		b, _ := json.Marshal(name)
		n := root
		for _, r := range string(b[1 : len(b)-1]) {
			next, ok := n.children[r]
			if !ok {
				next = &node{children: map[rune]*node{}}
				n.children[r] = next
				n.order = append(n.order, r)
			}
			n = next
		}
		n.end = true
	}
	var out strings.Builder
	out.WriteString(`"\"" ( `)
	var visit func(n *node)
	visit = func(n *node) {
		slices.Sort(n.order)
		var rejects strings.Builder
		for i, r := range n.order {
			child := n.children[r]
			rejects.WriteString(classChar(r))
			if i > 0 {
				out.WriteString(" | ")
			}
			out.WriteString("[" + classChar(r) + "]")
			if len(child.children) > 0 {
				out.WriteString(" (")
				visit(child)
				out.WriteString(")")
			} else if child.end {
				out.WriteString(" char+")
			}
		}
		if len(n.order) > 0 {
			out.WriteString(` | ( [^"\\\x00-\x1F` + rejects.String() + `] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4}) ) char*`)
		}
	}
	visit(root)
	out.WriteString(" )")
	if !root.end {
		out.WriteString("?")
	}
	out.WriteString(` "\""`)
	return out.String()
}

// classChar writes r for a GBNF character class.
func classChar(r rune) string {
	switch r {
	case '\\', ']', '[', '-', '^', '"':
		return `\` + string(r)
	}
	if r < 0x20 || r == 0x7F {
		return fmt.Sprintf(`\x%02X`, r)
	}
	return string(r)
}

// allOf is llama.cpp's: the properties of every component (those of an
// anyOf inside it optional, the others required), or the enum values
// every component allows.
func (c *converter) allOf(s *object, path string, depth int) (string, error) {
	list, ok := s.m["allOf"].([]any)
	if !ok {
		return "", &UnsupportedError{Keyword: "allOf that is not an array", Path: path}
	}
	var props []prop
	required := map[string]bool{}
	enumCount := map[string]int{}
	var enumOrder []string
	var add func(comp any, isRequired bool, d int) error
	add = func(comp any, isRequired bool, d int) error {
		if d > c.lim.Depth {
			return &LimitError{Limit: "depth", Max: c.lim.Depth, Path: path}
		}
		o, ok := comp.(*object)
		if !ok {
			return nil
		}
		if ref, ok := o.get("$ref"); ok {
			r, _ := ref.(string)
			target, ok := c.resolve(r)
			if !ok {
				return &UnsupportedError{Keyword: refProblem(r), Path: path + "/allOf"}
			}
			return add(target, isRequired, d+1)
		}
		if v, ok := o.get("properties"); ok {
			po, ok := v.(*object)
			if !ok {
				return &UnsupportedError{Keyword: "properties that is not an object", Path: path + "/allOf"}
			}
			for _, k := range po.keys {
				props = append(props, prop{k, po.m[k]})
				if isRequired {
					required[k] = true
				}
			}
			return nil
		}
		if v, ok := o.get("enum"); ok {
			vals, _ := v.([]any)
			for _, x := range vals {
				lit, err := c.literal(x, path+"/allOf")
				if err != nil {
					return err
				}
				if enumCount[lit] == 0 {
					enumOrder = append(enumOrder, lit)
				}
				enumCount[lit]++
			}
		}
		return nil
	}
	for _, t := range list {
		if o, ok := t.(*object); ok && o.has("anyOf") {
			alts, _ := o.m["anyOf"].([]any)
			for _, tt := range alts {
				if err := add(tt, false, depth+1); err != nil {
					return "", err
				}
			}
		} else if err := add(t, true, depth+1); err != nil {
			return "", err
		}
	}
	var both []string
	for _, lit := range enumOrder {
		if enumCount[lit] == len(list) {
			both = append(both, lit)
		}
	}
	if len(both) > 0 {
		return c.alternatives(both, path)
	}
	return c.objectRule(props, required, nil, path, depth)
}

func (c *converter) array(s *object, path string, depth int) (string, error) {
	items, ok := s.get("items")
	if !ok {
		items = s.m["prefixItems"]
	}
	if tuple, ok := items.([]any); ok {
		if len(tuple) > c.lim.Properties {
			return "", &LimitError{Limit: "properties", Max: c.lim.Properties, Path: path}
		}
		parts := make([]string, len(tuple))
		for i, sub := range tuple {
			var err error
			if parts[i], err = c.visit(sub, fmt.Sprintf("%s/items/%d", path, i), depth+1); err != nil {
				return "", err
			}
		}
		return c.rule(`"[" space ` + strings.Join(parts, ` "," space `) + ` space "]"`)
	}
	item, err := c.visit(items, path+"/items", depth+1)
	if err != nil {
		return "", err
	}
	lo, hi, err := c.bounds(s, "minItems", "maxItems", path)
	if err != nil {
		return "", err
	}
	return c.rule(`"[" space ` + repetition(item, lo, hi, `"," space`) + ` space "]"`)
}
