package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pdserve/pdserve/pkg/sampling"
)

// DType names the element type of KV data.
type DType uint8

const (
	// BF16 is bfloat16, 2 bytes per element, little endian.
	BF16 DType = 1
	// F16 is IEEE 754 half precision, 2 bytes per element, little endian
	// (llama.cpp's default KV cache type).
	F16 DType = 2
	// Q8_0 is llama.cpp's block format: blocks of Q80Block values, each an
	// f16 scale followed by Q80Block int8 values (34 bytes per block). A
	// row of n values (n a multiple of Q80Block) is n/Q80Block blocks.
	Q8_0 DType = 3
)

// Q80Block is the number of values in one Q8_0 block.
const Q80Block = 32

// q80BlockBytes is the size of one Q8_0 block: an f16 scale and 32 int8s.
const q80BlockBytes = 2 + Q80Block

// String returns the lower-case dtype name.
func (d DType) String() string {
	switch d {
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	case Q8_0:
		return "q8_0"
	default:
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
}

// ParseDType returns the dtype named s ("bf16", "f16", "q8_0").
func ParseDType(s string) (DType, error) {
	for _, d := range []DType{BF16, F16, Q8_0} {
		if d.String() == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("engine: unknown dtype %q (want bf16, f16 or q8_0)", s)
}

// Size returns the size of one element in bytes for the element types (BF16,
// F16), and 0 for a block type (Q8_0) or an unknown dtype. Use RowBytes for
// the size of a row of any type.
func (d DType) Size() int {
	if d == BF16 || d == F16 {
		return 2
	}
	return 0
}

// Float reports whether d is a 2-byte float type whose values a
// float-aware codec (byte planes, fp8, int8) can read: BF16 or F16.
func (d DType) Float() bool { return d == BF16 || d == F16 }

// Valid reports whether d is a known dtype.
func (d DType) Valid() bool { return d == BF16 || d == F16 || d == Q8_0 }

// RowBytes returns the size of a row of n values, or 0 when d is unknown
// or n is not a whole number of d's blocks.
func (d DType) RowBytes(n int) int {
	switch {
	case d.Size() > 0:
		return n * d.Size()
	case d == Q8_0 && n%Q80Block == 0:
		return n / Q80Block * q80BlockBytes
	}
	return 0
}

// ModelSpec describes a decoder-only transformer's shape. All counts are > 0
// for a valid spec.
type ModelSpec struct {
	Name         string  // preset or model name, e.g. "tiny", "opt-13b"
	Layers       int     // transformer blocks
	Heads        int     // query heads
	KVHeads      int     // key/value heads (Heads must be a multiple)
	HeadDim      int     // elements per head
	Hidden       int     // model width
	Intermediate int     // MLP inner width
	Vocab        int     // vocabulary size
	MaxSeqLen    int     // longest sequence (prompt + output) in tokens
	RopeTheta    float64 // RoPE base
	KVDType      DType   // element type of stored KV
	BOS, EOS     int32   // special token ids (-1 when absent)
}

// Validate reports a descriptive error when the spec is not usable.
func (s ModelSpec) Validate() error {
	switch {
	case s.Layers <= 0, s.Heads <= 0, s.KVHeads <= 0, s.HeadDim <= 0, s.Hidden <= 0, s.Vocab <= 0, s.MaxSeqLen <= 0:
		return fmt.Errorf("engine: model spec %q: layers, heads, kv heads, head dim, hidden, vocab and max seq len must be positive", s.Name)
	case s.Heads%s.KVHeads != 0:
		return fmt.Errorf("engine: model spec %q: heads %d not a multiple of kv heads %d", s.Name, s.Heads, s.KVHeads)
	case s.KVDType.RowBytes(s.KVHeads*s.HeadDim) == 0:
		return fmt.Errorf("engine: model spec %q: kv dtype %v cannot hold rows of %d values", s.Name, s.KVDType, s.KVHeads*s.HeadDim)
	}
	return nil
}

// KVTokenBytes is the KV size of one token in one layer, K and V together:
// two rows of KVHeads × HeadDim values of KVDType.
func (s ModelSpec) KVTokenBytes() int { return 2 * s.KVDType.RowBytes(s.KVHeads*s.HeadDim) }

// KVBytesPerToken is the KV size of one token over all layers.
func (s ModelSpec) KVBytesPerToken() int { return s.Layers * s.KVTokenBytes() }

// KVChunkBytes is the byte length of the canonical KV of n tokens in one layer.
func (s ModelSpec) KVChunkBytes(n int) int { return n * s.KVTokenBytes() }

// CheckImport validates an ImportKV of data into layer at token start, the
// layer holding held tokens, and returns the number of tokens data
// carries. Errors as Engine.ImportKV documents: ErrRange (a layer out of
// range, data not whole tokens, start not held), ErrSeqTooLong.
func (s ModelSpec) CheckImport(layer, start, held int, data []byte) (int, error) {
	tb := s.KVTokenBytes()
	if layer < 0 || layer >= s.Layers || tb == 0 || len(data)%tb != 0 {
		return 0, fmt.Errorf("layer %d: %d bytes (tokens of %d bytes, %d layers): %w", layer, len(data), tb, s.Layers, ErrRange)
	}
	n := len(data) / tb
	if start != held {
		return 0, fmt.Errorf("layer %d at token %d: layer holds %d tokens: %w", layer, start, held, ErrRange)
	}
	if start+n > s.MaxSeqLen {
		return 0, fmt.Errorf("layer %d: %d tokens > max %d: %w", layer, start+n, s.MaxSeqLen, ErrSeqTooLong)
	}
	return n, nil
}

// SeqID identifies a sequence inside one engine. The caller chooses it; it
// must be unique among the engine's live sequences.
type SeqID uint64

// The sampling settings and log-probabilities engines take and return are
// package sampling's, so that the API's layers (frontend, wire) name them
// without this package.
type (
	// Sampling is sampling.Sampling: how the next token is chosen.
	Sampling = sampling.Sampling
	// Constraint is sampling.Constraint: a decoding constraint's
	// per-sequence state.
	Constraint = sampling.Constraint
	// Penalties is sampling.Penalties: OpenAI's repetition penalties.
	Penalties = sampling.Penalties
	// TokenLogprob is sampling.TokenLogprob: one token's log-probability
	// with its top alternatives.
	TokenLogprob = sampling.TokenLogprob
	// TokenProb is sampling.TokenProb: one alternative of a TokenLogprob.
	TokenProb = sampling.TokenProb
)

// MaxTopLogprobs is sampling.MaxTopLogprobs, the most alternatives a
// TokenLogprob carries.
const MaxTopLogprobs = sampling.MaxTopLogprobs

// LogitFree is implemented by engines that choose tokens without
// computing logits and cannot honour Sampling.Constraint: workers refuse
// a grammar on them. (The performance-model engine computes no logits
// but masks a stand-in for them, so it follows grammars.)
type LogitFree interface {
	LogitFree()
}

// GrammarState is one sequence's grammar (structured output): the
// Constraint its sampler masks with, advanced over every token the
// sequence emits. Not safe for concurrent use; Close frees what it holds
// (idempotent); the state is not used after it.
type GrammarState interface {
	Constraint
	// Accept advances the state over tokens, in order. An
	// end-of-generation id is accepted only when Complete. Errors wrap
	// grammar.ErrRejected; the state then stands after the tokens before
	// the refused one.
	Accept(tokens ...int32) error
	// Complete reports whether the root rule may end here.
	Complete() bool
	Close()
}

// GrammarSampler is implemented by engines whose library follows a GBNF
// grammar with a sampler of its own (llama.cpp's grammar sampler): workers
// take each sequence's GrammarState from it instead of pkg/grammar's Go
// mask. gbnf's start rule is "root"; errors name why the library refused
// it.
type GrammarSampler interface {
	NewGrammar(gbnf string) (GrammarState, error)
}

// PrefillItem is one sequence's share of a prefill batch: a chunk of prompt
// tokens appended at the sequence's current length. The first chunk of a new
// sequence creates it.
type PrefillItem struct {
	Seq      SeqID
	Tokens   []int32 // the chunk; read only during the call
	Sampling Sampling
	Last     bool // the chunk ends the prompt: sample a token after it
	// AllLogits asks for the logits of every position of the chunk in
	// Output.AllLogits (prompt logprobs, echo), not only the last.
	AllLogits bool
}

// DecodeItem is one sequence's share of a decode step: Token is appended at
// the sequence's current length and the next token is sampled.
type DecodeItem struct {
	Seq      SeqID
	Token    int32
	Sampling Sampling
}

// Output is the result of one batch item.
type Output struct {
	Seq     SeqID
	Token   int32 // the sampled token; valid when Sampled
	Sampled bool  // false for a prefill chunk that is not Last
	// Logits of the last position, Vocab values, or nil when the engine
	// does not compute them (performance-model engine). Owned by the
	// engine: valid until the next call on the engine.
	Logits []float32
	// AllLogits, for a PrefillItem with AllLogits set, holds one row of
	// Vocab logits per token of the chunk, in order (row i: the
	// distribution of the token after chunk token i); nil when the engine
	// does not compute logits. Owned by the engine like Logits.
	AllLogits []float32
}

// KVChunk is KV handed out during prefill: one layer of one sequence for
// the token range [Start, End).
type KVChunk struct {
	Seq        SeqID
	Layer      int
	Start, End int
	// Data is the canonical layout (see package doc). Owned by the engine
	// and valid only during the callback: copy or encode it before returning.
	Data []byte
	// FullBytes is the size this chunk stands for on a real deployment; 0
	// means len(Data). The performance-model engine may hand out a
	// scaled-down payload while FullBytes keeps the model's true size, so a
	// transfer paced by link bandwidth still takes the true time.
	FullBytes int
}

// Bytes returns FullBytes, or len(Data) when FullBytes is 0.
func (c KVChunk) Bytes() int {
	if c.FullBytes > 0 {
		return c.FullBytes
	}
	return len(c.Data)
}

// KVFunc receives KV as it is computed. It is called from the goroutine
// running Prefill; an error aborts the prefill and is returned by it.
type KVFunc func(KVChunk) error

// Engine runs a model over many sequences. Implementations are not safe for
// concurrent use: a worker calls one method at a time (its scheduler loop).
type Engine interface {
	// Spec returns the model's shape.
	Spec() ModelSpec

	// Tokenizer returns the engine's tokenizer.
	Tokenizer() Tokenizer

	// Prefill runs a batch of prompt chunks. onKV, when not nil, receives
	// every layer's KV of every item as soon as that layer is computed.
	// Returns one Output per item, in order. Errors: ErrSeqTooLong,
	// ErrBadToken, ErrDuplicateSeq (a seq listed twice), ctx errors, or
	// onKV's error. On error no sequence is advanced past its state before
	// the call, except that a new sequence may need Free.
	Prefill(ctx context.Context, batch []PrefillItem, onKV KVFunc) ([]Output, error)

	// Decode runs one step for a batch of existing sequences, which may have
	// different lengths. Errors: ErrUnknownSeq, ErrSeqTooLong, ErrBadToken,
	// ErrIncompleteKV, ErrDuplicateSeq, ctx errors.
	Decode(ctx context.Context, batch []DecodeItem) ([]Output, error)

	// Len returns the number of tokens whose KV the sequence holds.
	Len(seq SeqID) (int, error)

	// ExportKV appends the canonical KV of layer for tokens [start, end) to
	// dst and returns the extended slice. Errors: ErrUnknownSeq, ErrRange.
	ExportKV(seq SeqID, layer, start, end int, dst []byte) ([]byte, error)

	// ImportKV writes canonical KV for one layer starting at token start,
	// creating the sequence if needed. A sequence may be decoded once every
	// layer holds the same number of tokens. Errors: ErrRange (start is
	// not the layer's current length, or data is not a whole number of
	// tokens), ErrSeqTooLong.
	ImportKV(seq SeqID, layer, start int, data []byte) error

	// Free drops a sequence and its KV. Freeing an unknown sequence is a
	// no-op.
	Free(seq SeqID)
}

// HostLinked is implemented by engines that model the time of copying KV
// between host memory and the device instead of taking it (the
// performance-model engine): a worker that imported bytes of KV from its
// host-memory tier calls ChargeHostLoad, and the engine adds the modeled
// transfer time (bytes over its host link, the GPU's PCIe) to its next
// step. It returns that time as the engine will wait it out (after any
// time scaling), ≥ 0. bytes is the model's true size (ModelSpec
// KVBytesPerToken per token), ≥ 0.
type HostLinked interface {
	ChargeHostLoad(bytes int64) time.Duration
}

// Stepper is implemented by engines that cost a step carrying prefill
// chunks and decode tokens together as one step (colocated serving, where
// the interference between the two must show). Workers call RunStep, which
// uses Step when present and otherwise Prefill then Decode.
type Stepper interface {
	// Step runs prefill and decode items in one step. The sequences of the
	// two lists must be distinct. Errors as for Prefill and Decode.
	Step(ctx context.Context, prefill []PrefillItem, decode []DecodeItem, onKV KVFunc) (prefillOut, decodeOut []Output, err error)
}

// RunStep runs one step of prefill chunks and decode tokens on e, as one
// step when e implements Stepper. Either list may be empty. The outputs'
// logits are valid until the next call on e, as for Prefill and Decode.
func RunStep(ctx context.Context, e Engine, prefill []PrefillItem, decode []DecodeItem, onKV KVFunc) (prefillOut, decodeOut []Output, err error) {
	if s, ok := e.(Stepper); ok {
		return s.Step(ctx, prefill, decode, onKV)
	}
	if len(prefill) > 0 {
		if prefillOut, err = e.Prefill(ctx, prefill, onKV); err != nil {
			return nil, nil, err
		}
		if len(decode) > 0 {
			// Decode may reuse the buffers behind the prefill outputs'
			// logits: keep copies, owned by the caller.
			for i := range prefillOut {
				prefillOut[i].Logits = slices.Clone(prefillOut[i].Logits)
				prefillOut[i].AllLogits = slices.Clone(prefillOut[i].AllLogits)
			}
		}
	}
	if len(decode) > 0 {
		if decodeOut, err = e.Decode(ctx, decode); err != nil {
			return nil, nil, err
		}
	}
	return prefillOut, decodeOut, nil
}

// Forker is implemented by engines that can start a sequence from
// another's prefix without computing it again (parallel sampling, n > 1).
type Forker interface {
	// Fork creates sequence dst holding the KV of src's first n tokens;
	// src is unchanged and both may then be decoded independently. An
	// engine with a shared cache may share the prefix's storage.
	// Errors: ErrUnknownSeq (src), ErrDuplicateSeq (dst is live), ErrRange
	// (n < 0 or n > Len(src)), ErrIncompleteKV.
	Fork(src, dst SeqID, n int) error
}

// Tokenizer turns text into token ids and back.
type Tokenizer interface {
	Encode(text string) []int32
	// Decode returns the text of ids; invalid ids are skipped.
	Decode(ids []int32) string
	// DecodeToken returns the bytes of one token (byte-level tokenizers may
	// return part of a UTF-8 sequence).
	DecodeToken(id int32) []byte
	EOS() int32
	Vocab() int
}

// ChatMessage is one message of a chat, its content already flattened to
// text.
type ChatMessage struct {
	Role    string // system, developer, user, assistant or tool
	Content string
}

// ChatTemplater is implemented by tokenizers that carry a model's own chat
// template (llamacpp: the template in the GGUF metadata).
type ChatTemplater interface {
	// ApplyChatTemplate renders msgs as the model expects and opens the
	// assistant's reply. Errors: the template cannot render msgs.
	ApplyChatTemplate(msgs []ChatMessage) (string, error)
}

// EOGTokenizer is implemented by tokenizers whose models end generation on
// more tokens than EOS (llama.cpp's end-of-generation set: EOS, EOT,
// <|im_end|>, …).
type EOGTokenizer interface {
	// EOG returns every end-of-generation token id, EOS included. The
	// caller must not modify the slice.
	EOG() []int32
}

// EOGTokens returns tok's end-of-generation ids: EOG() when tok implements
// EOGTokenizer, else EOS alone (none when EOS is negative).
func EOGTokens(tok Tokenizer) []int32 {
	if t, ok := tok.(EOGTokenizer); ok {
		return t.EOG()
	}
	if eos := tok.EOS(); eos >= 0 {
		return []int32{eos}
	}
	return nil
}

// Errors returned by engines, wrapped with detail; match with errors.Is.
var (
	ErrUnknownSeq   = errors.New("engine: unknown sequence")
	ErrDuplicateSeq = errors.New("engine: sequence appears twice in a batch")
	ErrSeqTooLong   = errors.New("engine: sequence longer than the model's maximum")
	ErrBadToken     = errors.New("engine: token id out of vocabulary")
	ErrRange        = errors.New("engine: token range out of bounds")
	ErrIncompleteKV = errors.New("engine: layers hold different token counts")
)
