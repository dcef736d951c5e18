package grammar

import (
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// validator compiles schema with a JSON Schema validator (formats
// asserted, but for email, Go's regexp for patterns), the judge of which
// side is right where two grammars disagree; nil when it cannot compile
// it. Email is zod's pattern's to judge (zod checks its own pattern,
// which allows a hostname label to end with "-", which the validator's
// RFC 5321 format does not).
func validator(schema string) *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		return nil
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	c.RegisterFormat(&jsonschema.Format{Name: "email", Validate: func(any) error { return nil }})
	if err := c.AddResource("schema.json", doc); err != nil {
		return nil
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		return nil
	}
	return s
}

// valid reports whether text is JSON that v accepts.
func valid(v *jsonschema.Schema, text string) bool {
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return false
	}
	return v.Validate(inst) == nil
}
