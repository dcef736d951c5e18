package llamacpp

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"unsafe"

	"github.com/pdserve/pdserve/pkg/engine"
)

// Options configure an Engine.
type Options struct {
	// LibDir is the directory of llama.cpp's shared libraries (see LibDir).
	LibDir string
	// Model is the GGUF file.
	Model string
	// GPULayers is the number of layers offloaded to GPUs (< 0: all). A
	// CPU-only llama.cpp ignores it.
	GPULayers int
	// CtxSize is the KV cache size in tokens (cells), shared by all
	// sequences; 0 means the model's training context. A sequence holds at
	// most min(CtxSize, training context) tokens.
	CtxSize int
	// Threads is llama.cpp's thread count for decode steps and prompt
	// batches; 0 means every CPU.
	Threads int
	// KVType is the KV cache element type: engine.F16 (the default, when
	// 0) or engine.Q8_0.
	KVType engine.DType
	// MaxSeqs is the number of sequences the engine holds at once; 0
	// means 64. llama.cpp allows at most 256.
	MaxSeqs int
	// BatchTokens is the largest number of tokens one llama_decode call
	// takes; larger steps are split. 0 means min(CtxSize, 2048).
	BatchTokens int
	// NoRepack: see LoadOptions.
	NoRepack bool
	// CPUVariant: see LoadOptions.
	CPUVariant string
	// Device: the device policy, see LoadOptions.
	Device string
}

// Errors of this engine beyond engine's own; match with errors.Is.
var (
	// ErrNoSlot: more live sequences than Options.MaxSeqs.
	ErrNoSlot = errors.New("llamacpp: no free sequence slot")
	// ErrNoKVSpace: llama.cpp found no room in its KV cache for a step.
	ErrNoKVSpace = errors.New("llamacpp: KV cache full")
	// ErrNoTransfer: the model's KV cache has a form the canonical layout
	// cannot carry (a sliding-window or recurrent cache, per-cell M-RoPE
	// positions, K and V rows of different sizes); it serves colocated
	// only.
	ErrNoTransfer = errors.New("llamacpp: this model's KV cannot be exported or imported")
)

// Engine runs a GGUF model on llama.cpp: one llama_context whose unified KV
// cache holds every sequence, many sequences per llama_decode call. It
// implements engine.Engine, engine.Stepper and engine.Forker; like every
// engine it is not safe for concurrent use (its Tokenizer is). Each live
// sequence, a fork included, takes one of Options.MaxSeqs slots.
//
// Flash attention is always on: it is what lets a q8_0 V cache exist, it
// is llama-server's CPU default, and it changes logits slightly, so one
// fixed setting keeps every worker of a deployment comparing like with
// like.
type Engine struct {
	a        *api
	model    *Model
	ownModel bool     // Close closes the model too
	ct       *cthread // the OS thread every llama_decode runs on
	ctx      uintptr  // *llama_context
	mem      uintptr  // llama_memory_t
	spec     engine.ModelSpec
	lo       layout
	nSlot    int
	nBat     int

	seqs  map[engine.SeqID]*seqState
	slots []int32 // free slots

	// llama_batch arrays, allocated once (nBat entries) and never moved.
	bTok    []int32
	bPos    []int32
	bNSeq   []int32
	bSeq    []int32
	bSeqPtr []uintptr
	bOut    []int8

	blob    []byte    // the last state blob read
	v       view      // its parse
	blobFor *seqState // the sequence e.blob/e.v describe; nil when stale
	chunk   []byte    // scratch for canonical chunks
	scratch engine.SampleScratch
	kept    [][]float32 // logits copied out of earlier llama_decode calls
	all     []float32   // AllLogits rows of the last step, Vocab per row

	noTransfer error // why KV cannot leave or enter, or nil

	cellsTotal int          // the context's KV cells
	cellsUsed  atomic.Int64 // UsedCells after the last change, for Collector
	seqsLive   atomic.Int64 // len(seqs) after the last change
}

var (
	_ engine.Engine  = (*Engine)(nil)
	_ engine.Stepper = (*Engine)(nil)
	_ engine.Forker  = (*Engine)(nil)
)

