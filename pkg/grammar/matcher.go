package grammar

import (
	"fmt"
	"math"
	"slices"
	"unicode/utf8"
)

// pos is an element of an alternative: rules[rule][alt][i].
type pos struct{ rule, alt, i int32 }

// Matcher tracks the parse stacks of one generation. The zero value is
// not usable; call Grammar.Matcher. Not safe for concurrent use.
type Matcher struct {
	g      *Grammar
	stacks [][]pos // each stack's top is a character class, or it is empty (complete)
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
	rest := append(slices.Clone(st[:len(st)-1]), pos{top.rule, top.alt, top.i + 1})
	for a := range g.rules[e.ref] {
		if err := g.expand(append(slices.Clone(rest), pos{int32(e.ref), int32(a), 0}), out); err != nil {
			return err
		}
	}
	return nil
}

func dedupe(stacks [][]pos) [][]pos {
	seen := make(map[string]bool, len(stacks))
	out := stacks[:0]
	for _, st := range stacks {
		k := fmt.Sprint(st)
		if !seen[k] {
			seen[k] = true
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
		next := append(slices.Clone(st[:len(st)-1]), pos{top.rule, top.alt, top.i + 1})
		if err := m.g.expand(next, &out); err != nil {
			return nil, err
		}
	}
	return dedupe(out), nil
}

// walk feeds text through stacks; nil when text is not allowed (or is
// not whole UTF-8: a piece ending inside a character is refused).
func (m *Matcher) walk(text []byte) [][]pos {
	stacks := m.stacks
	for len(text) > 0 {
		r, n := utf8.DecodeRune(text)
		if r == utf8.RuneError && n <= 1 {
			return nil
		}
		text = text[n:]
		var err error
		if stacks, err = m.step(stacks, r); err != nil || len(stacks) == 0 {
			return nil
		}
	}
	return stacks
}

// Allows reports whether text may come next. Empty text is not allowed
// (llama.cpp rejects tokens with an empty piece).
func (m *Matcher) Allows(text []byte) bool { return len(text) > 0 && m.walk(text) != nil }

// Complete reports whether the root rule may end here: end of generation
// is allowed.
func (m *Matcher) Complete() bool {
	return slices.ContainsFunc(m.stacks, func(st []pos) bool { return len(st) == 0 })
}

// Accept advances the matcher over text. Errors: ErrRejected (the matcher
// is unchanged).
func (m *Matcher) Accept(text []byte) error {
	if len(text) == 0 {
		return nil
	}
	st := m.walk(text)
	if st == nil {
		return fmt.Errorf("%w: %q", ErrRejected, text)
	}
	m.stacks = st
	return nil
}

// Mask sets logits[t] to -Inf for every token t the grammar forbids next:
// pieces[t] is t's text; eog reports an end-of-generation id, allowed
// only when Complete. len(pieces) must cover logits.
func (m *Matcher) Mask(logits []float32, pieces [][]byte, eog func(int32) bool) {
	done := m.Complete()
	for t := range logits {
		ok := done
		if !eog(int32(t)) {
			ok = m.Allows(pieces[t])
		}
		if !ok {
			logits[t] = float32(math.Inf(-1))
		}
	}
}
