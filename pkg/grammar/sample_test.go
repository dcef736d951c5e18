package grammar

import (
	"math/rand/v2"
	"strings"
)

// sampler draws random sentences of a grammar: each rule's alternative
// at random while the sentence is short and shallow, then the
// alternatives that end soonest, so that every draw ends.
type sampler struct {
	g    *Grammar
	rnd  *rand.Rand
	cost []int // the length of the shortest sentence of each rule
}

// probes are the characters a negated class is drawn from.
var probes = []rune("aZ09 \"\\/-_.,:{}[]\té東\n\x01\x7fxyzAB+eE")

func newSampler(g *Grammar, rnd *rand.Rand) *sampler {
	s := &sampler{g: g, rnd: rnd, cost: make([]int, len(g.rules))}
	const inf = 1 << 30
	for i := range s.cost {
		s.cost[i] = inf
	}
	for changed := true; changed; {
		changed = false
		for r, alts := range g.rules {
			for _, alt := range alts {
				if c := s.altCost(alt); c < s.cost[r] {
					s.cost[r], changed = c, true
				}
			}
		}
	}
	return s
}

func (s *sampler) altCost(alt []elem) int {
	c := 0
	for _, e := range alt {
		if e.ref < 0 {
			c++
		} else {
			c += s.cost[e.ref]
		}
		if c >= 1<<30 {
			return 1 << 30
		}
	}
	return c
}

// sentence returns a random sentence, or false when a class allows none
// of the characters drawn.
func (s *sampler) sentence() (string, bool) {
	var b strings.Builder
	ok := s.rule(s.g.root, 0, &b)
	return b.String(), ok
}

func (s *sampler) rule(r, depth int, b *strings.Builder) bool {
	alts := s.g.rules[r]
	var alt []elem
	if depth < 12 && b.Len() < 300 && s.rnd.IntN(4) != 0 {
		alt = alts[s.rnd.IntN(len(alts))]
	} else {
		best := -1
		for i, a := range alts {
			if best < 0 || s.altCost(a) < s.altCost(alts[best]) {
				best = i
			}
		}
		alt = alts[best]
	}
	for _, e := range alt {
		if e.ref >= 0 {
			if !s.rule(e.ref, depth+1, b) {
				return false
			}
			continue
		}
		r, ok := s.char(e)
		if !ok {
			return false
		}
		b.WriteRune(r)
	}
	return true
}

func (s *sampler) char(e elem) (rune, bool) {
	if !e.negate && len(e.ranges) > 0 {
		g := e.ranges[s.rnd.IntN(len(e.ranges))]
		if g.hi-g.lo > 200 { // stay near the start of wide ranges
			g.hi = g.lo + 200
		}
		return g.lo + rune(s.rnd.IntN(int(g.hi-g.lo)+1)), true
	}
	var ok []rune
	for _, r := range probes {
		if e.matches(r) {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return 0, false
	}
	return ok[s.rnd.IntN(len(ok))], true
}

// nearMisses returns edits of text that may fall just outside a
// language: a character deleted, inserted, replaced or duplicated.
func nearMisses(text string, rnd *rand.Rand, n int) []string {
	rs := []rune(text)
	var out []string
	for range n {
		if len(rs) == 0 {
			out = append(out, string(probes[rnd.IntN(len(probes))]))
			continue
		}
		i := rnd.IntN(len(rs))
		c := probes[rnd.IntN(len(probes))]
		var m []rune
		switch rnd.IntN(4) {
		case 0:
			m = append(append(m, rs[:i]...), rs[i+1:]...)
		case 1:
			m = append(append(append(m, rs[:i]...), c), rs[i:]...)
		case 2:
			m = append(append(append(m, rs[:i]...), c), rs[i+1:]...)
		default:
			m = append(append(append(m, rs[:i+1]...), rs[i]), rs[i+1:]...)
		}
		out = append(out, string(m))
	}
	return out
}

// member reports whether text is a sentence of g (a matcher that gives up
// is a no).
func member(g *Grammar, text string) bool {
	m, err := g.Matcher()
	if err != nil {
		return false
	}
	return m.Accept([]byte(text)) == nil && m.Complete()
}
