package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// Options configure a performance-model engine. The zero value of every
// field but Profile is usable.
type Options struct {
	// Profile names the GPU, model and TP degree to behave like: an
	// embedded profile ("a100-80g/opt-13b/tp1", see perfmodel.Names) or a
	// JSON profile file (a name ending in ".json"). Ignored when
	// ProfileData is set.
	Profile string
	// ProfileData, when not nil, is used instead of loading Profile. It
	// must be valid and is not modified; the engine keeps the pointer.
	ProfileData *perfmodel.Profile
	// TimeScale multiplies every modeled step time (and Pacer transfer
	// time) before the engine waits it out: 1 (the default for 0) runs in
	// real time, 0.1 ten times faster. Finite and > 0.
	TimeScale float64
	// PayloadScale is the fraction of the true KV bytes the engine hands
	// out, in (0, 1]; 0 means 1. Below 1, each token's K and V rows keep
	// only round(PayloadScale·KVHeads·HeadDim) values (a multiple of 8,
	// at least 8), KVChunk.Data shrinks accordingly and KVChunk.FullBytes
	// keeps the true size, so a transfer paced by FullBytes (see Pacer)
	// still takes the true time. ExportKV returns and ImportKV expects the
	// same scaled layout. Engines that exchange KV must use the same
	// PayloadScale, Profile and Seed.
	PayloadScale float64
	// KVChunkTokens caps the tokens of one KVChunk handed out during
	// prefill (longer chunks are split in order); 0 hands out each item's
	// whole chunk per layer. It bounds the engine's reusable KV buffer.
	KVChunkTokens int
	// Seed seeds the synthetic KV values (channel scales and the value
	// pattern). Generated tokens do not depend on it.
	Seed uint64
	// Clock returns the current time; nil means time.Now. Tests inject a
	// fake together with Sleep.
	Clock func() time.Time
	// Sleep waits for d or until ctx is done, returning ctx's error in
	// that case; nil means a timer. d may be ≤ 0 (return at once).
	Sleep func(ctx context.Context, d time.Duration) error
}

// Engine behaves, in step time and KV size, like the GPU and model of its
// profile. It implements engine.Engine and engine.Stepper. Like every
// engine it is not safe for concurrent use, except Stats, Profile,
// TimeScale, PayloadScale and NewPacer, which are.
//
// Memory: the engine never holds KV bytes it generated. Per sequence it
// keeps an 8-byte content key per token and a length per layer; exported
// KV is regenerated from the keys. Imported KV that is not what the engine
// would have generated (another engine's data, or a different Seed or
// PayloadScale) is kept verbatim, so that export returns it unchanged.
type Engine struct {
	prof      *perfmodel.Profile
	spec      engine.ModelSpec
	timeScale float64
	chunkToks int
	clock     func() time.Time
	sleep     func(context.Context, time.Duration) error
	gen       *kvgen
	payload   float64 // effective payload scale: rowElems / true row elements

	seqs    map[engine.SeqID]*seqState
	buf     []byte // reusable KV buffer for handing out, import checks and export
	pending []pendingItem
	// hostDebt is the modeled host-link time charged (ChargeHostLoad)
	// that the next step adds to its own.
	hostDebt time.Duration
	// spillBusy is when the device-to-host copies charged so far
	// (ChargeHostSpill) will have crossed the host link, on the engine's
	// clock: they queue on it, beside the steps.
	spillBusy time.Time

	statsMu sync.Mutex
	stats   Stats
	over    overruns // steps that fell behind the model (overrun.go)
}

var (
	_ engine.Engine  = (*Engine)(nil)
	_ engine.Stepper = (*Engine)(nil)
	_ engine.Forker  = (*Engine)(nil)

	_ engine.HostLinked = (*Engine)(nil)
)

// seqState is what the engine holds for one sequence.
type seqState struct {
	keys    []uint64 // content key per token, as many as the longest layer holds
	layers  []int    // tokens held per layer
	foreign [][]span // per layer, imported KV kept verbatim (nil: none)
}

// span is imported KV of tokens [start, end) in one layer, in the (scaled)
// canonical layout.
type span struct {
	start, end int
	data       []byte
}

