package ref

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// ErrClosed is returned by Prefill, Decode and Step after Close.
var ErrClosed = errors.New("ref: engine closed")

// Options configure New.
type Options struct {
	// Preset names the synthetic model shape, one of Presets().
	Preset string
	// Seed selects the synthetic weights: engines built with the same
	// preset and seed compute bit-identical results.
	Seed uint64
	// Threads is the number of goroutines that share matrix work, the
	// caller's included; 0 means GOMAXPROCS. It does not change results.
	Threads int
	// MaxSeqLen, when > 0, replaces the preset's maximum sequence length
	// (tokens). It does not change results for shorter sequences.
	MaxSeqLen int
}

// Engine is the reference CPU engine. Like every engine.Engine it is not
// safe for concurrent use; its matrix work runs on its own worker
// goroutines, which Close stops.
type Engine struct {
	spec  engine.ModelSpec
	w     *weights
	pool  *pool
	rope  []float32 // MaxSeqLen × HeadDim: cos, sin for each pair
	seqs  map[engine.SeqID]*seqState
	spare []*seqState // freed states kept for their buffers
	done  bool

	// Per-call scratch, grown on demand and reused.
	seen        map[engine.SeqID]struct{}
	segs        []segment
	created     []engine.SeqID
	tokens      []int32       // per row
	x           []float32     // rows × Hidden: the residual stream
	xn          []float32     // rows × Hidden: normalised input of a sublayer
	qkv         []float32     // rows × (Heads+2·KVHeads)·HeadDim
	att         []float32     // rows × Heads·HeadDim
	gu          []float32     // rows × 2·Intermediate
	hid         []float32     // rows × Intermediate
	logits      []float32     // output rows (sampled, AllLogits) × Vocab
	attnScratch []attnScratch // per worker
	kvBuf       []byte
	sample      engine.SampleScratch
	mm          matmulJob
	attn        attnJob
	rowOp       rowJob
}

var (
	_ engine.Engine  = (*Engine)(nil)
	_ engine.Stepper = (*Engine)(nil)
	_ engine.Forker  = (*Engine)(nil)
)

// maxSpare bounds the freed sequence states kept for reuse.
const maxSpare = 64

