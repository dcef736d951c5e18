package grammar

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
)

// Vocab is a tokenizer's vocabulary as a grammar sees it: each token's
// text and the end-of-generation ids. Built once per engine; read only,
// safe for concurrent use.
type Vocab struct {
	pieces [][]byte
	eog    []int32
	isEOG  []bool   // by id
	dec    *decoded // pieces decoded from no unfinished sequence
}

// ErrNoLogits is returned by ForEngine's vocabulary for an engine that
// chooses tokens without logits (engine.LogitFree).
var ErrNoLogits = errors.New("grammar: the engine chooses tokens without logits and cannot follow a grammar")

// Source makes the grammar states of one engine's sequences: from the
// engine's own grammar sampler when it has one (engine.GrammarSampler:
// llama.cpp's), else the Go mask over its vocabulary, read from its
// tokenizer on first use. Safe for concurrent use.
type Source struct {
	eng   engine.Engine
	vocab func() *Vocab
}

// ForEngine returns eng's Source.
func ForEngine(eng engine.Engine) *Source {
	return &Source{eng: eng, vocab: sync.OnceValue(func() *Vocab { return NewVocab(eng.Tokenizer()) })}
}

// Constrain parses gbnf (root rule "root") and returns its state advanced
// over generated (the tokens a sequence already holds, from prefill's
// first token or before a failover); the caller closes it. Every grammar
// is parsed here first, so every engine takes the same grammar language
// and refuses it with the same errors. Errors: ErrNoLogits (the engine
// chooses tokens without logits), ErrSyntax, ErrRejected, the engine's
// refusal.
func (s *Source) Constrain(gbnf string, generated []int32) (engine.GrammarState, error) {
	c, err := s.Compile(gbnf)
	if err != nil {
		return nil, err
	}
	return c.State(generated)
}

// Compiled is a grammar checked and parsed once for a request, from which
// each of its choices takes its own state (State, Offloaded). Compile it
// where the request arrives, not on the engine loop: its cost grows with
// the grammar, bounded by MaxBytes, DefaultLimits' rules and states,
// MaxStateBytes and CompileTime, where a State costs the grammar's first
// expansion and the tokens it is advanced over. Safe for concurrent use
// (its table of states, which its Offloaded states fill, is the only part
// that changes).
type Compiled struct {
	src   *Source
	gbnf  string
	g     *Grammar
	start *node  // the start state and its mask (the Go mask only)
	table *table // the states its Offloaded choices share
}

// CompileTime bounds Compile: parsing, the start state's expansion and
// (for the Go mask) its mask. A grammar that takes longer is refused
// with a *LimitError ("compile milliseconds"). The costliest schema
// within DefaultLimits took 0.8-2.1 s (parse and start mask) on a 2-core
// machine at a load average of 13, and up to 6 s under the race
// detector: the budget is a backstop above what a grammar within the
// limits takes, not a limit such a grammar meets under load.
const CompileTime = 10 * time.Second

// Compile parses gbnf (root rule "root") within MaxBytes and
// DefaultLimits (Check), checks that its start expands within the
// matcher's bounds and MaxStateBytes, and, for engines without a grammar
// sampler of their own, computes its start state's mask; all of it
// within CompileTime. Errors: ErrNoLogits (the engine chooses tokens
// without logits), a *LimitError, ErrSyntax, the matcher's bound.
func (s *Source) Compile(gbnf string) (*Compiled, error) {
	return s.compile(gbnf, CompileTime)
}

func (s *Source) compile(gbnf string, budget time.Duration) (*Compiled, error) {
	if _, ok := s.eng.(engine.LogitFree); ok {
		return nil, ErrNoLogits
	}
	start := time.Now()
	late := func() bool { return time.Since(start) > budget }
	over := &LimitError{Limit: "compile milliseconds", Max: int(budget.Milliseconds())}
	g, err := Check(gbnf, Limits{})
	if err != nil {
		return nil, err
	}
	m, err := g.Matcher()
	if err != nil {
		return nil, err
	}
	if stateBytes(m.stacks) > MaxStateBytes {
		return nil, &LimitError{Limit: "state bytes", Max: MaxStateBytes}
	}
	if late() {
		return nil, over
	}
	c := &Compiled{src: s, gbnf: gbnf, g: g, table: &table{nodes: map[string]*node{}}}
	if _, ok := s.eng.(engine.GrammarSampler); ok {
		return c, nil
	}
	if c.start, err = s.vocab().build(g, c.table, m.stacks, m.part, late); errors.Is(err, errDeadline) {
		return nil, over
	} else if err != nil {
		return nil, err
	}
	return c, nil
}