// Stats are cumulative counters of an engine's steps.
type Stats struct {
	Steps   int64         // steps run (prefill, decode or mixed), failed ones excluded
	Modeled time.Duration // Σ modeled step time, before TimeScale
	Scaled  time.Duration // Σ modeled step time × TimeScale: the time the engine aimed to take
	// Overrun is Σ the time steps took beyond their scaled time: KV
	// generation or callbacks slower than the modeled GPU, or a late timer.
	Overrun time.Duration
	// HostLoad is Σ the modeled host-link time charged (ChargeHostLoad),
	// before TimeScale; the steps that carried it count it in Modeled too.
	HostLoad time.Duration
	// HostSpill is Σ the modeled device-to-host time of spills
	// (ChargeHostSpill), before TimeScale: DMA beside the steps, in no
	// step's time. HostSpillWait is the part of it loads waited for
	// (WaitHostSpill), before TimeScale, in the next step's Modeled.
	HostSpill, HostSpillWait time.Duration
}

// ErrOptions reports invalid Options (wrapped with detail).
var ErrOptions = errors.New("sim: invalid options")

// New returns an engine for opts. Errors: ErrOptions, or the profile's
// load error (perfmodel.ErrUnknownProfile, perfmodel.ErrInvalidProfile, a
// file error).
func New(opts Options) (*Engine, error) {
	prof := opts.ProfileData
	if prof == nil {
		var err error
		if prof, err = perfmodel.Resolve(opts.Profile); err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
	} else if err := prof.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	ts := opts.TimeScale
	if ts == 0 {
		ts = 1
	}
	if !(ts > 0) || math.IsInf(ts, 0) {
		return nil, fmt.Errorf("%w: time scale %v must be finite and > 0", ErrOptions, opts.TimeScale)
	}
	ps := opts.PayloadScale
	if ps == 0 {
		ps = 1
	}
	if !(ps > 0 && ps <= 1) {
		return nil, fmt.Errorf("%w: payload scale %v must lie in (0, 1]", ErrOptions, opts.PayloadScale)
	}
	if opts.KVChunkTokens < 0 {
		return nil, fmt.Errorf("%w: KV chunk tokens %d < 0", ErrOptions, opts.KVChunkTokens)
	}
	m := prof.Spec
	spec := engine.ModelSpec{
		Name: prof.Model, Layers: m.Layers, Heads: m.Heads, KVHeads: m.KVHeads, HeadDim: m.HeadDim,
		Hidden: m.Hidden, Intermediate: m.Intermediate, Vocab: tokenizer.Vocab, MaxSeqLen: m.MaxSeqLen,
		RopeTheta: m.RopeTheta, KVDType: engine.BF16, BOS: tokenizer.BOS, EOS: tokenizer.EOS,
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("sim: profile %s: %w", prof.Name, err)
	}
	full := m.KVHeads * m.HeadDim
	if full%segValues != 0 {
		return nil, fmt.Errorf("%w: profile %s: kv heads × head dim = %d is not a multiple of %d", ErrOptions, prof.Name, full, segValues)
	}
	rowElems := full
	if ps < 1 {
		rowElems = max(segValues, int(math.Round(ps*float64(full)/segValues))*segValues)
	}
	e := &Engine{
		prof: prof, spec: spec, timeScale: ts, chunkToks: opts.KVChunkTokens,
		clock: opts.Clock, sleep: opts.Sleep,
		gen:     sharedKVGen(m.Layers, rowElems, opts.Seed),
		payload: float64(rowElems) / float64(full),
		seqs:    make(map[engine.SeqID]*seqState),
	}
	if e.clock == nil {
		e.clock = time.Now
	}
	if e.sleep == nil {
		e.sleep = sleepCtx
	}
	return e, nil
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Spec returns the profile model's true shape (layers, KV heads, head dim:
// KVTokenBytes is the model's real per-layer KV size) with the byte-level
// tokenizer's vocabulary.
func (e *Engine) Spec() engine.ModelSpec { return e.spec }

// Tokenizer returns the byte-level tokenizer.
func (e *Engine) Tokenizer() engine.Tokenizer { return tokenizer.Bytes{} }

// KVPoolTokens returns the tokens of KV the modeled device holds beside
// the weights (the profile's MaxKVTokens): the memory a worker's live
// sequences and prefix cache share.
func (e *Engine) KVPoolTokens() int { return int(min(e.prof.MaxKVTokens(), math.MaxInt32)) }

// Profile returns the engine's profile; do not modify it.
func (e *Engine) Profile() *perfmodel.Profile { return e.prof }

// TimeScale returns the factor applied to every modeled duration.
func (e *Engine) TimeScale() float64 { return e.timeScale }

// PayloadScale returns the effective fraction of the true KV bytes handed
// out (the requested scale rounded to whole 8-value segments).
func (e *Engine) PayloadScale() float64 { return e.payload }

// KVTokenBytes returns the bytes one token occupies in one layer of the
// data this engine hands out, exports and imports: Spec().KVTokenBytes()
// at payload scale 1, less below.
func (e *Engine) KVTokenBytes() int { return e.gen.tokenBytes() }

// Stats returns the cumulative step counters.
func (e *Engine) Stats() Stats {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	return e.stats
}

// Prefill runs a batch of prompt chunks as one step of the modeled
// duration. With onKV set it hands out each layer's KV at the point of the
// step where the modeled GPU finishes that layer (layer l of L at
// (l+1)/L of the step), every item's chunk in batch order, so transfers
// overlap the step as on a GPU. Errors: as engine.Engine documents, plus
// engine.ErrRange for an empty chunk and engine.ErrIncompleteKV for a
// sequence whose layers hold different token counts. On error no sequence
// changes and no new sequence is created.
func (e *Engine) Prefill(ctx context.Context, batch []engine.PrefillItem, onKV engine.KVFunc) ([]engine.Output, error) {
	outs, _, err := e.step(ctx, batch, nil, onKV)
	return outs, err
}

// Decode runs one decode step of the modeled duration. Errors: as
// engine.Engine documents.
func (e *Engine) Decode(ctx context.Context, batch []engine.DecodeItem) ([]engine.Output, error) {
	_, outs, err := e.step(ctx, nil, batch, nil)
	return outs, err
}

// Step runs prefill chunks and decode tokens as one colocated step, costed
// by the profile as one mixed batch: the decode tokens wait for the
// chunks, which is the interference of colocated serving. KV is handed out
// as in Prefill. Errors: as Prefill and Decode.
func (e *Engine) Step(ctx context.Context, prefill []engine.PrefillItem, decode []engine.DecodeItem, onKV engine.KVFunc) (prefillOut, decodeOut []engine.Output, err error) {
	return e.step(ctx, prefill, decode, onKV)
}

// pendingItem is a prefill item's work, computed before the step runs and
// committed after it succeeds.
type pendingItem struct {
	st    *seqState // nil for a new sequence
	start int       // tokens held before the chunk
	keys  []uint64  // the chunk's content keys
}

func (e *Engine) step(ctx context.Context, prefill []engine.PrefillItem, decode []engine.DecodeItem, onKV engine.KVFunc) ([]engine.Output, []engine.Output, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("sim: step: %w", err)
	}
	if len(prefill) == 0 && len(decode) == 0 {
		return nil, nil, nil
	}
	if err := e.check(prefill, decode); err != nil {
		return nil, nil, err
	}

	// Keys of the new tokens, and the batch the profile costs.
	batch := perfmodel.Batch{
		Prefill:        make([]int, len(prefill)),
		PrefillContext: make([]int, len(prefill)),
		Decode:         make([]int, len(decode)),
	}
	e.pending = e.pending[:0]
	for i, it := range prefill {
		st := e.seqs[it.Seq]
		p := pendingItem{st: st}
		prev := uint64(rootKey)
		if st != nil {
			p.start = len(st.keys)
			if p.start > 0 {
				prev = st.keys[p.start-1]
			}
		}
		p.keys = appendKeys(nil, prev, it.Tokens)
		e.pending = append(e.pending, p)
		batch.Prefill[i], batch.PrefillContext[i] = len(it.Tokens), p.start
	}
	for i, it := range decode {
		batch.Decode[i] = len(e.seqs[it.Seq].keys) + 1
	}
	// A host-tier load charged since the last step goes first: the
	// copy over the host link precedes the compute that reads it.
	modeled := e.prof.StepTime(batch) + e.hostDebt
	e.hostDebt = 0
	scaled := time.Duration(float64(modeled) * e.timeScale)

	t0 := e.clock()
	if onKV != nil && len(prefill) > 0 {
		layers := e.spec.Layers
		for l := range layers {
			at := time.Duration(int64(scaled) * int64(l+1) / int64(layers))
			if err := e.sleep(ctx, at-e.clock().Sub(t0)); err != nil {
				return nil, nil, fmt.Errorf("sim: step: %w", err)
			}
			for i, it := range prefill {
				if err := e.handOut(it.Seq, l, e.pending[i], onKV); err != nil {
					return nil, nil, err
				}
			}
			if err := ctx.Err(); err != nil {
				return nil, nil, fmt.Errorf("sim: step: %w", err)
			}
		}
	} else if err := e.sleep(ctx, scaled-e.clock().Sub(t0)); err != nil {
		return nil, nil, fmt.Errorf("sim: step: %w", err)
	}
	took := e.clock().Sub(t0)
	e.noteStep(t0.Add(took), modeled, scaled, took)

	// Commit.
	var pOut, dOut []engine.Output
	if len(prefill) > 0 {
		pOut = make([]engine.Output, len(prefill))
	}
	for i, it := range prefill {
		p := e.pending[i]
		st := p.st
		if st == nil {
			st = &seqState{layers: make([]int, e.spec.Layers)}
			e.seqs[it.Seq] = st
		}
		st.keys = append(st.keys, p.keys...)
		for l := range st.layers {
			st.layers[l] = len(st.keys)
		}
		pOut[i] = engine.Output{Seq: it.Seq}
		if it.Last {
			pOut[i].Token, pOut[i].Sampled = sampleToken(st.keys[len(st.keys)-1], len(st.keys), it.Sampling, e.spec.Vocab), true
		}
		e.pending[i] = pendingItem{}
	}
	if len(decode) > 0 {
		dOut = make([]engine.Output, len(decode))
	}
	for i, it := range decode {
		st := e.seqs[it.Seq]
		prev := uint64(rootKey)
		if len(st.keys) > 0 {
			prev = st.keys[len(st.keys)-1]
		}
		st.keys = append(st.keys, nextKey(prev, it.Token))
		for l := range st.layers {
			st.layers[l]++
		}
		dOut[i] = engine.Output{Seq: it.Seq, Token: sampleToken(st.keys[len(st.keys)-1], len(st.keys), it.Sampling, e.spec.Vocab), Sampled: true}
	}

	e.statsMu.Lock()
	e.stats.Steps++
	e.stats.Modeled += modeled
	e.stats.Scaled += scaled
	e.stats.Overrun += max(took-scaled, 0)
	e.statsMu.Unlock()
	return pOut, dOut, nil
}

