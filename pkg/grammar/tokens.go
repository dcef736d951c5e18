package grammar

import (
	"fmt"
	"math"
	"slices"

	"github.com/pdserve/pdserve/pkg/engine"
)

// TokenMask is a Matcher over a tokenizer's vocabulary: the
// engine.Constraint of one sequence. Not safe for concurrent use.
type TokenMask struct {
	m      *Matcher
	pieces [][]byte
	eog    []int32
}

var _ engine.Constraint = (*TokenMask)(nil)

// NewTokenMask returns the mask of g at its start over tok's vocabulary
// (token texts from DecodeToken; end of generation from engine.EOGTokens).
func NewTokenMask(g *Grammar, tok engine.Tokenizer) (*TokenMask, error) {
	m, err := g.Matcher()
	if err != nil {
		return nil, err
	}
	pieces := make([][]byte, tok.Vocab())
	for i := range pieces {
		pieces[i] = tok.DecodeToken(int32(i))
	}
	return &TokenMask{m: m, pieces: pieces, eog: engine.EOGTokens(tok)}, nil
}

func (t *TokenMask) isEOG(id int32) bool { return slices.Contains(t.eog, id) }

// Mask implements engine.Constraint: ids beyond the vocabulary are masked.
func (t *TokenMask) Mask(logits []float32) {
	n := min(len(logits), len(t.pieces))
	t.m.Mask(logits[:n], t.pieces, t.isEOG)
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
		if id < 0 || int(id) >= len(t.pieces) || len(t.pieces[id]) == 0 {
			return fmt.Errorf("%w: token %d has no text", ErrRejected, id)
		}
		if err := t.m.Accept(t.pieces[id]); err != nil {
			return err
		}
	}
	return nil
}

// Complete reports whether the output so far is a whole sentence.
func (t *TokenMask) Complete() bool { return t.m.Complete() }
