// Package grammar is a GBNF interpreter in Go: it parses llama.cpp's
// grammar format and tracks, character by character, which continuations
// a grammar allows, with the semantics of llama.cpp's grammar sampler
// (src/llama-grammar.cpp): a set of parse stacks, each the elements still
// to match, advanced on every accepted code point; a token is allowed when
// every code point of its text can be accepted in turn, and end of
// generation is allowed only when some stack is empty (the root rule is
// complete). It is the token mask of engines that sample in Go.
//
// Supported syntax: rules `name ::= alternatives`, `|`, string literals
// with \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes, character classes
// `[a-z]` and `[^"\\]`, `.`, groups, and the postfix operators `*`, `+`,
// `?` and `{m}`, `{m,}`, `{m,n}`; comments start with `#`. Left-recursive
// grammars are refused when a stack would grow past MaxDepth.
//
// FromSchema translates a subset of JSON Schema into GBNF (no maintained
// Go library does this; it follows llama.cpp's json-schema-to-grammar, and
// refuses every keyword it does not support with an *UnsupportedError
// naming it); JSONObject is the grammar of any JSON object.
//
// A Grammar is immutable and safe for concurrent use; a Matcher is not.
package grammar