// check validates a step's items before anything changes.
func (e *Engine) check(prefill []engine.PrefillItem, decode []engine.DecodeItem) error {
	seen := make(map[engine.SeqID]struct{}, len(prefill)+len(decode))
	dup := func(id engine.SeqID) error {
		if _, ok := seen[id]; ok {
			return fmt.Errorf("sim: seq %d: %w", id, engine.ErrDuplicateSeq)
		}
		seen[id] = struct{}{}
		return nil
	}
	for _, it := range prefill {
		if err := dup(it.Seq); err != nil {
			return err
		}
		if len(it.Tokens) == 0 {
			return fmt.Errorf("sim: seq %d: empty prefill chunk: %w", it.Seq, engine.ErrRange)
		}
		for _, id := range it.Tokens {
			if id < 0 || int(id) >= e.spec.Vocab {
				return fmt.Errorf("sim: seq %d: token %d outside [0, %d): %w", it.Seq, id, e.spec.Vocab, engine.ErrBadToken)
			}
		}
		held := 0
		if st := e.seqs[it.Seq]; st != nil {
			if !st.complete() {
				return fmt.Errorf("sim: seq %d: %w", it.Seq, engine.ErrIncompleteKV)
			}
			held = len(st.keys)
		}
		if held+len(it.Tokens) > e.spec.MaxSeqLen {
			return fmt.Errorf("sim: seq %d: %d + %d tokens > %d: %w", it.Seq, held, len(it.Tokens), e.spec.MaxSeqLen, engine.ErrSeqTooLong)
		}
	}
	for _, it := range decode {
		if err := dup(it.Seq); err != nil {
			return err
		}
		st := e.seqs[it.Seq]
		if st == nil {
			return fmt.Errorf("sim: seq %d: %w", it.Seq, engine.ErrUnknownSeq)
		}
		if it.Token < 0 || int(it.Token) >= e.spec.Vocab {
			return fmt.Errorf("sim: seq %d: token %d outside [0, %d): %w", it.Seq, it.Token, e.spec.Vocab, engine.ErrBadToken)
		}
		if !st.complete() {
			return fmt.Errorf("sim: seq %d: %w", it.Seq, engine.ErrIncompleteKV)
		}
		if len(st.keys)+1 > e.spec.MaxSeqLen {
			return fmt.Errorf("sim: seq %d: %d + 1 tokens > %d: %w", it.Seq, len(st.keys), e.spec.MaxSeqLen, engine.ErrSeqTooLong)
		}
	}
	return nil
}