// seqState is one sequence. Tokens [0, inLlama) are in llama.cpp's cache;
// imported tokens [inLlama, lens[l]) of layer l wait in staged[l] until the
// sequence next runs (all layers complete) or is exported.
type seqState struct {
	slot    int32
	inLlama int
	lens    []int
	staged  [][]byte // nil when nothing is staged
}

// New loads the model and creates the engine. The caller must Close it.
func New(o Options) (*Engine, error) {
	m, err := LoadModel(o.Model, LoadOptions{LibDir: o.LibDir, GPULayers: o.GPULayers, NoRepack: o.NoRepack, CPUVariant: o.CPUVariant, Device: o.Device})
	if err != nil {
		return nil, err
	}
	e, err := NewOnModel(m, o)
	if err != nil {
		m.Close()
		return nil, err
	}
	e.ownModel = true
	return e, nil
}

// NewOnModel creates an engine on a loaded model, which engines may share
// (each has its own context and KV cache; the weights are loaded once).
// o.Model, o.LibDir, o.GPULayers, o.NoRepack, o.CPUVariant and o.Device are
// not used. Close the engine before
// the model.
func NewOnModel(m *Model, o Options) (*Engine, error) {
	a := m.api
	if o.KVType == 0 {
		o.KVType = engine.F16
	}
	kvType, err := ggmlKVType(o.KVType)
	if err != nil {
		return nil, err
	}
	if hd := headDim(m); o.KVType == engine.Q8_0 && hd%engine.Q80Block != 0 {
		return nil, fmt.Errorf("llamacpp: kv type q8_0 needs a head size that is a multiple of %d; %s has %d: use f16", engine.Q80Block, m.path, hd)
	}
	if o.MaxSeqs == 0 {
		o.MaxSeqs = 64
	}
	if o.MaxSeqs < 1 || o.MaxSeqs > 256 {
		return nil, fmt.Errorf("llamacpp: max seqs %d outside [1, 256]", o.MaxSeqs)
	}
	train := m.TrainContext()
	if o.CtxSize == 0 {
		o.CtxSize = train
	}
	if o.CtxSize < 1 {
		return nil, fmt.Errorf("llamacpp: ctx size %d must be positive", o.CtxSize)
	}
	if o.BatchTokens == 0 {
		o.BatchTokens = min(o.CtxSize, 2048)
	}
	if o.Threads == 0 {
		o.Threads = runtime.NumCPU()
	}
	p := a.contextDefaultParams()
	p.nCtx = uint32(o.CtxSize)
	p.nBatch = uint32(o.BatchTokens)
	p.nUBatch = uint32(min(o.BatchTokens, 512))
	p.nSeqMax = uint32(o.MaxSeqs)
	// llama.cpp reserves room for at least one output per sequence and
	// aborts when that exceeds its outputs per batch (n_batch by default).
	p.nOutputsMax = uint32(max(o.BatchTokens, o.MaxSeqs))
	p.nThreads, p.nThreadsBatch = int32(o.Threads), int32(o.Threads)
	p.flashAttnType = flashAttnEnabled
	p.typeK, p.typeV = kvType, kvType
	p.kvUnified = true
	p.noPerf = true
	ct := startCThread()
	var ctx uintptr
	ct.do(func() { ctx = a.initFromModel(m.ptr, p) })
	if ctx == 0 {
		ct.stop()
		return nil, fmt.Errorf("llamacpp: llama.cpp could not create a context (ctx size %d, %d sequences, kv %v) for %s; run with --log-level debug for its reason", o.CtxSize, o.MaxSeqs, o.KVType, m.path)
	}
	e := &Engine{a: a, model: m, ct: ct, ctx: ctx, mem: a.getMemory(ctx), nSlot: o.MaxSeqs, nBat: int(a.nBatch(ctx)), seqs: map[engine.SeqID]*seqState{}}
	for s := o.MaxSeqs - 1; s >= 0; s-- {
		e.slots = append(e.slots, int32(s))
	}
	e.bTok = make([]int32, e.nBat)
	e.bPos = make([]int32, e.nBat)
	e.bNSeq = make([]int32, e.nBat)
	e.bSeq = make([]int32, e.nBat)
	e.bSeqPtr = make([]uintptr, e.nBat)
	e.bOut = make([]int8, e.nBat)
	for i := range e.bSeqPtr {
		e.bNSeq[i] = 1
		e.bSeqPtr[i] = uintptr(unsafe.Pointer(&e.bSeq[i]))
	}
	var perr error
	ct.do(func() { perr = e.probe(o, min(o.CtxSize, train)) })
	if err := perr; err != nil {
		e.closeContext()
		return nil, err
	}
	e.cellsTotal = e.CtxSize()
	return e, nil
}

