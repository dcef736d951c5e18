package ref

import (
	"context"
	"fmt"

	"github.com/pdserve/pdserve/pkg/engine"
)

// rmsEps is the RMSNorm epsilon.
const rmsEps = 1e-5

// segment is one batch item's rows in the activation matrices.
type segment struct {
	id       engine.SeqID
	seq      *seqState // nil until a new sequence is created
	pos0     int       // tokens the sequence held before the call
	row0, n  int       // its rows [row0, row0+n): one per new token
	sample   bool      // sample a token after the last row
	all      bool      // return the logits of every row (PrefillItem.AllLogits)
	kv       bool      // hand the new KV to onKV (prefill items)
	sampling engine.Sampling
	// Rows attention and the MLP still work on: all n rows, except in the
	// last layer, where only the rows whose logits are wanted are kept.
	arow0, arows, apos0 int
}

// Step runs prefill chunks and decode tokens as one batch: their rows go
// through every matrix product together, so the weights are read once per
// step. See engine.Stepper; the sequences of the two lists must be
// distinct (ErrDuplicateSeq). On error no sequence changes.
func (e *Engine) Step(ctx context.Context, prefill []engine.PrefillItem, decode []engine.DecodeItem, onKV engine.KVFunc) (prefillOut, decodeOut []engine.Output, err error) {
	if e.done {
		return nil, nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if len(prefill)+len(decode) == 0 {
		return nil, nil, nil
	}
	rows, err := e.plan(prefill, decode)
	if err != nil {
		return nil, nil, err
	}
	e.begin(rows)
	if err := e.forward(ctx, rows, onKV); err != nil {
		e.rollback()
		return nil, nil, err
	}
	prefillOut, decodeOut = e.outputs(len(prefill), len(decode))
	return prefillOut, decodeOut, nil
}

// plan validates the batch and fills e.segs and e.tokens without changing
// any sequence. It returns the number of rows.
func (e *Engine) plan(prefill []engine.PrefillItem, decode []engine.DecodeItem) (int, error) {
	clear(e.seen)
	e.segs = e.segs[:0]
	e.tokens = e.tokens[:0]
	for _, it := range prefill {
		if err := e.checkItem(it.Seq, it.Tokens, false); err != nil {
			return 0, fmt.Errorf("ref: prefill: %w", err)
		}
		e.addSegment(it.Seq, it.Tokens, it.Last, it.AllLogits, true, it.Sampling)
	}
	for _, it := range decode {
		tok := [1]int32{it.Token}
		if err := e.checkItem(it.Seq, tok[:], true); err != nil {
			return 0, fmt.Errorf("ref: decode: %w", err)
		}
		e.addSegment(it.Seq, tok[:], true, false, false, it.Sampling)
	}
	return len(e.tokens), nil
}

// addSegment appends a checked item's segment and tokens.
func (e *Engine) addSegment(id engine.SeqID, tokens []int32, sample, all, kv bool, sampling engine.Sampling) {
	s := segment{id: id, row0: len(e.tokens), n: len(tokens), sample: sample, all: all, kv: kv, sampling: sampling}
	if st, ok := e.seqs[id]; ok {
		s.seq, s.pos0 = st, st.lens[0]
	}
	s.arow0, s.arows, s.apos0 = s.row0, s.n, s.pos0
	e.segs = append(e.segs, s)
	e.tokens = append(e.tokens, tokens...)
}

// checkItem validates one item: a sequence listed once, a non-empty chunk
// of valid tokens, an existing sequence (decode) whose layers agree, room
// under MaxSeqLen.
func (e *Engine) checkItem(id engine.SeqID, tokens []int32, mustExist bool) error {
	if _, dup := e.seen[id]; dup {
		return fmt.Errorf("seq %d: %w", id, engine.ErrDuplicateSeq)
	}
	e.seen[id] = struct{}{}
	if len(tokens) == 0 {
		return fmt.Errorf("seq %d: empty chunk: %w", id, engine.ErrRange)
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= e.spec.Vocab {
			return fmt.Errorf("seq %d: token %d at %d outside [0, %d): %w", id, t, i, e.spec.Vocab, engine.ErrBadToken)
		}
	}
	cur := 0
	if st, ok := e.seqs[id]; ok {
		n, err := st.length()
		if err != nil {
			return fmt.Errorf("seq %d: %w", id, err)
		}
		cur = n
	} else if mustExist {
		return fmt.Errorf("seq %d: %w", id, engine.ErrUnknownSeq)
	}
	if cur+len(tokens) > e.spec.MaxSeqLen {
		return fmt.Errorf("seq %d: %d + %d tokens > max %d: %w", id, cur, len(tokens), e.spec.MaxSeqLen, engine.ErrSeqTooLong)
	}
	return nil
}

// begin creates the batch's new sequences, reserves KV room for its
// tokens and grows the activation scratch to rows.
func (e *Engine) begin(rows int) {
	e.created = e.created[:0]
	elems := e.kvElems()
	for i := range e.segs {
		s := &e.segs[i]
		if s.seq == nil {
			s.seq = e.newSeq(s.id)
			e.created = append(e.created, s.id)
		}
		for l := range e.spec.Layers {
			s.seq.reserve(l, s.pos0+s.n, elems, e.spec.MaxSeqLen)
		}
	}
	sp := e.spec
	e.x = grow(e.x, rows*sp.Hidden)
	e.xn = grow(e.xn, rows*sp.Hidden)
	e.qkv = grow(e.qkv, rows*(sp.Heads+2*sp.KVHeads)*sp.HeadDim)
	e.att = grow(e.att, rows*sp.Heads*sp.HeadDim)
	e.gu = grow(e.gu, rows*2*sp.Intermediate)
	e.hid = grow(e.hid, rows*sp.Intermediate)
}

// rollback undoes begin and forward after an error: every sequence is
// back at its length before the call and new ones are gone.
func (e *Engine) rollback() {
	for _, s := range e.segs {
		for l := range s.seq.lens {
			s.seq.lens[l] = s.pos0
		}
	}
	for _, id := range e.created {
		e.Free(id)
	}
	e.created = e.created[:0]
}

// forward runs the batch through the model: it stores every layer's KV,
// hands prefill KV to onKV, and leaves the logits of the kept rows (see
// keepOutputRows) in e.logits, in segment order.
func (e *Engine) forward(ctx context.Context, rows int, onKV engine.KVFunc) error {
	sp := e.spec
	h := sp.Hidden
	for r, t := range e.tokens[:rows] {
		copy(e.x[r*h:(r+1)*h], e.w.embed[int(t)*h:])
	}
	for l := range sp.Layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		lw := &e.w.layers[l]
		e.rows(rows, opAttnNorm, lw)
		e.matmul(e.qkv, e.qkvDim(), e.xn, h, rows, lw.qkv, false)
		e.storeKV(l)
		if onKV != nil {
			if err := e.sendKV(l, onKV); err != nil {
				return err
			}
		}
		if l == sp.Layers-1 {
			// Only rows with wanted logits matter past the last
			// layer's KV.
			rows = e.keepOutputRows()
			if rows == 0 {
				return nil
			}
		}
		e.attention(l)
		e.matmul(e.x, h, e.att, sp.Heads*sp.HeadDim, rows, lw.o, true)
		e.rows(rows, opMLPNorm, lw)
		e.matmul(e.gu, 2*sp.Intermediate, e.xn, h, rows, lw.gateUp, false)
		e.rows(rows, opSwiGLU, lw)
		e.matmul(e.x, h, e.hid, sp.Intermediate, rows, lw.down, true)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	e.rows(rows, opFinalNorm, nil)
	e.logits = grow(e.logits, rows*sp.Vocab)
	e.matmul(e.logits, sp.Vocab, e.xn, h, rows, e.w.head, false)
	return nil
}

func (e *Engine) qkvDim() int { return (e.spec.Heads + 2*e.spec.KVHeads) * e.spec.HeadDim }

// storeKV rotates q and k of every row by its position and writes k and v,
// rounded to bf16, into the sequences' caches at layer l. Attention then
// reads only the rounded values, so a sequence whose KV was imported
// computes exactly what its exporter would.
func (e *Engine) storeKV(l int) {
	sp := e.spec
	d, qd, elems := sp.HeadDim, sp.Heads*sp.HeadDim, e.kvElems()
	ld := e.qkvDim()
	for _, s := range e.segs {
		kc, vc := s.seq.k[l], s.seq.v[l]
		for i := range s.n {
			p := s.pos0 + i
			row := e.qkv[(s.row0+i)*ld : (s.row0+i+1)*ld]
			cs := e.rope[p*d : (p+1)*d]
			for hq := range sp.Heads {
				rope(row[hq*d:(hq+1)*d], cs)
			}
			k, v := row[qd:qd+elems], row[qd+elems:qd+2*elems]
			for kh := range sp.KVHeads {
				rope(k[kh*d:(kh+1)*d], cs)
			}
			kd, vd := kc[p*elems:(p+1)*elems], vc[p*elems:(p+1)*elems]
			for j := range elems {
				kd[j] = toBF16(k[j])
				vd[j] = toBF16(v[j])
			}
		}
		s.seq.lens[l] = s.pos0 + s.n
	}
}

// sendKV hands layer l of every prefill segment to onKV.
func (e *Engine) sendKV(l int, onKV engine.KVFunc) error {
	for _, s := range e.segs {
		if !s.kv {
			continue
		}
		e.kvBuf = s.seq.appendCanonical(e.kvBuf[:0], l, s.pos0, s.pos0+s.n, e.kvElems())
		c := engine.KVChunk{Seq: s.id, Layer: l, Start: s.pos0, End: s.pos0 + s.n, Data: e.kvBuf}
		if err := onKV(c); err != nil {
			return fmt.Errorf("ref: kv callback for seq %d layer %d: %w", s.id, l, err)
		}
	}
	return nil
}

// keepOutputRows moves the rows whose logits are wanted to the front of x
// and qkv, in segment order, and returns how many there are: every row of
// an AllLogits segment, the last row of another sampled segment. A row
// only moves down (kept ≤ its index), so copying in order is safe.
func (e *Engine) keepOutputRows() int {
	h, ld := e.spec.Hidden, e.qkvDim()
	kept := 0
	for i := range e.segs {
		s := &e.segs[i]
		first, n := s.row0+s.n-1, 1
		switch {
		case s.all:
			first, n = s.row0, s.n
		case !s.sample:
			s.arows = 0
			continue
		}
		if first != kept {
			copy(e.x[kept*h:(kept+n)*h], e.x[first*h:(first+n)*h])
			copy(e.qkv[kept*ld:(kept+n)*ld], e.qkv[first*ld:(first+n)*ld])
		}
		s.arow0, s.arows, s.apos0 = kept, n, s.pos0+(first-s.row0)
		kept += n
	}
	return kept
}

// outputs samples the kept rows and builds the result slices.
func (e *Engine) outputs(nPrefill, nDecode int) (prefillOut, decodeOut []engine.Output) {
	out := make([]engine.Output, nPrefill+nDecode)
	v := e.spec.Vocab
	for i, s := range e.segs {
		o := engine.Output{Seq: s.id}
		if s.all {
			lo, hi := s.arow0*v, (s.arow0+s.arows)*v
			o.AllLogits = e.logits[lo:hi:hi]
		}
		if s.sample {
			r := s.arow0 + s.arows - 1
			o.Logits = e.logits[r*v : (r+1)*v : (r+1)*v]
			o.Token = engine.Sample(o.Logits, s.sampling, s.pos0+s.n, &e.sample)
			o.Sampled = true
		}
		out[i] = o
	}
	if nPrefill > 0 {
		prefillOut = out[:nPrefill:nPrefill]
	}
	if nDecode > 0 {
		decodeOut = out[nPrefill:]
	}
	return prefillOut, decodeOut
}

// matmul computes y (+)= x · wᵀ for rows rows on the pool.
func (e *Engine) matmul(y []float32, ldy int, x []float32, ldx, rows int, w *matrix, add bool) {
	e.mm = matmulJob{y: y, ldy: ldy, x: x, ldx: ldx, rows: rows, w: w, add: add}
	e.pool.matmul(&e.mm)
	e.mm = matmulJob{}
}

// Row operations, applied per row by rowJob.
const (
	opAttnNorm = iota
	opMLPNorm
	opFinalNorm
	opSwiGLU
)

// rowsPerUnit is the rows one rowJob unit handles.
const rowsPerUnit = 8

// rowJob applies an element-wise row operation to rows [0, rows).
type rowJob struct {
	e    *Engine
	op   int
	rows int
	lw   *layerWeights
}

func (e *Engine) rows(rows, op int, lw *layerWeights) {
	e.rowOp.op, e.rowOp.rows, e.rowOp.lw = op, rows, lw
	e.pool.run(&e.rowOp, (rows+rowsPerUnit-1)/rowsPerUnit)
	e.rowOp.lw = nil
}

func (j *rowJob) do(_, unit int) {
	e := j.e
	h, in := e.spec.Hidden, e.spec.Intermediate
	for r := unit * rowsPerUnit; r < min((unit+1)*rowsPerUnit, j.rows); r++ {
		switch j.op {
		case opAttnNorm:
			rmsNorm(e.xn[r*h:(r+1)*h], e.x[r*h:(r+1)*h], j.lw.attnNorm, rmsEps)
		case opMLPNorm:
			rmsNorm(e.xn[r*h:(r+1)*h], e.x[r*h:(r+1)*h], j.lw.mlpNorm, rmsEps)
		case opFinalNorm:
			rmsNorm(e.xn[r*h:(r+1)*h], e.x[r*h:(r+1)*h], e.w.norm, rmsEps)
		case opSwiGLU:
			g := e.gu[r*2*in : r*2*in+in]
			u := e.gu[r*2*in+in : (r+1)*2*in]
			swiGLU(e.hid[r*in:(r+1)*in], g, u)
		}
	}
}

// grow returns buf with length n, reallocating only when its capacity is
// short.
func grow[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n, n+n/4)
	}
	return buf[:n]
}