// complete reports whether every layer holds every keyed token.
func (st *seqState) complete() bool {
	for _, n := range st.layers {
		if n != len(st.keys) {
			return false
		}
	}
	return true
}

// handOut generates one layer of a pending item's chunk and passes it to
// onKV, split into KVChunkTokens pieces when set.
func (e *Engine) handOut(seq engine.SeqID, layer int, p pendingItem, onKV engine.KVFunc) error {
	step := len(p.keys)
	if e.chunkToks > 0 {
		step = e.chunkToks
	}
	for off := 0; off < len(p.keys); off += step {
		keys := p.keys[off:min(off+step, len(p.keys))]
		data := e.grow(len(keys) * e.gen.tokenBytes())
		e.gen.fill(data, keys, layer)
		c := engine.KVChunk{
			Seq: seq, Layer: layer, Start: p.start + off, End: p.start + off + len(keys),
			Data: data, FullBytes: e.spec.KVChunkBytes(len(keys)),
		}
		if err := onKV(c); err != nil {
			return fmt.Errorf("sim: KV of seq %d layer %d [%d, %d): %w", seq, layer, c.Start, c.End, err)
		}
	}
	return nil
}

// grow returns e.buf resized to n bytes.
func (e *Engine) grow(n int) []byte {
	if cap(e.buf) < n {
		e.buf = make([]byte, n)
	}
	e.buf = e.buf[:n]
	return e.buf
}

