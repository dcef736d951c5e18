package grammar

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// pos is an element of an alternative: rules[rule][alt][i].
type pos struct{ rule, alt, i int32 }

// Matcher tracks the parse stacks of one generation, and the UTF-8
// sequence a token left unfinished (a byte-level vocabulary splits
// characters over tokens). The zero value is not usable; call
// Grammar.Matcher. Not safe for concurrent use.
type Matcher struct {
	g      *Grammar
	stacks [][]pos // each stack's top is a character class, or it is empty (complete)
	part   partial
}

// Matcher returns a matcher at the start of g's root rule.
func (g *Grammar) Matcher() (*Matcher, error) {
	var out [][]pos
	for a := range g.rules[g.root] {
		if err := g.expand([]pos{{int32(g.root), int32(a), 0}}, &out); err != nil {
			return nil, err
		}
	}
	return &Matcher{g: g, stacks: dedupe(out)}, nil
}

// expand pushes st, with rule references at its top replaced by the first
// elements of their alternatives, onto out (llama.cpp's advance_stack).
// Positions past the end of an alternative are popped.
func (g *Grammar) expand(st []pos, out *[][]pos) error {
	for len(st) > 0 {
		top := st[len(st)-1]
		if int(top.i) < len(g.rules[top.rule][top.alt]) {
			break
		}
		st = st[:len(st)-1]
	}
	if len(st) > MaxDepth {
		return fmt.Errorf("grammar: parse stack deeper than %d (left recursion?)", MaxDepth)
	}
	if len(st) == 0 {
		*out = append(*out, st)
		return nil
	}
	top := st[len(st)-1]
	e := g.rules[top.rule][top.alt][top.i]
	if e.ref < 0 {
		*out = append(*out, st)
		return nil
	}
	if len(*out) > maxStacks {
		return fmt.Errorf("grammar: more than %d parse stacks", maxStacks)
	}
	// The position after the reference is kept only when elements follow
	// it: a reference that ends its alternative is a tail call (llama.cpp's
	// advance_stack pushes no end of sequence either), so a chain of them,
	// such as the optional properties of an object, does not deepen the
	// stack.
	rest := slices.Clone(st[:len(st)-1])
	if int(top.i)+1 < len(g.rules[top.rule][top.alt]) {
		rest = append(rest, pos{top.rule, top.alt, top.i + 1})
	}
	for a := range g.rules[e.ref] {
		if err := g.expand(append(slices.Clone(rest), pos{int32(e.ref), int32(a), 0}), out); err != nil {
			return err
		}
	}
	return nil
}

func dedupe(stacks [][]pos) [][]pos {
	if len(stacks) < 2 {
		return stacks
	}
	seen := make(map[string]bool, len(stacks))
	out := stacks[:0]
	key := make([]byte, 0, 64)
	for _, st := range stacks {
		key = key[:0]
		for _, p := range st {
			key = binary.LittleEndian.AppendUint32(key, uint32(p.rule))
			key = binary.LittleEndian.AppendUint32(key, uint32(p.alt))
			key = binary.LittleEndian.AppendUint32(key, uint32(p.i))
		}
		if !seen[string(key)] {
			seen[string(key)] = true
			out = append(out, st)
		}
	}
	return out
}

// step returns the stacks after accepting r from stacks (none: rejected).
func (m *Matcher) step(stacks [][]pos, r rune) ([][]pos, error) {
	var out [][]pos
	for _, st := range stacks {
		if len(st) == 0 {
			continue
		}
		top := st[len(st)-1]
		if !m.g.rules[top.rule][top.alt][top.i].matches(r) {
			continue
		}
		next := make([]pos, len(st)) // one allocation: st with its top advanced
		copy(next, st)
		next[len(st)-1].i++
		if err := m.g.expand(next, &out); err != nil {
			return nil, err
		}
	}
	return dedupe(out), nil
}

// walk feeds text through stacks from the unfinished sequence part: the
// stacks after its whole code points and the part it leaves unfinished;
// nil when text is not allowed.
func (m *Matcher) walk(text []byte, stacks [][]pos, part partial) ([][]pos, partial) {
	cps, part, ok := decodeUTF8(text, part, nil)
	if !ok {
		return nil, part
	}
	for _, r := range cps {
		var err error
		if stacks, err = m.step(stacks, r); err != nil || len(stacks) == 0 {
			return nil, part
		}
	}
	if part.remain == 0 {
		return stacks, part
	}
	// A sequence left unfinished must be able to finish as a character
	// some stack's top allows.
	// The stacks that cannot are kept, as llama.cpp keeps them: the next
	// code point drops them.
	if !slices.ContainsFunc(stacks, func(st []pos) bool { return len(st) > 0 && m.g.top(st).matchesPartial(part) }) {
		return nil, part
	}
	return stacks, part
}

// Allows reports whether text may come next: llama.cpp's test of a
// candidate token. Empty text, or text starting with a NUL byte, is not
// allowed (llama.cpp reads pieces as C strings), and text that ends
// inside a UTF-8 sequence is allowed when the sequence can still finish
// as a character the grammar allows.
func (m *Matcher) Allows(text []byte) bool {
	if len(text) == 0 || text[0] == 0 {
		return false
	}
	st, _ := m.walk(text, m.stacks, m.part)
	return st != nil
}

// Complete reports whether the root rule may end here: end of generation
// is allowed.
func (m *Matcher) Complete() bool {
	return slices.ContainsFunc(m.stacks, func(st []pos) bool { return len(st) == 0 })
}

// Accept advances the matcher over text, when Allows(text). Errors:
// ErrRejected (the matcher is unchanged).
func (m *Matcher) Accept(text []byte) error {
	if len(text) == 0 {
		return nil
	}
	if text[0] == 0 {
		return fmt.Errorf("%w: %q", ErrRejected, text)
	}
	st, part := m.walk(text, m.stacks, m.part)
	if st == nil {
		return fmt.Errorf("%w: %q", ErrRejected, text)
	}
	m.stacks, m.part = st, part
	return nil
}

// top returns the character class at the top of the non-empty stack st.
func (g *Grammar) top(st []pos) elem {
	p := st[len(st)-1]
	return g.rules[p.rule][p.alt][p.i]
}