// State returns a new state of c advanced over generated (the tokens a
// sequence already holds, from prefill's first token or before a
// failover); the caller closes it. Errors: ErrRejected, the engine's
// refusal.
func (c *Compiled) State(generated []int32) (engine.GrammarState, error) {
	var st engine.GrammarState
	var err error
	if gs, ok := c.src.eng.(engine.GrammarSampler); ok {
		if st, err = gs.NewGrammar(c.gbnf); err != nil {
			return nil, err
		}
	} else if st, err = c.src.vocab().Mask(c.g); err != nil {
		return nil, err
	}
	if err := st.Accept(generated...); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// Offloaded returns a new state of c, as State does, whose work runs on o
// under key (the request's tenant: o takes keys in turn) and whose
// states are shared with every other state c gives: an *Offloaded, or,
// for an engine with a grammar sampler of its own, State's. It is
// advanced over generated here, in the caller. Errors: ErrRejected, the
// engine's refusal.
func (c *Compiled) Offloaded(o *Offload, key uint64, generated []int32) (engine.GrammarState, error) {
	if c.start == nil {
		return c.State(generated)
	}
	st := &Offloaded{c: c, key: key, cur: c.start}
	// Without o, Accept computes every state here.
	if err := st.Accept(generated...); err != nil {
		return nil, err
	}
	st.o = o
	return st, nil
}

// NewVocab reads tok's token texts (DecodeToken) and end-of-generation
// ids (engine.EOGTokens).
func NewVocab(tok engine.Tokenizer) *Vocab {
	v := &Vocab{pieces: make([][]byte, tok.Vocab()), eog: engine.EOGTokens(tok)}
	for i := range v.pieces {
		v.pieces[i] = tok.DecodeToken(int32(i))
	}
	v.isEOG = make([]bool, len(v.pieces))
	for _, id := range v.eog {
		if id >= 0 && int(id) < len(v.isEOG) {
			v.isEOG[id] = true
		}
	}
	v.dec = decodeAll(v.pieces, partial{})
	return v
}

// Constrain parses gbnf (root rule "root") and returns its mask advanced
// over generated (accept: the tokens a sequence already holds, from
// prefill's first token or before a failover). Errors: ErrSyntax,
// ErrRejected.
func (v *Vocab) Constrain(gbnf string, generated []int32) (*TokenMask, error) {
	g, err := Parse(gbnf, "root")
	if err != nil {
		return nil, err
	}
	t, err := v.Mask(g)
	if err != nil {
		return nil, err
	}
	if err := t.Accept(generated...); err != nil {
		return nil, err
	}
	return t, nil
}

// Mask returns the mask of g at its start over v.
func (v *Vocab) Mask(g *Grammar) (*TokenMask, error) {
	m, err := g.Matcher()
	if err != nil {
		return nil, err
	}
	return &TokenMask{m: m, v: v}, nil
}

// TokenMask is a Matcher over a vocabulary: the engine.Constraint of one
// sequence. Not safe for concurrent use.
type TokenMask struct {
	m  *Matcher
	v  *Vocab
	cs []cand // Mask's candidates, reused
	// allowed is the state after the token Allows last allowed, so that
	// accepting that token (a sampler checks a token, then its worker
	// accepts it) walks the stacks once; valid until the state moves.
	allowed struct {
		ok     bool
		id     int32
		stacks [][]pos
		part   partial
	}
}

var _ engine.GrammarState = (*TokenMask)(nil)

// NewTokenMask returns the mask of g at its start over tok's vocabulary.
func NewTokenMask(g *Grammar, tok engine.Tokenizer) (*TokenMask, error) {
	return NewVocab(tok).Mask(g)
}

func (t *TokenMask) isEOG(id int32) bool { return t.v.isEOG[id] }

// Mask implements engine.Constraint: ids beyond the vocabulary are masked.
// Its cost is one pass over the vocabulary per parse stack, plus a
// decoding of every token's text when the last token ended inside a
// UTF-8 sequence.
func (t *TokenMask) Mask(logits []float32) {
	n := min(len(logits), len(t.v.pieces))
	d := t.v.dec
	if t.m.part.remain != 0 {
		d = decodeAll(t.v.pieces, t.m.part)
	}
	t.cs = t.m.mask(logits[:n], d, t.isEOG, t.cs)
	neg := float32(math.Inf(-1))
	for i := n; i < len(logits); i++ {
		logits[i] = neg
	}
}

// Accept advances the mask over tokens, in order: the tokens already
// generated, so a worker that takes a sequence over (the decode worker
// after prefill's first token, or after a failover) rebuilds the state
// from them. An end-of-generation token is accepted only when the grammar
// is complete. Errors: ErrRejected (the state is then that after the
// tokens before the refused one).
func (t *TokenMask) Accept(tokens ...int32) error {
	for _, id := range tokens {
		if id >= 0 && int(id) < len(t.v.isEOG) && t.isEOG(id) {
			if !t.m.Complete() {
				return fmt.Errorf("%w: end of generation before the grammar is complete", ErrRejected)
			}
			continue
		}
		if id < 0 || int(id) >= len(t.v.pieces) || len(t.v.pieces[id]) == 0 {
			return fmt.Errorf("%w: token %d has no text", ErrRejected, id)
		}
		if a := &t.allowed; a.ok && a.id == id {
			t.m.stacks, t.m.part = a.stacks, a.part
			a.ok, a.stacks = false, nil
			continue
		}
		t.allowed.ok, t.allowed.stacks = false, nil
		if err := t.m.Accept(t.v.pieces[id]); err != nil {
			return err
		}
	}
	return nil
}

// Complete reports whether the output so far is a whole sentence.
func (t *TokenMask) Complete() bool { return t.m.Complete() }

// Allows implements engine.TokenChecker: whether token id may come next.
func (t *TokenMask) Allows(id int32) bool {
	if id < 0 || int(id) >= len(t.v.pieces) {
		return false
	}
	if t.isEOG(id) {
		return t.m.Complete()
	}
	text := t.v.pieces[id]
	if len(text) == 0 || text[0] == 0 {
		return false
	}
	st, part := t.m.walk(text, t.m.stacks, t.m.part)
	if st == nil {
		return false
	}
	t.allowed.ok, t.allowed.id, t.allowed.stacks, t.allowed.part = true, id, st, part
	return true
}

var _ engine.TokenChecker = (*TokenMask)(nil)

// Close implements engine.GrammarState; a TokenMask holds only Go memory.
func (t *TokenMask) Close() {}