// Len returns the tokens every layer of seq holds (the smallest layer).
// Errors: engine.ErrUnknownSeq.
func (e *Engine) Len(seq engine.SeqID) (int, error) {
	st := e.seqs[seq]
	if st == nil {
		return 0, fmt.Errorf("sim: seq %d: %w", seq, engine.ErrUnknownSeq)
	}
	n := len(st.keys)
	for _, l := range st.layers {
		n = min(n, l)
	}
	return n, nil
}

// ExportKV appends the KV of layer for tokens [start, end) to dst: the
// canonical layout at payload scale 1, and the same layout with
// KVTokenBytes per token (rows of fewer values) below. The bytes are those
// handed out during prefill, or imported. Errors: engine.ErrUnknownSeq,
// engine.ErrRange.
func (e *Engine) ExportKV(seq engine.SeqID, layer, start, end int, dst []byte) ([]byte, error) {
	st := e.seqs[seq]
	if st == nil {
		return dst, fmt.Errorf("sim: export seq %d: %w", seq, engine.ErrUnknownSeq)
	}
	if layer < 0 || layer >= e.spec.Layers || start < 0 || end < start || end > st.layers[layer] {
		return dst, fmt.Errorf("sim: export seq %d layer %d [%d, %d) of %d tokens: %w", seq, layer, start, end, lenAt(st, layer), engine.ErrRange)
	}
	n := end - start
	off := len(dst)
	dst = slices.Grow(dst, n*e.gen.tokenBytes())[:off+n*e.gen.tokenBytes()]
	out := dst[off:]
	e.gen.fill(out, st.keys[start:end], layer)
	if st.foreign != nil {
		for _, sp := range st.foreign[layer] {
			lo, hi := max(sp.start, start), min(sp.end, end)
			if lo < hi {
				e.copyTokens(out, n, lo-start, sp.data, sp.end-sp.start, lo-sp.start, hi-lo)
			}
		}
	}
	return dst, nil
}

func lenAt(st *seqState, layer int) int {
	if layer < 0 || layer >= len(st.layers) {
		return -1
	}
	return st.layers[layer]
}

// copyTokens copies count tokens from src (a layer slice of srcN tokens,
// starting at token srcAt) into dst (dstN tokens, at dstAt), K and V rows
// both.
func (e *Engine) copyTokens(dst []byte, dstN, dstAt int, src []byte, srcN, srcAt, count int) {
	row := e.gen.tokenBytes() / 2
	copy(dst[dstAt*row:(dstAt+count)*row], src[srcAt*row:])
	copy(dst[(dstN+dstAt)*row:(dstN+dstAt+count)*row], src[(srcN+srcAt)*row:])
}

