package grammar

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/pdserve/pdserve/pkg/engine"
)

// Vocab is a tokenizer's vocabulary as a grammar sees it: each token's
// text and the end-of-generation ids. Built once per engine; read only,
// safe for concurrent use.
type Vocab struct {
	pieces [][]byte
	eog    []int32
}

// ErrNoLogits is returned by ForEngine's vocabulary for an engine that
// chooses tokens without logits (engine.LogitFree).
var ErrNoLogits = errors.New("grammar: the engine chooses tokens without logits and cannot follow a grammar")

// ForEngine returns a function giving eng's vocabulary, read from its
// tokenizer on the first call (safe for concurrent use), or ErrNoLogits.
func ForEngine(eng engine.Engine) func() (*Vocab, error) {
	return sync.OnceValues(func() (*Vocab, error) {
		if _, ok := eng.(engine.LogitFree); ok {
			return nil, ErrNoLogits
		}
		return NewVocab(eng.Tokenizer()), nil
	})
}

// NewVocab reads tok's token texts (DecodeToken) and end-of-generation
// ids (engine.EOGTokens).
func NewVocab(tok engine.Tokenizer) *Vocab {
	v := &Vocab{pieces: make([][]byte, tok.Vocab()), eog: engine.EOGTokens(tok)}
	for i := range v.pieces {
		v.pieces[i] = tok.DecodeToken(int32(i))
	}
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
	m *Matcher
	v *Vocab
}

var _ engine.Constraint = (*TokenMask)(nil)

// NewTokenMask returns the mask of g at its start over tok's vocabulary.
func NewTokenMask(g *Grammar, tok engine.Tokenizer) (*TokenMask, error) {
	return NewVocab(tok).Mask(g)
}

func (t *TokenMask) isEOG(id int32) bool { return slices.Contains(t.v.eog, id) }

// Mask implements engine.Constraint: ids beyond the vocabulary are masked.
func (t *TokenMask) Mask(logits []float32) {
	n := min(len(logits), len(t.v.pieces))
	t.m.Mask(logits[:n], t.v.pieces, t.isEOG)
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
		if t.isEOG(id) {
			if !t.m.Complete() {
				return fmt.Errorf("%w: end of generation before the grammar is complete", ErrRejected)
			}
			continue
		}
		if id < 0 || int(id) >= len(t.v.pieces) || len(t.v.pieces[id]) == 0 {
			return fmt.Errorf("%w: token %d has no text", ErrRejected, id)
		}
		if err := t.m.Accept(t.v.pieces[id]); err != nil {
			return err
		}
	}
	return nil
}

// Complete reports whether the output so far is a whole sentence.
func (t *TokenMask) Complete() bool { return t.m.Complete() }
