// Package grammar is a GBNF interpreter in Go: it parses llama.cpp's
// grammar format and tracks, character by character, which continuations
// a grammar allows, with the semantics of llama.cpp's grammar sampler
// (src/llama-grammar.cpp): a set of parse stacks, each the elements still
// to match, advanced on every accepted code point; a token is allowed when
// every code point of its text can be accepted in turn and, when its text
// ends inside a UTF-8 sequence (byte-level vocabularies split
// characters), that sequence can still finish as a character some stack
// allows; end of generation is allowed only when some stack is empty (the
// root rule is complete). TokenMask is the token mask of engines that
// sample in Go (the reference engine) and the oracle of llama.cpp's
// sampler: it matches every token of the vocabulary in lockstep, as
// llama_grammar_reject_candidates does. Source gives each sequence its
// state: the engine's own grammar sampler where it has one
// (engine.GrammarSampler, llama.cpp's), else a TokenMask.
//
// Supported syntax: rules `name ::= alternatives`, `|`, string literals
// with \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes, character classes
// `[a-z]` and `[^"\\]`, `.`, groups, and the postfix operators `*`, `+`,
// `?` and `{m}`, `{m,}`, `{m,n}`; comments start with `#`. Left-recursive
// grammars are refused when a stack would grow past MaxDepth. A reference
// that ends its alternative is a tail call: the stack keeps no position
// after it (as llama.cpp's advance_stack), so chains of rules, such as an
// object's optional properties, keep stacks shallow.
//
// Every grammar is bounded before it is built in full: MaxBytes of text,
// and DefaultLimits' rules and states (Check). A schema is bounded while
// it is translated: its bytes, the bytes of its const and enum values and
// property names, the alternatives of one anyOf or enum (identical ones
// merged), the properties of one object, and its nesting; each over its
// limit is a *LimitError naming it. Workers compile a request's grammar
// once (Source.Compile), where the request arrives, within CompileTime
// and MaxStateBytes (each a *LimitError), and take each choice's state
// from it (Compiled.State).
//
// A batch loop takes Compiled.Offloaded states instead: a token's
// acceptance is a check of the state's mask, and the state after it and
// its mask are computed on an Offload (a few goroutines taking tenants in
// turn) while the state reports not Ready; the loop leaves it out of its
// steps until it is. The states of a compiled grammar are shared by its
// choices (a table bounded by CacheBytes): choices that reach the same
// state compute its mask once. CostTokens is a grammar's price against a
// key's rate limit.
//
// FromSchema translates JSON Schema into GBNF as llama.cpp's
// json-schema-to-grammar of the pinned release does, for every schema it
// accepts and with the same language (TestLlamaCases runs the two in
// lockstep over llama.cpp's own cases; no maintained Go library does
// this): properties in the order written, $ref recursion, allOf, integer
// ranges as digit grammars, string lengths, anchored patterns, formats.
// It refuses, with an *UnsupportedError naming it, what has no grammar
// (a type that is not a JSON type, a $ref that does not resolve, an
// invalid pattern, a recursion with no end). It departs from llama.cpp
// where llama.cpp's grammar allows what clients cannot read: its numbers
// are bounded (15 integral digits, 16 fraction digits, a two-digit
// exponent) so that every one is finite as an IEEE double, integer
// ranges lie within ±(2^53-1), and strings stay JSON strings. JSONObject
// is the grammar of any JSON object. Parse refuses left recursion
// (ErrLeftRecursion), which a matcher would expand without end.
//
// A Grammar is immutable and safe for concurrent use; a Matcher is not.
package grammar
