package llamacpp

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"unsafe"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
)

// tokenData is struct llama_token_data.
type tokenData struct {
	id    int32
	logit float32
	p     float32
}

// tokenDataArray is struct llama_token_data_array; data points at Go
// memory the caller keeps alive across the call.
type tokenDataArray struct {
	data     uintptr // *llama_token_data
	size     uintptr
	selected int64
	sorted   bool
	_        [7]byte
}

// ErrGrammar is wrapped by NewGrammar's errors for a grammar llama.cpp's
// parser refuses (its reason goes to llama.cpp's log).
var ErrGrammar = errors.New("llamacpp: llama.cpp refused the grammar")

// grammarVocab is what every grammar state of a model shares, built on
// the first grammar: the ids offered to llama.cpp's grammar sampler.
type grammarVocab struct {
	// cand are the ids a grammar may allow: the end-of-generation ids and
	// every token whose text (DecodeToken, as clients see it) is not
	// empty. llama.cpp's sampler matches a special token by its
	// rendered name (<|im_start|>), which pdserve's output never shows:
	// offering it would let the grammar accept text the client does not
	// get, so such tokens are masked before llama.cpp sees them.
	cand []int32
	ok   []bool  // by id: in cand
	eog  []int32 // the end-of-generation ids
}

func (m *Model) grammarVocab() *grammarVocab {
	m.gvOnce.Do(func() {
		tok := m.tok
		gv := &grammarVocab{ok: make([]bool, tok.n), eog: tok.eog}
		eog := make(map[int32]bool, len(tok.eog))
		for _, id := range tok.eog {
			eog[id] = true
		}
		for id := range int32(tok.n) {
			if eog[id] || len(tok.DecodeToken(id)) > 0 {
				gv.cand = append(gv.cand, id)
				gv.ok[id] = true
			}
		}
		m.gv = gv
	})
	return m.gv
}

// Grammar is one sequence's state in llama.cpp's grammar sampler
// (llama_sampler_init_grammar over the model's vocabulary): an
// engine.GrammarState. Mask runs llama_sampler_apply over the vocabulary
// and copies the ids it refused into the logits as -Inf, so the sampler
// that chooses among the rest stays pdserve's (engine.Sample, the same
// on every engine). Accept feeds llama_sampler_accept, after checking
// the token with a one-candidate apply: llama.cpp aborts the process on
// a token its grammar refuses, pdserve returns grammar.ErrRejected.
//
// The C sampler is freed by Close; a Grammar must be closed before its
// model. Its methods may be called from any goroutine, one at a time
// (a mutex guards the C state against a Close racing a step).
type Grammar struct {
	mu   sync.Mutex
	a    *api
	smpl uintptr // *llama_sampler; 0 once closed
	gv   *grammarVocab
	n    int          // vocabulary size
	buf  []tokenData  // candidates of Mask
	one  [1]tokenData // Accept's and Complete's checks
}

var _ engine.GrammarState = (*Grammar)(nil)

// NewGrammar returns the state of gbnf (start rule "root") at its start,
// in llama.cpp's grammar sampler. Errors: ErrGrammar (llama.cpp's parser
// refused it, or the text holds a NUL byte).
func (m *Model) NewGrammar(gbnf string) (*Grammar, error) {
	if strings.IndexByte(gbnf, 0) >= 0 {
		return nil, fmt.Errorf("%w: the grammar holds a NUL byte", ErrGrammar)
	}
	if gbnf == "" {
		return nil, fmt.Errorf("%w: empty grammar", ErrGrammar)
	}
	gv := m.grammarVocab()
	smpl := m.api.samplerInitGrammar(m.vocab, gbnf, "root")
	if smpl == 0 {
		return nil, fmt.Errorf("%w (syntax, an undefined rule, no root rule, or left recursion)", ErrGrammar)
	}
	return &Grammar{a: m.api, smpl: smpl, gv: gv, n: m.tok.n, buf: make([]tokenData, len(gv.cand))}, nil
}

// NewGrammar implements engine.GrammarSampler with the engine's model.
func (e *Engine) NewGrammar(gbnf string) (engine.GrammarState, error) {
	g, err := e.model.NewGrammar(gbnf)
	if err != nil {
		return nil, err
	}
	return g, nil
}

var _ engine.GrammarSampler = (*Engine)(nil)

// apply runs llama_sampler_apply over d; the caller holds mu and smpl
// is live.
func (g *Grammar) apply(d []tokenData) {
	arr := tokenDataArray{data: uintptr(unsafe.Pointer(&d[0])), size: uintptr(len(d)), selected: -1}
	g.a.samplerApply(g.smpl, &arr)
	keepAlive(d)
}

// Mask implements engine.Constraint: logits[t] becomes -Inf for every
// token t llama.cpp's grammar refuses next, every token it is not
// offered (see grammarVocab), and ids beyond the vocabulary. After Close
// every logit is -Inf.
func (g *Grammar) Mask(logits []float32) {
	neg := float32(math.Inf(-1))
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.smpl == 0 || len(g.buf) == 0 {
		for i := range logits {
			logits[i] = neg
		}
		return
	}
	for i, id := range g.gv.cand {
		g.buf[i] = tokenData{id: id}
	}
	g.apply(g.buf)
	n := min(len(logits), g.n)
	for i := n; i < len(logits); i++ {
		logits[i] = neg
	}
	next := 0 // ids below next are settled
	for _, d := range g.buf {
		if int(d.id) >= n {
			break
		}
		for ; next < int(d.id); next++ {
			logits[next] = neg
		}
		if math.IsInf(float64(d.logit), -1) {
			logits[d.id] = neg
		}
		next = int(d.id) + 1
	}
	for ; next < n; next++ {
		logits[next] = neg
	}
}

// Allows implements engine.TokenChecker with a one-candidate
// llama_sampler_apply.
func (g *Grammar) Allows(id int32) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.allows(id)
}

// allows is Allows; the caller holds mu.
func (g *Grammar) allows(id int32) bool {
	if g.smpl == 0 || id < 0 || int(id) >= g.n || !g.gv.ok[id] {
		return false
	}
	g.one[0] = tokenData{id: id}
	g.apply(g.one[:])
	return !math.IsInf(float64(g.one[0].logit), -1)
}

var _ engine.TokenChecker = (*Grammar)(nil)

// Accept implements engine.GrammarState. Errors: grammar.ErrRejected.
func (g *Grammar) Accept(tokens ...int32) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, id := range tokens {
		if !g.allows(id) {
			return fmt.Errorf("%w: token %d", grammar.ErrRejected, id)
		}
		g.a.samplerAccept(g.smpl, id)
	}
	return nil
}

// Complete implements engine.GrammarState: llama.cpp allows an
// end-of-generation id only when the root rule is complete.
func (g *Grammar) Complete() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.gv.eog) > 0 && g.allows(g.gv.eog[0])
}

// Close frees the C sampler. Idempotent.
func (g *Grammar) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.smpl != 0 {
		g.a.samplerFree(g.smpl)
		g.smpl = 0
	}
}
