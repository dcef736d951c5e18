package llamacpp

import (
	"context"
	"fmt"
	"slices"
	"unsafe"

	"github.com/pdserve/pdserve/pkg/engine"
)

// Prefill runs a batch of prompt chunks in as few llama_decode calls as
// the batch size allows. onKV receives each item's KV once per call that
// computed it: every layer of the tokens that call added (llama.cpp
// computes all layers in one call, so a chunk is the transfer unit).
func (e *Engine) Prefill(ctx context.Context, batch []engine.PrefillItem, onKV engine.KVFunc) ([]engine.Output, error) {
	p, _, err := e.Step(ctx, batch, nil, onKV)
	return p, err
}

// Decode runs one step for a batch of sequences in one llama_decode call.
func (e *Engine) Decode(ctx context.Context, batch []engine.DecodeItem) ([]engine.Output, error) {
	_, d, err := e.Step(ctx, nil, batch, nil)
	return d, err
}

// entry is one token of a step.
type entry struct {
	st  *seqState
	tok int32
	pos int
	out int // index into the outputs (prefill first, then decode), or -1
	row int // row of e.all its logits go to (AllLogits items), or -1
}

// Step runs prefill chunks and decode tokens together: one llama_decode
// call (or several, when the tokens exceed the batch size) carries both,
// as colocated serving needs. On error nothing advances; new sequences
// are dropped.
//
// A prefill item with AllLogits asks llama.cpp for the logits of every
// token of its chunk; they are copied, in chunk order, into one
// engine-owned buffer (so a chunk split over several llama_decode calls
// still returns all its rows), which Output.AllLogits (and that item's
// Output.Logits) point into until the next call.
func (e *Engine) Step(ctx context.Context, prefill []engine.PrefillItem, decode []engine.DecodeItem, onKV engine.KVFunc) (pOut, dOut []engine.Output, err error) {
	if len(prefill)+len(decode) == 0 {
		return nil, nil, nil
	}
	e.ct.do(func() { pOut, dOut, err = e.step(ctx, prefill, decode, onKV) })
	return pOut, dOut, err
}

