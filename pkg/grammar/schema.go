package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
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
// json-schema-to-grammar writes them.
const primitives = `space ::= | " " | "\n" [ \t]{0,20}
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\"" space
integral-part ::= [0] | [1-9] [0-9]{0,15}
number ::= ("-"? integral-part) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? space
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

// maxSchemaRules bounds the grammar a schema may produce.
const maxSchemaRules = 4096

// FromSchema returns a GBNF grammar (root rule "root") whose sentences
// are the JSON texts that validate against schema, for this subset of
// JSON Schema: type (a name or a list of names), properties, required,
// additionalProperties false (absent is treated as false: no other
// property is generated, which validates either way), items, minItems,
// maxItems, enum, const, anyOf, and the annotations. Properties are
// generated required first, then optional, each group in the order of
// properties. Any other keyword is refused with an *UnsupportedError.
// Errors also report a schema that is not JSON.
func FromSchema(schema []byte) (string, error) {
	c := &converter{}
	var s any
	d := json.NewDecoder(bytes.NewReader(schema))
	d.UseNumber()
	if err := d.Decode(&s); err != nil {
		return "", fmt.Errorf("grammar: schema is not JSON: %w", err)
	}
	root, err := c.visit(s, "")
	if err != nil {
		return "", err
	}
	return primitives + "root ::= " + root + "\n" + c.rules.String(), nil
}

type converter struct {
	rules strings.Builder
	n     int
}

func (c *converter) rule(body string) (string, error) {
	if c.n++; c.n > maxSchemaRules {
		return "", errors.New("grammar: schema too large")
	}
	name := fmt.Sprintf("r%d", c.n)
	fmt.Fprintf(&c.rules, "%s ::= %s\n", name, body)
	return name, nil
}

// literal returns the GBNF literal of v's JSON text followed by space.
func literal(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
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
	return q.String(), nil
}

func (c *converter) visit(s any, path string) (string, error) {
	switch s := s.(type) {
	case bool:
		if s {
			return "value", c.needValue()
		}
		return "", &UnsupportedError{Keyword: "false (a schema no instance matches)", Path: path}
	case map[string]any:
		return c.object(s, path)
	}
	return "", &UnsupportedError{Keyword: "a schema that is not an object", Path: path}
}

// needValue makes sure the any-JSON rules exist once.
func (c *converter) needValue() error {
	if strings.Contains(c.rules.String(), "\nvalue ::=") || strings.HasPrefix(c.rules.String(), "value ::=") {
		return nil
	}
	_, after, _ := strings.Cut(JSONObject, "root ::= object\n")
	c.rules.WriteString(after)
	return nil
}

func (c *converter) object(s map[string]any, path string) (string, error) {
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
		return literal(v)
	}
	if v, ok := s["enum"]; ok {
		vals, ok := v.([]any)
		if !ok || len(vals) == 0 {
			return "", &UnsupportedError{Keyword: "enum that is not a non-empty array", Path: path}
		}
		alts := make([]string, len(vals))
		for i, v := range vals {
			var err error
			if alts[i], err = literal(v); err != nil {
				return "", err
			}
		}
		return "(" + strings.Join(alts, " | ") + ")", nil
	}
	if v, ok := s["anyOf"]; ok {
		subs, ok := v.([]any)
		if !ok || len(subs) == 0 {
			return "", &UnsupportedError{Keyword: "anyOf that is not a non-empty array", Path: path}
		}
		alts := make([]string, len(subs))
		for i, sub := range subs {
			var err error
			if alts[i], err = c.visit(sub, fmt.Sprintf("%s/anyOf/%d", path, i)); err != nil {
				return "", err
			}
		}
		return "(" + strings.Join(alts, " | ") + ")", nil
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
			alt, err = c.props(s, path)
		case "array":
			alt, err = c.array(s, path)
		default:
			err = &UnsupportedError{Keyword: fmt.Sprintf("type %q", t), Path: path}
		}
		if err != nil {
			return "", err
		}
		alts = append(alts, alt)
	}
	return "(" + strings.Join(alts, " | ") + ")", nil
}

func (c *converter) props(s map[string]any, path string) (string, error) {
	props, _ := s["properties"].(map[string]any)
	if _, ok := s["properties"]; ok && props == nil {
		return "", &UnsupportedError{Keyword: "properties that is not an object", Path: path}
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
		key, err := literal(name)
		if err != nil {
			return "", err
		}
		val, err := c.visit(props[name], path+"/properties/"+name)
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
	// tail(i) is a non-empty, comma-separated, in-order selection of opt[i:].
	tail := ""
	for i := len(opt) - 1; i >= 0; i-- {
		body := opt[i]
		if tail != "" {
			body = fmt.Sprintf(`%s ( "," space %s )? | %s`, opt[i], tail, tail)
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

func (c *converter) array(s map[string]any, path string) (string, error) {
	item := "value"
	if v, ok := s["items"]; ok {
		var err error
		if item, err = c.visit(v, path+"/items"); err != nil {
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