// probe runs one token, reads the state layout from its blob and fills the
// spec.
func (e *Engine) probe(o Options, maxSeq int) error {
	tok := e.model.tok
	first := max(tok.BOS(), 0)
	slot := int32(0)
	e.bTok[0], e.bPos[0], e.bSeq[0], e.bOut[0] = first, 0, slot, 0
	if rc := e.a.decode(e.ctx, e.batch(1)); rc != 0 {
		return fmt.Errorf("llamacpp: first decode of %s failed (llama_decode %d)", e.model.path, rc)
	}
	b, err := e.stateOf(slot)
	if err != nil {
		return err
	}
	lo, lerr := probeLayout(b)
	e.a.memorySeqRm(e.mem, slot, -1, -1)
	kvHeads := int(e.a.modelNHeadKV(e.model.ptr))
	headDim := headDim(e.model)
	layers := int(e.a.modelNLayer(e.model.ptr))
	if lerr == nil {
		vals := lo.kRow / 2
		if o.KVType == engine.Q8_0 {
			vals = lo.kRow / (2 + engine.Q80Block) * engine.Q80Block
		}
		switch {
		case lo.kRow != lo.vRow || kvHeads <= 0 || vals%kvHeads != 0:
			lerr = fmt.Errorf("K rows of %d bytes, V rows of %d, %d KV heads: the canonical layout needs K and V rows of one size", lo.kRow, lo.vRow, kvHeads)
		case lo.extBytes != 0:
			lerr = fmt.Errorf("the KV cache keeps %d more bytes per cell (M-RoPE positions, …) than the canonical layout carries", lo.extBytes)
		default:
			headDim, layers = vals/kvHeads, lo.nLayer
		}
	}
	if lerr != nil {
		// The model runs, but its KV cannot cross between engines (a
		// sliding-window or recurrent cache, extra per-cell state): it
		// serves colocated.
		e.noTransfer = fmt.Errorf("llamacpp: %s: %w: %v", e.model.path, ErrNoTransfer, lerr)
	}
	e.lo = lo
	arch := e.model.Arch()
	theta := 10000.0
	if s, ok := e.model.Meta(arch + ".rope.freq_base"); ok {
		if v, err := strconv.ParseFloat(s, 64); err == nil {
			theta = v
		}
	}
	ffn, _ := e.model.metaInt(arch + ".feed_forward_length")
	e.spec = engine.ModelSpec{
		Name: e.model.Name(), Layers: layers,
		Heads: int(e.a.modelNHead(e.model.ptr)), KVHeads: kvHeads, HeadDim: headDim,
		Hidden: int(e.a.modelNEmbd(e.model.ptr)), Intermediate: ffn, Vocab: tok.Vocab(),
		MaxSeqLen: maxSeq, RopeTheta: theta, KVDType: o.KVType, BOS: tok.BOS(), EOS: tok.EOS(),
	}
	if kvHeads > 0 && e.spec.Heads%kvHeads != 0 {
		e.spec.Heads = kvHeads // a spec the contract accepts; Heads is informational here
	}
	if err := e.spec.Validate(); err != nil {
		return fmt.Errorf("llamacpp: %s: %w", e.model.path, err)
	}
	if e.noTransfer == nil && e.spec.KVTokenBytes() != lo.kRow+lo.vRow {
		return fmt.Errorf("llamacpp: %s: KV token of %d bytes, spec says %d", e.model.path, lo.kRow+lo.vRow, e.spec.KVTokenBytes())
	}
	return nil
}

// Transferable returns nil when the engine's KV can be exported and
// imported, else an error wrapping ErrNoTransfer that says why: such a
// model serves colocated only.
func (e *Engine) Transferable() error { return e.noTransfer }

// Close frees the context and the model.
func (e *Engine) Close() {
	e.closeContext()
	if e.ownModel {
		e.model.Close()
		e.ownModel = false
	}
}