func (e *Engine) step(ctx context.Context, prefill []engine.PrefillItem, decode []engine.DecodeItem, onKV engine.KVFunc) (pOut, dOut []engine.Output, err error) {
	if len(prefill)+len(decode) == 0 {
		return nil, nil, nil
	}
	if err := e.check(prefill, decode); err != nil {
		return nil, nil, err
	}
	defer e.refreshGauges()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	// New sequences take a slot; every touched sequence gets its staged KV
	// into llama.cpp first.
	var created []engine.SeqID
	fail := func(err error) ([]engine.Output, []engine.Output, error) {
		for _, id := range created {
			e.Free(id)
		}
		return nil, nil, err
	}
	seqOf := make([]*seqState, 0, len(prefill)+len(decode))
	for _, it := range prefill {
		st, ok := e.seqs[it.Seq]
		if !ok {
			if st, err = e.newSeq(it.Seq); err != nil {
				return fail(err)
			}
			created = append(created, it.Seq)
		}
		seqOf = append(seqOf, st)
	}
	for _, it := range decode {
		seqOf = append(seqOf, e.seqs[it.Seq])
	}
	for _, st := range seqOf {
		if err := e.materialize(st); err != nil {
			return fail(err)
		}
	}

	// Entries in item order: each prefill chunk's tokens, then the decode
	// tokens; outputs on Last chunks' final tokens and on every decode.
	nOut := len(prefill) + len(decode)
	outs := make([]engine.Output, nOut)
	var ents []entry
	start := make([]int, len(seqOf)) // each item's length before the step
	allRows := 0
	allAt := make([]int, len(prefill)) // each AllLogits item's first row of e.all
	for i, it := range prefill {
		st := seqOf[i]
		start[i] = st.inLlama
		allAt[i] = -1
		if it.AllLogits && len(it.Tokens) > 0 {
			allAt[i] = allRows
			allRows += len(it.Tokens)
		}
		for j, t := range it.Tokens {
			out, row := -1, -1
			if it.Last && j == len(it.Tokens)-1 {
				out = i
			}
			if allAt[i] >= 0 {
				row = allAt[i] + j
			}
			ents = append(ents, entry{st: st, tok: t, pos: st.inLlama + j, out: out, row: row})
		}
		outs[i] = engine.Output{Seq: it.Seq}
	}
	for i, it := range decode {
		st := seqOf[len(prefill)+i]
		start[len(prefill)+i] = st.inLlama
		ents = append(ents, entry{st: st, tok: it.Token, pos: st.inLlama, out: len(prefill) + i, row: -1})
		outs[len(prefill)+i] = engine.Output{Seq: it.Seq}
	}
	vocab := e.spec.Vocab
	if cap(e.all) < allRows*vocab {
		e.all = make([]float32, allRows*vocab)
	}
	e.all = e.all[:allRows*vocab]

	rollback := func(err error) ([]engine.Output, []engine.Output, error) {
		for i, st := range seqOf {
			e.a.memorySeqRm(e.mem, st.slot, int32(start[i]), -1)
			st.inLlama = start[i]
			for l := range st.lens {
				st.lens[l] = start[i]
			}
		}
		e.blobFor = nil
		return fail(err)
	}
	e.kept = e.kept[:0]
	keptAt := make(map[int]int) // output index → e.kept index
	logitsOf := make([]*float32, nOut)
	for lo := 0; lo < len(ents); lo += e.nBat {
		if err := ctx.Err(); err != nil {
			return rollback(err)
		}
		win := ents[lo:min(lo+e.nBat, len(ents))]
		for i, en := range win {
			e.bTok[i], e.bPos[i], e.bSeq[i] = en.tok, int32(en.pos), en.st.slot
			e.bOut[i] = 0
			if en.out >= 0 || en.row >= 0 {
				e.bOut[i] = 1
			}
		}
		rc := e.a.decode(e.ctx, e.batch(len(win)))
		keepAlive(e.bTok, e.bPos, e.bNSeq, e.bSeq, e.bSeqPtr, e.bOut)
		e.blobFor = nil
		if rc != 0 {
			if rc == 1 {
				return rollback(fmt.Errorf("llamacpp: step of %d tokens: %w (%d cells in use of %d)", len(win), ErrNoKVSpace, e.UsedCells(), e.CtxSize()))
			}
			return rollback(fmt.Errorf("llamacpp: llama_decode of %d tokens failed with %d", len(win), rc))
		}
		last := lo+len(win) >= len(ents)
		for i, en := range win {
			en.st.inLlama = en.pos + 1
			if en.out < 0 && en.row < 0 {
				continue
			}
			p := e.a.getLogitsIth(e.ctx, int32(i))
			if p == nil {
				return rollback(fmt.Errorf("llamacpp: no logits for batch entry %d", i))
			}
			if en.row >= 0 {
				// An AllLogits row; the item's sampled logits are its
				// last row (set below).
				copy(e.all[en.row*vocab:(en.row+1)*vocab], unsafe.Slice(p, vocab))
				continue
			}
			if last {
				logitsOf[en.out] = p
				continue
			}
			keptAt[en.out] = len(e.kept)
			e.kept = append(e.kept, slices.Clone(unsafe.Slice(p, e.spec.Vocab)))
		}
		if onKV != nil {
			if err := e.handOut(prefill, seqOf, win, onKV); err != nil {
				return rollback(err)
			}
		}
	}
	for i, st := range seqOf {
		for l := range st.lens {
			st.lens[l] = st.inLlama
		}
		o := &outs[i]
		if i < len(prefill) && allAt[i] >= 0 {
			lo, hi := allAt[i]*vocab, (allAt[i]+len(prefill[i].Tokens))*vocab
			o.AllLogits = e.all[lo:hi:hi]
		}
		switch k, ok := keptAt[i]; {
		case o.AllLogits != nil && prefill[i].Last:
			o.Logits = o.AllLogits[len(o.AllLogits)-vocab:]
		case ok:
			o.Logits = e.kept[k]
		case logitsOf[i] != nil:
			o.Logits = unsafe.Slice(logitsOf[i], vocab)
		default:
			continue
		}
		var s engine.Sampling
		if i < len(prefill) {
			s = prefill[i].Sampling
		} else {
			s = decode[i-len(prefill)].Sampling
		}
		o.Token = engine.Sample(o.Logits, s, st.inLlama, &e.scratch)
		o.Sampled = true
	}
	return outs[:len(prefill):len(prefill)], outs[len(prefill):], nil
}

