package grammar

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxDepth bounds a parse stack: deeper nesting (or left recursion) is an
// error rather than unbounded memory.
const MaxDepth = 1024

// maxStacks bounds the live stacks of a Matcher (ambiguous grammars).
const maxStacks = 4096

// ErrSyntax is wrapped by Parse's errors.
var ErrSyntax = errors.New("grammar: syntax error")

// ErrLeftRecursion is wrapped (with ErrSyntax) by Parse's error for a
// grammar where a rule can reach itself before consuming a character: a
// matcher would expand it without end.
var ErrLeftRecursion = errors.New("left recursion")

// ErrNoSentence is Check's error for a grammar whose root derives no
// finite text (a recursion with no way out): nothing could ever end it.
var ErrNoSentence = errors.New("grammar: the root rule derives no finite text")

// maxRepeat bounds the counts of a repetition {m,n}; the states a
// repetition expands to are bounded by the grammar's limits.
const maxRepeat = 1 << 14

// ErrRejected is returned by Matcher.Accept for text the grammar forbids.
var ErrRejected = errors.New("grammar: text not allowed here")

type rng struct{ lo, hi rune }

// elem is a character class (ref < 0) or a reference to rule ref.
type elem struct {
	ref    int
	ranges []rng
	negate bool
}

func (e elem) matches(r rune) bool {
	in := false
	for _, g := range e.ranges {
		if r >= g.lo && r <= g.hi {
			in = true
			break
		}
	}
	return in != e.negate
}

// Grammar is a parsed GBNF grammar.
type Grammar struct {
	names map[string]int
	rules [][][]elem // rule → alternatives → elements
	root  int
}

// Parse parses GBNF text whose start rule is root. Errors wrap ErrSyntax
// and name the position or the undefined rule.
// A grammar of more than DefaultLimits.States elements (after
// repetitions are expanded) is refused with a *LimitError as soon as
// parsing reaches it.
func Parse(text, root string) (*Grammar, error) {
	return parse(text, root, DefaultLimits.States)
}

func parse(text, root string, maxStates int) (*Grammar, error) {
	p := &parser{s: text, g: &Grammar{names: map[string]int{}}, left: maxStates, max: maxStates}
	if err := p.parse(); err != nil {
		return nil, err
	}
	for name, id := range p.g.names {
		if p.g.rules[id] == nil {
			return nil, fmt.Errorf("%w: rule %q used but not defined", ErrSyntax, name)
		}
	}
	id, ok := p.g.names[root]
	if !ok {
		return nil, fmt.Errorf("%w: no root rule %q", ErrSyntax, root)
	}
	p.g.root = id
	if err := p.g.checkLeftRecursion(); err != nil {
		return nil, err
	}
	return p.g, nil
}

// derives returns which rules derive some text made of nothing but
// classes (classes true: productive rules) or nothing at all (classes
// false: nullable rules), in time linear in the grammar: each
// alternative counts the references it still waits for.
func (g *Grammar) derives(classes bool) []bool {
	done := make([]bool, len(g.rules))
	type altRef struct{ rule, alt int }
	waiting := map[int][]altRef{} // rule → the alternatives that reference it, once a reference
	pending := make([][]int, len(g.rules))
	var queue []int
	for r, alts := range g.rules {
		pending[r] = make([]int, len(alts))
		for a, alt := range alts {
			for _, e := range alt {
				if e.ref < 0 {
					if !classes {
						pending[r][a] = -1 << 30 // never empty
						break
					}
					continue
				}
				pending[r][a]++
				waiting[e.ref] = append(waiting[e.ref], altRef{r, a})
			}
			if pending[r][a] == 0 && !done[r] {
				done[r] = true
				queue = append(queue, r)
			}
		}
	}
	for len(queue) > 0 {
		r := queue[0]
		queue = queue[1:]
		for _, w := range waiting[r] {
			if pending[w.rule][w.alt]--; pending[w.rule][w.alt] == 0 && !done[w.rule] {
				done[w.rule] = true
				queue = append(queue, w.rule)
			}
		}
	}
	return done
}

func (g *Grammar) nullable() []bool { return g.derives(false) }