// New builds an engine with synthetic weights. It returns an error for an
// unknown preset or a negative option.
func New(opts Options) (*Engine, error) {
	spec, ok := presets[opts.Preset]
	if !ok {
		return nil, fmt.Errorf("ref: unknown preset %q (have %v)", opts.Preset, Presets())
	}
	if opts.Threads < 0 || opts.MaxSeqLen < 0 {
		return nil, fmt.Errorf("ref: threads %d and max seq len %d must not be negative", opts.Threads, opts.MaxSeqLen)
	}
	if opts.MaxSeqLen > 0 {
		spec.MaxSeqLen = opts.MaxSeqLen
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	threads := opts.Threads
	if threads == 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	e := &Engine{
		spec: spec,
		w:    syntheticWeights(spec, opts.Seed),
		pool: newPool(threads),
		rope: ropeTable(spec),
		seqs: make(map[engine.SeqID]*seqState),
		seen: make(map[engine.SeqID]struct{}),
	}
	e.attnScratch = make([]attnScratch, e.pool.size)
	e.attn.e = e
	e.rowOp.e = e
	// Stop the workers if the engine is dropped without Close.
	runtime.AddCleanup(e, func(p *pool) { p.close() }, e.pool)
	return e, nil
}

// ropeTable returns cos and sin of position·θ^(-2i/HeadDim) for every
// position and pair i, computed in float64 and rounded once.
func ropeTable(s engine.ModelSpec) []float32 {
	d := s.HeadDim
	t := make([]float32, s.MaxSeqLen*d)
	for p := range s.MaxSeqLen {
		for i := 0; i+1 < d; i += 2 {
			angle := float64(p) * math.Pow(s.RopeTheta, -float64(i)/float64(d))
			t[p*d+i] = float32(math.Cos(angle))
			t[p*d+i+1] = float32(math.Sin(angle))
		}
	}
	return t
}

// Close stops the engine's worker goroutines. Prefill, Decode and Step
// return ErrClosed afterwards; the other methods keep working. Close is
// idempotent.
func (e *Engine) Close() {
	e.done = true
	e.pool.close()
}

// Spec returns the model's shape.
func (e *Engine) Spec() engine.ModelSpec { return e.spec }

// Tokenizer returns the byte-level tokenizer.
func (e *Engine) Tokenizer() engine.Tokenizer { return tokenizer.Bytes{} }

// Threads returns the number of goroutines sharing matrix work.
func (e *Engine) Threads() int { return e.pool.size }

// Prefill runs a batch of prompt chunks; see engine.Engine. A chunk must
// hold at least one token (ErrRange otherwise), and a chunk that continues
// a sequence needs every layer to hold the same number of tokens
// (ErrIncompleteKV). On error no sequence changes and sequences the call
// would have created do not exist. The returned slice belongs to the
// caller; Output.Logits and Output.AllLogits belong to the engine until
// its next call. An AllLogits item's rows are computed exactly as a Last
// row is, so row i equals, bit for bit, the Logits of a prefill of the
// prompt up to chunk token i.
func (e *Engine) Prefill(ctx context.Context, batch []engine.PrefillItem, onKV engine.KVFunc) ([]engine.Output, error) {
	out, _, err := e.Step(ctx, batch, nil, onKV)
	return out, err
}

// Decode runs one decode step; see engine.Engine. On error no sequence
// changes.
func (e *Engine) Decode(ctx context.Context, batch []engine.DecodeItem) ([]engine.Output, error) {
	_, out, err := e.Step(ctx, nil, batch, nil)
	return out, err
}

// Len returns the number of tokens whose KV every layer holds.
func (e *Engine) Len(seq engine.SeqID) (int, error) {
	st, ok := e.seqs[seq]
	if !ok {
		return 0, fmt.Errorf("ref: len of seq %d: %w", seq, engine.ErrUnknownSeq)
	}
	return minOf(st.lens), nil
}

func minOf(v []int) int {
	m := v[0]
	for _, x := range v[1:] {
		m = min(m, x)
	}
	return m
}

// kvElems is the number of K (or V) elements of one token in one layer.
func (e *Engine) kvElems() int { return e.spec.KVHeads * e.spec.HeadDim }

// ExportKV appends the canonical KV of layer for tokens [start, end) to
// dst. Errors: ErrUnknownSeq, ErrRange.
func (e *Engine) ExportKV(seq engine.SeqID, layer, start, end int, dst []byte) ([]byte, error) {
	st, ok := e.seqs[seq]
	if !ok {
		return dst, fmt.Errorf("ref: export seq %d: %w", seq, engine.ErrUnknownSeq)
	}
	if layer < 0 || layer >= e.spec.Layers || start < 0 || start > end || end > st.lens[layer] {
		return dst, fmt.Errorf("ref: export seq %d layer %d tokens [%d, %d) of %d layers: %w", seq, layer, start, end, e.spec.Layers, engine.ErrRange)
	}
	return st.appendCanonical(dst, layer, start, end, e.kvElems()), nil
}

// ImportKV writes canonical KV for one layer at token start, creating the
// sequence if needed. Errors: ErrRange (bad layer, start not the layer's
// length, data not whole tokens), ErrSeqTooLong. On error nothing changes.
func (e *Engine) ImportKV(seq engine.SeqID, layer, start int, data []byte) error {
	st, ok := e.seqs[seq]
	held := 0
	if ok && layer >= 0 && layer < len(st.lens) {
		held = st.lens[layer]
	}
	n, err := e.spec.CheckImport(layer, start, held, data)
	if err != nil {
		return fmt.Errorf("ref: import seq %d: %w", seq, err)
	}
	if !ok {
		st = e.newSeq(seq)
	}
	elems := e.kvElems()
	st.reserve(layer, start+n, elems, e.spec.MaxSeqLen)
	st.setCanonical(data, layer, start, n, elems)
	st.lens[layer] = start + n
	return nil
}

// Fork creates dst holding a copy of the KV of src's first n tokens; see
// engine.Forker. The two share nothing afterwards, and dst decodes exactly
// as a sequence prefilled with those n tokens would. Errors:
// ErrUnknownSeq (src), ErrDuplicateSeq (dst is live, or dst == src),
// ErrIncompleteKV (src's layers hold different token counts), ErrRange
// (n < 0 or n > Len(src)). On error nothing changes.
func (e *Engine) Fork(src, dst engine.SeqID, n int) error {
	st, ok := e.seqs[src]
	if !ok {
		return fmt.Errorf("ref: fork seq %d: %w", src, engine.ErrUnknownSeq)
	}
	if _, live := e.seqs[dst]; live {
		return fmt.Errorf("ref: fork seq %d into live seq %d: %w", src, dst, engine.ErrDuplicateSeq)
	}
	held, err := st.length()
	if err != nil {
		return fmt.Errorf("ref: fork seq %d: %w", src, err)
	}
	if n < 0 || n > held {
		return fmt.Errorf("ref: fork %d tokens of seq %d, which holds %d: %w", n, src, held, engine.ErrRange)
	}
	d := e.newSeq(dst)
	elems := e.kvElems()
	for l := range e.spec.Layers {
		d.reserve(l, n, elems, e.spec.MaxSeqLen)
		copy(d.k[l], st.k[l][:n*elems])
		copy(d.v[l], st.v[l][:n*elems])
		d.lens[l] = n
	}
	return nil
}

// Free drops a sequence; unknown sequences are ignored.
func (e *Engine) Free(seq engine.SeqID) {
	st, ok := e.seqs[seq]
	if !ok {
		return
	}
	delete(e.seqs, seq)
	e.recycle(st)
}

func (e *Engine) newSeq(id engine.SeqID) *seqState {
	var st *seqState
	if n := len(e.spare); n > 0 {
		st, e.spare = e.spare[n-1], e.spare[:n-1]
	} else {
		st = newSeqState(e.spec.Layers)
	}
	e.seqs[id] = st
	return st
}

func (e *Engine) recycle(st *seqState) {
	if len(e.spare) < maxSpare {
		st.reset()
		e.spare = append(e.spare, st)
	}
}