// handOut gives onKV the KV that one llama_decode call added for each
// prefill item in win: every layer of its new token range.
func (e *Engine) handOut(prefill []engine.PrefillItem, seqOf []*seqState, win []entry, onKV engine.KVFunc) error {
	type span struct{ lo, hi int }
	spans := map[*seqState]*span{}
	for _, en := range win {
		sp, ok := spans[en.st]
		if !ok {
			sp = &span{lo: en.pos, hi: en.pos + 1}
			spans[en.st] = sp
		}
		sp.lo, sp.hi = min(sp.lo, en.pos), max(sp.hi, en.pos+1)
	}
	for i, it := range prefill {
		st := seqOf[i]
		sp, ok := spans[st]
		if !ok {
			continue
		}
		if e.noTransfer != nil {
			return e.noTransfer
		}
		if err := e.viewOf(st); err != nil {
			return err
		}
		for l := range e.spec.Layers {
			e.chunk = e.lo.appendRows(e.chunk[:0], e.blob, &e.v, l, sp.lo, sp.hi)
			if err := onKV(engine.KVChunk{Seq: it.Seq, Layer: l, Start: sp.lo, End: sp.hi, Data: e.chunk}); err != nil {
				return err
			}
		}
	}
	return nil
}

// check validates a step before anything runs.
func (e *Engine) check(prefill []engine.PrefillItem, decode []engine.DecodeItem) error {
	seen := make(map[engine.SeqID]bool, len(prefill)+len(decode))
	dup := func(id engine.SeqID) error {
		if seen[id] {
			return fmt.Errorf("llamacpp: seq %d: %w", id, engine.ErrDuplicateSeq)
		}
		seen[id] = true
		return nil
	}
	for _, it := range prefill {
		if err := dup(it.Seq); err != nil {
			return err
		}
		if err := e.checkTokens(it.Seq, it.Tokens); err != nil {
			return err
		}
		n := 0
		if st, ok := e.seqs[it.Seq]; ok {
			if !complete(st) {
				return fmt.Errorf("llamacpp: prefill seq %d: %w", it.Seq, engine.ErrIncompleteKV)
			}
			n = st.lens[0]
		}
		if n+len(it.Tokens) > e.spec.MaxSeqLen {
			return fmt.Errorf("llamacpp: prefill seq %d: %d tokens > max %d: %w", it.Seq, n+len(it.Tokens), e.spec.MaxSeqLen, engine.ErrSeqTooLong)
		}
	}
	for _, it := range decode {
		if err := dup(it.Seq); err != nil {
			return err
		}
		st, ok := e.seqs[it.Seq]
		if !ok {
			return fmt.Errorf("llamacpp: decode seq %d: %w", it.Seq, engine.ErrUnknownSeq)
		}
		if err := e.checkTokens(it.Seq, []int32{it.Token}); err != nil {
			return err
		}
		if !complete(st) {
			return fmt.Errorf("llamacpp: decode seq %d: %w", it.Seq, engine.ErrIncompleteKV)
		}
		if st.lens[0]+1 > e.spec.MaxSeqLen {
			return fmt.Errorf("llamacpp: decode seq %d: %d tokens > max %d: %w", it.Seq, st.lens[0]+1, e.spec.MaxSeqLen, engine.ErrSeqTooLong)
		}
	}
	return nil
}

func (e *Engine) checkTokens(id engine.SeqID, toks []int32) error {
	for _, t := range toks {
		if t < 0 || int(t) >= e.spec.Vocab {
			return fmt.Errorf("llamacpp: seq %d: token %d outside [0, %d): %w", id, t, e.spec.Vocab, engine.ErrBadToken)
		}
	}
	return nil
}

func complete(st *seqState) bool {
	for _, n := range st.lens[1:] {
		if n != st.lens[0] {
			return false
		}
	}
	return true
}

func (e *Engine) newSeq(id engine.SeqID) (*seqState, error) {
	if len(e.slots) == 0 {
		return nil, fmt.Errorf("llamacpp: seq %d: %w (%d in use)", id, ErrNoSlot, e.nSlot)
	}
	slot := e.slots[len(e.slots)-1]
	e.slots = e.slots[:len(e.slots)-1]
	st := &seqState{slot: slot, lens: make([]int, e.spec.Layers)}
	e.seqs[id] = st
	return st, nil
}

