package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// SchemaSet builds one grammar of several JSON Schemas (the arguments of
// a request's tools): Add returns the rule expression of each schema's
// instances, Rules the rules they need, and the caller writes the root
// over those expressions (a tool call's syntax around each). The schemas
// share the primitive rules and number their own apart. Not safe for
// concurrent use.
type SchemaSet struct {
	c converter
}

// Add translates schema as FromSchema does and returns the expression
// (a rule name or a group) matching its instances. Errors: an
// *UnsupportedError naming a keyword, a schema that is not JSON, a
// schema too large.
func (s *SchemaSet) Add(schema []byte) (string, error) {
	var v any
	d := json.NewDecoder(bytes.NewReader(schema))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return "", fmt.Errorf("grammar: schema is not JSON: %w", err)
	}
	return s.c.visit(v, "")
}

// Rules returns the rules the expressions Add returned refer to, the
// primitives included, one per line; a grammar is Rules() plus a root.
func (s *SchemaSet) Rules() string { return primitives + s.c.rules.String() }
