package grammar

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
// *LimitError (the limits other than SchemaBytes count over every schema
// added).
func (s *SchemaSet) Add(schema []byte) (string, error) {
	return s.c.add(schema)
}

// Rules returns the rules the expressions Add returned refer to, the
// primitives included, one per line; a grammar is Rules() plus a root.
func (s *SchemaSet) Rules() string { return primitives + s.c.rules.String() }