// materialize moves st's staged KV into llama.cpp: the sequence's whole
// state is rebuilt as one blob (what llama.cpp holds, then what is staged)
// and set in one llama_state_seq_set_data call.
func (e *Engine) materialize(st *seqState) error {
	if st.staged == nil {
		return nil
	}
	n := st.lens[0]
	layers := make([][]byte, e.spec.Layers)
	row := e.lo.kRow
	for l := range layers {
		var held []byte
		if st.inLlama > 0 {
			if err := e.viewOf(st); err != nil {
				return err
			}
			held = e.lo.appendRows(nil, e.blob, &e.v, l, 0, st.inLlama)
		}
		// Canonical chunks are K rows then V rows; a layer of n tokens is
		// all K rows, then all V rows.
		s := st.staged[l]
		k := len(s) / 2
		buf := make([]byte, 0, 2*n*row)
		buf = append(buf, held[:len(held)/2]...)
		buf = append(buf, s[:k]...)
		buf = append(buf, held[len(held)/2:]...)
		buf = append(buf, s[k:]...)
		layers[l] = buf
	}
	e.blob = e.lo.build(e.blob, st.slot, n, layers)
	e.blobFor = nil
	got := int(e.a.stateSeqSetData(e.ctx, e.blob, uintptr(len(e.blob)), st.slot))
	if got == 0 {
		return fmt.Errorf("llamacpp: import of %d tokens into slot %d: %w (%d cells in use of %d)", n, st.slot, ErrNoKVSpace, e.UsedCells(), e.CtxSize())
	}
	st.inLlama, st.staged = n, nil
	return nil
}

// Len returns the tokens the sequence holds: its shortest layer while an
// import is incomplete.
func (e *Engine) Len(seq engine.SeqID) (int, error) {
	st, ok := e.seqs[seq]
	if !ok {
		return 0, fmt.Errorf("llamacpp: len of seq %d: %w", seq, engine.ErrUnknownSeq)
	}
	return slices.Min(st.lens), nil
}

// ExportKV appends the canonical KV of layer for tokens [start, end).
func (e *Engine) ExportKV(seq engine.SeqID, layer, start, end int, dst []byte) ([]byte, error) {
	st, ok := e.seqs[seq]
	if !ok {
		return dst, fmt.Errorf("llamacpp: export seq %d: %w", seq, engine.ErrUnknownSeq)
	}
	if layer < 0 || layer >= e.spec.Layers || start < 0 || start > end || end > st.lens[layer] {
		return dst, fmt.Errorf("llamacpp: export seq %d layer %d [%d, %d) of %d tokens: %w", seq, layer, start, end, layerLen(st, layer), engine.ErrRange)
	}
	if e.noTransfer != nil {
		return dst, e.noTransfer
	}
	if err := e.materializeIfComplete(st); err != nil {
		return dst, err
	}
	row := e.lo.kRow
	// From llama.cpp: [start, min(end, inLlama)); from the staged bytes:
	// the rest. K rows of both, then V rows of both.
	hiL := min(end, st.inLlama)
	var held []byte
	if start < hiL {
		if err := e.viewOf(st); err != nil {
			return dst, err
		}
		held = e.lo.appendRows(e.chunk[:0], e.blob, &e.v, layer, start, hiL)
		e.chunk = held
	}
	var sk, sv []byte
	if end > st.inLlama {
		s := st.staged[layer]
		k := len(s) / 2
		lo := max(start, st.inLlama) - st.inLlama
		hi := end - st.inLlama
		sk, sv = s[lo*row:hi*row], s[k+lo*row:k+hi*row]
	}
	dst = append(dst, held[:len(held)/2]...)
	dst = append(dst, sk...)
	dst = append(dst, held[len(held)/2:]...)
	dst = append(dst, sv...)
	return dst, nil
}

func layerLen(st *seqState, layer int) int {
	if layer >= 0 && layer < len(st.lens) {
		return st.lens[layer]
	}
	return 0
}