func (e *Engine) closeContext() {
	if e.ctx != 0 {
		e.ct.do(func() { e.a.free(e.ctx) })
		e.ctx = 0
		e.ct.stop()
	}
}

// Spec returns the model's shape. Layers counts the layers that hold KV.
func (e *Engine) Spec() engine.ModelSpec { return e.spec }

// Tokenizer returns the model's tokenizer (also an engine.ChatTemplater and
// engine.EOGTokenizer).
func (e *Engine) Tokenizer() engine.Tokenizer { return e.model.tok }

// Model returns the loaded model.
func (e *Engine) Model() *Model { return e.model }

// UsedCells returns the KV cells llama.cpp holds over all its sequence
// slots, as llama.cpp reports them (positions held per slot), whether or
// not the engine knows the slot as live: a leak shows here. A prefix
// shared by Fork counts once per sequence holding it, though its cells
// are stored once.
func (e *Engine) UsedCells() int {
	n := 0
	for s := range e.nSlot {
		hi := e.a.memorySeqPosMax(e.mem, int32(s))
		if hi < 0 {
			continue
		}
		lo := e.a.memorySeqPosMin(e.mem, int32(s))
		n += int(hi-lo) + 1
	}
	return n
}

// CtxSize returns the KV cache size in cells.
func (e *Engine) CtxSize() int { return int(e.a.nCtx(e.ctx)) }

func (e *Engine) batch(n int) batch {
	return batch{
		nTokens: int32(n),
		token:   uintptr(unsafe.Pointer(&e.bTok[0])),
		pos:     uintptr(unsafe.Pointer(&e.bPos[0])),
		nSeqID:  uintptr(unsafe.Pointer(&e.bNSeq[0])),
		seqID:   uintptr(unsafe.Pointer(&e.bSeqPtr[0])),
		logits:  uintptr(unsafe.Pointer(&e.bOut[0])),
	}
}

// stateOf returns the state blob of slot in e.blob (valid until the next
// call that uses e.blob).
func (e *Engine) stateOf(slot int32) ([]byte, error) {
	n := int(e.a.stateSeqGetSize(e.ctx, slot))
	if n == 0 {
		return nil, fmt.Errorf("llamacpp: state of slot %d: llama.cpp reports none", slot)
	}
	if cap(e.blob) < n {
		e.blob = make([]byte, n)
	}
	e.blob = e.blob[:n]
	if got := int(e.a.stateSeqGetData(e.ctx, e.blob, uintptr(n), slot)); got != n {
		return nil, fmt.Errorf("llamacpp: state of slot %d: %d of %d bytes", slot, got, n)
	}
	return e.blob, nil
}

// viewOf parses the llama.cpp-held part of st into e.blob/e.v, reusing
// them when still current.
func (e *Engine) viewOf(st *seqState) error {
	if e.blobFor == st {
		return nil
	}
	e.blobFor = nil
	b, err := e.stateOf(st.slot)
	if err != nil {
		return err
	}
	if err := e.lo.parse(b, st.inLlama, &e.v); err != nil {
		return fmt.Errorf("llamacpp: state of slot %d: %w", st.slot, err)
	}
	e.blobFor = st
	return nil
}

// KVCapacity returns the tokens the engine's KV cache holds and the
// sequences it holds at once: a worker's pool must fit in them.
func (e *Engine) KVCapacity() (tokens, seqs int) { return e.CtxSize(), e.nSlot }

// ggmlKVType maps a KV dtype to llama.cpp's cache type.
func ggmlKVType(d engine.DType) (int32, error) {
	switch d {
	case engine.F16:
		return ggmlTypeF16, nil
	case engine.Q8_0:
		return ggmlTypeQ8_0, nil
	}
	return 0, fmt.Errorf("llamacpp: kv type %v: want f16 or q8_0", d)
}

// headDim is the model's K head size: its key_length metadata, else
// embedding / heads.
func headDim(m *Model) int {
	if v, ok := m.metaInt(m.Arch() + ".attention.key_length"); ok {
		return v
	}
	if h := int(m.api.modelNHead(m.ptr)); h > 0 {
		return int(m.api.modelNEmbd(m.ptr)) / h
	}
	return 0
}