// checkLeftRecursion refuses a rule that can reach itself through the
// references that start its alternatives (after nullable ones).
func (g *Grammar) checkLeftRecursion() error {
	null := g.nullable()
	const (
		white = iota
		grey
		black
	)
	color := make([]byte, len(g.rules))
	var visit func(r int) error
	visit = func(r int) error {
		color[r] = grey
		for _, alt := range g.rules[r] {
			for _, e := range alt {
				if e.ref < 0 {
					break
				}
				switch color[e.ref] {
				case grey:
					return fmt.Errorf("%w: %w through rule %q", ErrSyntax, ErrLeftRecursion, g.name(e.ref))
				case white:
					if err := visit(e.ref); err != nil {
						return err
					}
				}
				if !null[e.ref] {
					break
				}
			}
		}
		color[r] = black
		return nil
	}
	for r := range g.rules {
		if color[r] == white {
			if err := visit(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// productive reports whether rule r derives some finite text.
func (g *Grammar) productive(r int) bool { return g.derives(true)[r] }

func (g *Grammar) name(id int) string {
	for n, i := range g.names {
		if i == id {
			return strings.TrimPrefix(n, "\x00")
		}
	}
	return ""
}

// Check parses gbnf (root rule "root") as Parse does and checks it
// against MaxBytes and lim's Rules and States (zero: DefaultLimits'):
// what a worker compiles per request, bounded before it is built in
// full. Errors: a *LimitError naming the limit, ErrSyntax.
func Check(gbnf string, lim Limits) (*Grammar, error) {
	lim = lim.orDefault()
	if len(gbnf) > MaxBytes {
		return nil, &LimitError{Limit: "grammar bytes", Max: MaxBytes}
	}
	g, err := parse(gbnf, "root", lim.States)
	if err != nil {
		return nil, err
	}
	if len(g.rules) > lim.Rules {
		return nil, &LimitError{Limit: "rules", Max: lim.Rules}
	}
	if !g.productive(g.root) {
		return nil, ErrNoSentence
	}
	return g, nil
}

type parser struct {
	s    string
	i    int
	g    *Grammar
	gen  int
	left int // elements (states) the grammar may still add
	max  int
}

// spend counts n more elements against the parser's budget of states.
func (p *parser) spend(n int) error {
	if p.left -= n; p.left < 0 {
		return &LimitError{Limit: "states", Max: p.max}
	}
	return nil
}

func (p *parser) errf(format string, a ...any) error {
	return fmt.Errorf("%w at offset %d: %s", ErrSyntax, p.i, fmt.Sprintf(format, a...))
}

func (p *parser) rule(name string) int {
	if id, ok := p.g.names[name]; ok {
		return id
	}
	id := len(p.g.rules)
	p.g.names[name] = id
	p.g.rules = append(p.g.rules, nil)
	return id
}

// newRule adds an anonymous rule with alts.
func (p *parser) newRule(alts [][]elem) int {
	p.gen++
	id := p.rule(fmt.Sprintf("\x00%d", p.gen))
	p.g.rules[id] = alts
	return id
}

func (p *parser) space() {
	for p.i < len(p.s) {
		switch c := p.s[p.i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			p.i++
		case c == '#':
			for p.i < len(p.s) && p.s[p.i] != '\n' {
				p.i++
			}
		default:
			return
		}
	}
}

func isWord(c byte) bool {
	return c == '-' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func (p *parser) name() string {
	j := p.i
	for j < len(p.s) && isWord(p.s[j]) {
		j++
	}
	n := p.s[p.i:j]
	p.i = j
	return n
}

// atDefinition reports whether `name ::=` starts at p.i.
func (p *parser) atDefinition() bool {
	save := p.i
	defer func() { p.i = save }()
	if p.name() == "" {
		return false
	}
	p.space()
	return strings.HasPrefix(p.s[p.i:], "::=")
}

func (p *parser) parse() error {
	for p.space(); p.i < len(p.s); p.space() {
		n := p.name()
		if n == "" {
			return p.errf("expected a rule name")
		}
		p.space()
		if !strings.HasPrefix(p.s[p.i:], "::=") {
			return p.errf("expected ::= after %q", n)
		}
		p.i += 3
		alts, err := p.alternatives(0)
		if err != nil {
			return err
		}
		id := p.rule(n)
		if p.g.rules[id] != nil {
			return p.errf("rule %q defined twice", n)
		}
		p.g.rules[id] = alts
	}
	return nil
}

// alternatives parses until EOF, the next definition (depth 0) or ')'.
func (p *parser) alternatives(depth int) ([][]elem, error) {
	var alts [][]elem
	seq := []elem{}
	for {
		p.space()
		if p.i >= len(p.s) || (depth == 0 && p.atDefinition()) {
			break
		}
		c := p.s[p.i]
		if c == ')' {
			if depth == 0 {
				return nil, p.errf("unbalanced )")
			}
			break
		}
		if c == '|' {
			p.i++
			alts, seq = append(alts, seq), []elem{}
			continue
		}
		start := len(seq)
		var err error
		if seq, err = p.primary(seq, depth); err != nil {
			return nil, err
		}
		if seq, err = p.postfix(seq, start); err != nil {
			return nil, err
		}
	}
	if depth > 0 && (p.i >= len(p.s) || p.s[p.i] != ')') {
		return nil, p.errf("missing )")
	}
	return append(alts, seq), nil
}

func (p *parser) primary(seq []elem, depth int) ([]elem, error) {
	if c := p.s[p.i]; c != '"' {
		if err := p.spend(1); err != nil { // one class or reference
			return nil, err
		}
	}
	switch c := p.s[p.i]; {
	case c == '"':
		p.i++
		for {
			if p.i >= len(p.s) {
				return nil, p.errf("unterminated string")
			}
			if p.s[p.i] == '"' {
				p.i++
				return seq, nil
			}
			r, err := p.char()
			if err != nil {
				return nil, err
			}
			if err := p.spend(1); err != nil {
				return nil, err
			}
			seq = append(seq, elem{ref: -1, ranges: []rng{{r, r}}})
		}
	case c == '[':
		p.i++
		e := elem{ref: -1}
		if p.i < len(p.s) && p.s[p.i] == '^' {
			e.negate = true
			p.i++
		}
		for {
			if p.i >= len(p.s) {
				return nil, p.errf("unterminated character class")
			}
			if p.s[p.i] == ']' {
				p.i++
				return append(seq, e), nil
			}
			lo, err := p.char()
			if err != nil {
				return nil, err
			}
			hi := lo
			if p.i+1 < len(p.s) && p.s[p.i] == '-' && p.s[p.i+1] != ']' {
				p.i++
				if hi, err = p.char(); err != nil {
					return nil, err
				}
			}
			e.ranges = append(e.ranges, rng{lo, hi})
		}
	case c == '.':
		p.i++
		return append(seq, elem{ref: -1, negate: true}), nil
	case c == '(':
		p.i++
		alts, err := p.alternatives(depth + 1)
		if err != nil {
			return nil, err
		}
		p.i++ // ')'
		return append(seq, elem{ref: p.newRule(alts)}), nil
	case isWord(c):
		return append(seq, elem{ref: p.rule(p.name())}), nil
	}
	return nil, p.errf("unexpected %q", p.s[p.i])
}

// char reads one possibly escaped code point of a literal or class.
func (p *parser) char() (rune, error) {
	if p.s[p.i] != '\\' {
		r, n := utf8.DecodeRuneInString(p.s[p.i:])
		p.i += n
		return r, nil
	}
	if p.i+1 >= len(p.s) {
		return 0, p.errf("dangling escape")
	}
	c := p.s[p.i+1]
	p.i += 2
	hex := map[byte]int{'x': 2, 'u': 4, 'U': 8}[c]
	if hex > 0 {
		if p.i+hex > len(p.s) {
			return 0, p.errf("short \\%c escape", c)
		}
		v, err := strconv.ParseUint(p.s[p.i:p.i+hex], 16, 32)
		if err != nil {
			return 0, p.errf("bad \\%c escape", c)
		}
		p.i += hex
		return rune(v), nil
	}
	switch c {
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case '\\', '"', '[', ']', '-', '^':
		return rune(c), nil
	}
	return 0, p.errf("unknown escape \\%c", c)
}

// postfix applies *, +, ?, {m,n} to seq[start:] (the last primary),
// desugared into rules as llama.cpp does.
func (p *parser) postfix(seq []elem, start int) ([]elem, error) {
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c != '*' && c != '+' && c != '?' && c != '{' {
			return seq, nil
		}
		p.i++
		last := append([]elem(nil), seq[start:]...)
		seq = seq[:start]
		minN, maxN := 0, -1
		switch c {
		case '+':
			minN = 1
		case '?':
			maxN = 1
		case '{':
			end := strings.IndexByte(p.s[p.i:], '}')
			if end < 0 {
				return nil, p.errf("unterminated {")
			}
			spec := p.s[p.i : p.i+end]
			p.i += end + 1
			lo, hi, comma := strings.Cut(spec, ",")
			var err error
			if minN, err = strconv.Atoi(strings.TrimSpace(lo)); err != nil || minN < 0 || minN > maxRepeat {
				return nil, p.errf("bad repetition {%s}", spec)
			}
			maxN = minN
			if comma {
				maxN = -1
				if h := strings.TrimSpace(hi); h != "" {
					if maxN, err = strconv.Atoi(h); err != nil || maxN < minN || maxN > maxRepeat {
						return nil, p.errf("bad repetition {%s}", spec)
					}
				}
			}
		}
		// An upper bound of what the copies add: minN of last, and a rule
		// of last with a reference per optional one.
		extra := minN * len(last)
		if maxN < 0 {
			extra += len(last) + 2
		} else {
			extra += (maxN - minN) * (len(last) + 2)
		}
		if err := p.spend(extra); err != nil {
			return nil, err
		}
		for range minN {
			seq = append(seq, last...)
		}
		if maxN < 0 { // r ::= last r |
			id := p.newRule(nil)
			p.g.rules[id] = [][]elem{append(append([]elem(nil), last...), elem{ref: id}), {}}
			seq = append(seq, elem{ref: id})
		} else if maxN > minN { // nested optionals: (last (last ...)?)?
			id := p.newRule([][]elem{append([]elem(nil), last...), {}})
			for range maxN - minN - 1 {
				id = p.newRule([][]elem{append(append([]elem(nil), last...), elem{ref: id}), {}})
			}
			seq = append(seq, elem{ref: id})
		}
	}
	return seq, nil
}
