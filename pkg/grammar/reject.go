package grammar

import (
	"math"
	"slices"
)

// decoded is a vocabulary's token texts as code points, each continuing
// one unfinished sequence: token id's code points are cps[start[id]:
// start[id+1]], the sequence it leaves unfinished part[id]; bad[id] when
// its text breaks UTF-8 or is empty (never allowed).
type decoded struct {
	cps   []rune
	start []int32
	part  []partial
	bad   []bool
}

// decodeAll decodes every piece, continuing from.
func decodeAll(pieces [][]byte, from partial) *decoded {
	d := &decoded{start: make([]int32, len(pieces)+1), part: make([]partial, len(pieces)), bad: make([]bool, len(pieces))}
	for id, p := range pieces {
		var ok bool
		n := len(d.cps)
		d.cps, d.part[id], ok = decodeUTF8(p, from, d.cps)
		if !ok || len(p) == 0 || p[0] == 0 {
			d.cps = d.cps[:n]
			d.bad[id] = true
		}
		d.start[id+1] = int32(len(d.cps))
	}
	return d
}

// cand is a candidate token, at code point at of d.cps.
type cand struct{ id, at int32 }

// reject is llama_grammar_reject_candidates: the candidates no stack of
// stacks accepts, every code point in turn and the unfinished sequence
// after them. Candidates are matched in lockstep, one code point of all
// of them at a time, so each stack is expanded once per prefix the
// candidates share, not once per token.
func (g *Grammar) reject(d *decoded, stacks [][]pos, cs []cand) []cand {
	if len(cs) == 0 {
		return nil
	}
	if len(stacks) == 0 {
		return cs
	}
	var out []cand
	if len(stacks) > 1 {
		cs, out = g.prefilter(d, stacks, cs)
		if len(cs) == 0 {
			return out
		}
	}
	rej := g.rejectStack(d, stacks[0], cs)
	for _, st := range stacks[1:] {
		if len(rej) == 0 {
			break
		}
		rej = g.rejectStack(d, st, rej)
	}
	return append(out, rej...)
}

// maxPrefilterTops bounds the distinct stack tops prefilter compares a
// candidate with; past it, the stacks sort candidates out one by one.
const maxPrefilterTops = 32

// prefilter splits cs into the candidates some stack's top allows and
// those whose next code point (or unfinished sequence) no top allows,
// which every stack refuses: sorted out once
// for each distinct top, instead of once for each stack (an enum of many
// strings sharing a prefix keeps as many stacks, all with the same top).
// keep reuses cs's array.
func (g *Grammar) prefilter(d *decoded, stacks [][]pos, cs []cand) (keep, out []cand) {
	var tops []elem
	for _, st := range stacks {
		if len(st) == 0 {
			continue
		}
		e := g.top(st)
		if !slices.ContainsFunc(tops, func(t elem) bool { return t.negate == e.negate && slices.Equal(t.ranges, e.ranges) }) {
			if len(tops) == maxPrefilterTops {
				return cs, nil
			}
			tops = append(tops, e)
		}
	}
	keep = cs[:0:0]
	for _, c := range cs {
		var ok bool
		if c.at == d.start[c.id+1] {
			// At its end: allowed unless it leaves a sequence unfinished
			// that no top can finish (a byte of a multi-byte character).
			p := d.part[c.id]
			ok = p.remain == 0 || slices.ContainsFunc(tops, func(t elem) bool { return t.matchesPartial(p) })
		} else {
			ok = slices.ContainsFunc(tops, func(t elem) bool { return t.matches(d.cps[c.at]) })
		}
		if ok {
			keep = append(keep, c)
		} else {
			out = append(out, c)
		}
	}
	return keep, out
}

func (g *Grammar) rejectStack(d *decoded, st []pos, cs []cand) []cand {
	var rej []cand
	if len(st) == 0 {
		for _, c := range cs {
			if c.at < d.start[c.id+1] || d.part[c.id].remain != 0 {
				rej = append(rej, c)
			}
		}
		return rej
	}
	e := g.top(st)
	var next []cand
	for _, c := range cs {
		switch {
		case c.at == d.start[c.id+1]:
			if p := d.part[c.id]; p.remain != 0 && !e.matchesPartial(p) {
				rej = append(rej, c)
			}
		case e.matches(d.cps[c.at]):
			next = append(next, cand{c.id, c.at + 1})
		default:
			rej = append(rej, c)
		}
	}
	if len(next) == 0 || !slices.ContainsFunc(next, func(c cand) bool { return c.at < d.start[c.id+1] || d.part[c.id].remain != 0 }) {
		// Every candidate that matched ended with a whole code point: the
		// stack allows it without expanding further (Accept's expansion
		// still checks the stack's bounds).
		return rej
	}
	top := st[len(st)-1]
	var after [][]pos
	if err := g.expand(append(st[:len(st)-1:len(st)-1], pos{top.rule, top.alt, top.i + 1}), &after); err != nil {
		after = nil // too deep: nothing further is accepted
	}
	for _, c := range g.reject(d, dedupe(after), next) {
		rej = append(rej, cand{c.id, c.at - 1})
	}
	return rej
}

// Mask sets logits[t] to -Inf for every token t the grammar forbids next:
// pieces[t] is t's text (as Allows reads it); eog reports an
// end-of-generation id, allowed only when Complete. len(pieces) must
// cover logits.
func (m *Matcher) Mask(logits []float32, pieces [][]byte, eog func(int32) bool) {
	m.mask(logits, decodeAll(pieces[:len(logits)], m.part), eog, nil)
}

// mask is Mask over pieces decoded (continuing m.part); cs is a buffer
// for the candidates, returned grown.
func (m *Matcher) mask(logits []float32, d *decoded, eog func(int32) bool, cs []cand) []cand {
	neg := float32(math.Inf(-1))
	done := m.Complete()
	cs = cs[:0]
	for id := range int32(len(logits)) {
		switch {
		case eog(id):
			if !done {
				logits[id] = neg
			}
		case d.bad[id]:
			logits[id] = neg
		default:
			cs = append(cs, cand{id, d.start[id]})
		}
	}
	for _, c := range m.g.reject(d, m.stacks, cs) {
		logits[c.id] = neg
	}
	return cs
}