// ImportKV appends KV of one layer at token start (the layer's current
// length), creating the sequence if needed. data is in the layout ExportKV
// returns (KVTokenBytes per token). The content keys it carries become the
// sequence's (where another layer has not set them already); data that
// differs from what the engine would generate for them is kept verbatim.
// Errors: engine.ErrRange (bad layer, start not the layer's length, a
// partial token), engine.ErrSeqTooLong. On error nothing changes.
func (e *Engine) ImportKV(seq engine.SeqID, layer, start int, data []byte) error {
	tb := e.gen.tokenBytes()
	if layer < 0 || layer >= e.spec.Layers {
		return fmt.Errorf("sim: import seq %d: layer %d outside [0, %d): %w", seq, layer, e.spec.Layers, engine.ErrRange)
	}
	if len(data)%tb != 0 {
		return fmt.Errorf("sim: import seq %d layer %d: %d bytes is not a whole number of %d-byte tokens: %w", seq, layer, len(data), tb, engine.ErrRange)
	}
	st := e.seqs[seq]
	held := 0
	if st != nil {
		held = st.layers[layer]
	}
	if start != held {
		return fmt.Errorf("sim: import seq %d layer %d at token %d, layer holds %d: %w", seq, layer, start, held, engine.ErrRange)
	}
	n := len(data) / tb
	if start+n > e.spec.MaxSeqLen {
		return fmt.Errorf("sim: import seq %d layer %d: %d + %d tokens > %d: %w", seq, layer, start, n, e.spec.MaxSeqLen, engine.ErrSeqTooLong)
	}
	if st == nil {
		st = &seqState{layers: make([]int, e.spec.Layers)}
		e.seqs[seq] = st
	}
	row := tb / 2
	for i := range n {
		key := extractKey(data[i*row:])
		if t := start + i; t == len(st.keys) {
			st.keys = append(st.keys, key)
		}
	}
	st.layers[layer] = start + n
	if n == 0 {
		return nil
	}
	want := e.grow(len(data))
	e.gen.fill(want, st.keys[start:start+n], layer)
	if !bytes.Equal(want, data) {
		if st.foreign == nil {
			st.foreign = make([][]span, e.spec.Layers)
		}
		st.foreign[layer] = append(st.foreign[layer], span{start: start, end: start + n, data: bytes.Clone(data)})
	}
	return nil
}

// Fork creates dst holding src's first n tokens (their content keys, and
// the imported KV kept verbatim among them); see engine.Forker. It takes
// no modeled time: a real engine shares or copies the prefix's cache
// blocks. Errors: engine.ErrUnknownSeq (src), engine.ErrDuplicateSeq (dst
// is live, or dst == src), engine.ErrIncompleteKV, engine.ErrRange (n < 0
// or n > Len(src)). On error nothing changes.
func (e *Engine) Fork(src, dst engine.SeqID, n int) error {
	st := e.seqs[src]
	if st == nil {
		return fmt.Errorf("sim: fork seq %d: %w", src, engine.ErrUnknownSeq)
	}
	if e.seqs[dst] != nil {
		return fmt.Errorf("sim: fork seq %d into live seq %d: %w", src, dst, engine.ErrDuplicateSeq)
	}
	if !st.complete() {
		return fmt.Errorf("sim: fork seq %d: %w", src, engine.ErrIncompleteKV)
	}
	if n < 0 || n > len(st.keys) {
		return fmt.Errorf("sim: fork %d tokens of seq %d, which holds %d: %w", n, src, len(st.keys), engine.ErrRange)
	}
	d := &seqState{keys: slices.Clone(st.keys[:n:n]), layers: make([]int, e.spec.Layers), foreign: e.clipForeign(st.foreign, n)}
	for l := range d.layers {
		d.layers[l] = n
	}
	e.seqs[dst] = d
	return nil
}

// ChargeHostLoad adds the modeled time of bytes of KV crossing the host
// link (the profile's HostLinkBytesPerSec, PCIe) to the next step, and
// returns it scaled by TimeScale: a worker's host tier loaded them with
// ImportKV, which itself takes no modeled time. Negative bytes charge
// nothing. See engine.HostLinked.
func (e *Engine) ChargeHostLoad(bytes int64) time.Duration {
	if bytes <= 0 {
		return 0
	}
	d := time.Duration(float64(bytes) / e.prof.HostLinkBytesPerSec() * float64(time.Second))
	e.hostDebt += d
	e.statsMu.Lock()
	e.stats.HostLoad += d
	e.statsMu.Unlock()
	return time.Duration(float64(d) * e.timeScale)
}

// Free drops a sequence; unknown sequences are ignored.
func (e *Engine) Free(seq engine.SeqID) { delete(e.seqs, seq) }