// materializeIfComplete moves staged KV into llama.cpp when every layer is
// complete; an incomplete import stays staged.
func (e *Engine) materializeIfComplete(st *seqState) error {
	if st.staged == nil || !complete(st) {
		return nil
	}
	return e.materialize(st)
}

// ImportKV stages canonical KV for one layer at token start; the sequence
// enters llama.cpp when it next runs, once every layer holds the same
// tokens.
func (e *Engine) ImportKV(seq engine.SeqID, layer, start int, data []byte) error {
	st, ok := e.seqs[seq]
	held := 0
	if ok && layer >= 0 && layer < len(st.lens) {
		held = st.lens[layer]
	}
	n, err := e.spec.CheckImport(layer, start, held, data)
	if err != nil {
		return fmt.Errorf("llamacpp: import seq %d: %w", seq, err)
	}
	if e.noTransfer != nil {
		return e.noTransfer
	}
	if !ok {
		if st, err = e.newSeq(seq); err != nil {
			return err
		}
	}
	if st.staged == nil {
		st.staged = make([][]byte, e.spec.Layers)
	}
	// Staged layers keep all K rows first, then all V rows.
	half := len(data) / 2
	s := st.staged[layer]
	k := len(s) / 2
	merged := make([]byte, 0, len(s)+len(data))
	merged = append(merged, s[:k]...)
	merged = append(merged, data[:half]...)
	merged = append(merged, s[k:]...)
	merged = append(merged, data[half:]...)
	st.staged[layer] = merged
	st.lens[layer] = start + n
	e.seqsLive.Store(int64(len(e.seqs)))
	return nil
}

// Fork creates dst holding src's first n tokens, in a slot of its own
// (see engine.Forker). llama.cpp's unified cache shares the prefix's cells
// between the two sequences (llama_memory_seq_cp: no copy, no new cells);
// each sequence's later tokens get cells of their own, and freeing either
// leaves the other whole. Staged imported KV of src among its first n
// tokens enters llama.cpp first. Errors: engine.ErrUnknownSeq (src),
// engine.ErrDuplicateSeq (dst is live, or dst == src),
// engine.ErrIncompleteKV (src's layers hold different token counts),
// engine.ErrRange (n < 0 or n > Len(src)), ErrNoSlot (Options.MaxSeqs
// sequences are live: dst needs a slot like any sequence), ErrNoKVSpace
// (staged KV found no room). On error dst does not exist.
func (e *Engine) Fork(src, dst engine.SeqID, n int) error {
	st, ok := e.seqs[src]
	if !ok {
		return fmt.Errorf("llamacpp: fork seq %d: %w", src, engine.ErrUnknownSeq)
	}
	if _, live := e.seqs[dst]; live {
		return fmt.Errorf("llamacpp: fork seq %d into live seq %d: %w", src, dst, engine.ErrDuplicateSeq)
	}
	if !complete(st) {
		return fmt.Errorf("llamacpp: fork seq %d: %w", src, engine.ErrIncompleteKV)
	}
	if n < 0 || n > st.lens[0] {
		return fmt.Errorf("llamacpp: fork %d tokens of seq %d, which holds %d: %w", n, src, st.lens[0], engine.ErrRange)
	}
	if len(e.slots) == 0 {
		return fmt.Errorf("llamacpp: fork seq %d into seq %d: %w (%d in use)", src, dst, ErrNoSlot, e.nSlot)
	}
	if n > st.inLlama {
		if err := e.materialize(st); err != nil {
			return fmt.Errorf("llamacpp: fork seq %d: %w", src, err)
		}
	}
	d, err := e.newSeq(dst)
	if err != nil {
		return err
	}
	e.a.memorySeqCp(e.mem, st.slot, d.slot, 0, int32(n))
	d.inLlama = n
	for l := range d.lens {
		d.lens[l] = n
	}
	e.refreshGauges()
	return nil
}

// Free drops a sequence and its KV; unknown sequences are ignored.
func (e *Engine) Free(seq engine.SeqID) {
	st, ok := e.seqs[seq]
	if !ok {
		return
	}
	e.a.memorySeqRm(e.mem, st.slot, -1, -1)
	delete(e.seqs, seq)
	e.slots = append(e.slots, st.slot)
	if e.blobFor == st {
		e.blobFor = nil
	}
	e.refreshGauges()
}
