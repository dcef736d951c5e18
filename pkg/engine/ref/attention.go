package ref

import "math"

// Attention is matrix work. A unit takes a few query rows of one sequence
// and one KV head, packs that head's cached keys and values into panels
// (the layout of a weight matrix, see matrix), and then, per query row,
// runs the matmul kernel twice over the group of query heads sharing the
// KV head:
//
//	scores  S = Q · Kᵀ   (group × keys, inner dimension the head dim)
//	output  O = P · V    (group × head dim, inner dimension the keys)
//
// where P is softmax(S / sqrt(head dim)) row by row. A row at position p
// uses keys 0..p only (causal), so its products stop at the panel that
// holds key p.
//
// The kernels compute every element as one chain of multiply-adds in a
// fixed order (head dim upwards for a score, keys upwards for an output),
// whatever the number of rows, columns or keys around it. So a query's
// attention does not depend on the unit, the chunk or the batch it is
// computed in, which the engine's equivalences need.
//
// FLOPs, as the benchmarks count them: 2·head dim for a query's score
// against one key plus 2·head dim for that key's share of the output,
// 4·head dim per (query head, key) pair attended; the softmax and the
// packing are not counted.

// attnRowsPerUnit is the query rows one attention unit handles: the keys
// and values it packs serve attnRowsPerUnit × group queries.
const attnRowsPerUnit = 16

// attnTask is one attention unit: query rows [r0, r1) of a segment's
// active rows, against one KV head and the query heads that share it.
type attnTask struct {
	seg, kvHead, r0, r1 int
}

// attnJob is causal grouped-query attention over the cached bf16 KV.
type attnJob struct {
	e     *Engine
	layer int
	tasks []attnTask
}

// attnScratch is one worker's attention buffers, grown on demand and
// reused; only that worker touches it.
type attnScratch struct {
	k     matrix    // keys of one KV head: n = keys, k = head dim
	v     matrix    // values of one KV head: n = head dim, k = keys
	probs []float32 // group × keys: the scores of a query row, then its probabilities
}

func (e *Engine) attention(l int) {
	j := &e.attn
	j.layer = l
	j.tasks = j.tasks[:0]
	for i, s := range e.segs {
		for kh := range e.spec.KVHeads {
			for r := 0; r < s.arows; r += attnRowsPerUnit {
				j.tasks = append(j.tasks, attnTask{seg: i, kvHead: kh, r0: r, r1: min(r+attnRowsPerUnit, s.arows)})
			}
		}
	}
	e.pool.run(j, len(j.tasks))
}

// do packs the keys and values the task's rows see and attends every row.
func (j *attnJob) do(worker, unit int) {
	e := j.e
	sp := e.spec
	t := j.tasks[unit]
	s := &e.segs[t.seg]
	d, elems, ld, qd := sp.HeadDim, e.kvElems(), e.qkvDim(), sp.Heads*sp.HeadDim
	group := sp.Heads / sp.KVHeads
	a := &e.attnScratch[worker]
	a.pack(s.seq.k[j.layer], s.seq.v[j.layer], t.kvHead*d, elems, s.apos0+t.r1, d)
	row := s.arow0 + t.r0
	q := e.qkv[row*ld+t.kvHead*group*d:]
	out := e.att[row*qd+t.kvHead*group*d:]
	a.attend(out, qd, q, ld, t.r1-t.r0, s.apos0+t.r0, group, d)
}

// pack copies tokens [0, n) of one KV head (elements [off, off+d) of
// every token, tokens stride elements apart) from the bf16 caches k and v
// into a.k and a.v as float32 panels, zero-padded.
func (a *attnScratch) pack(k, v []uint16, off, stride, n, d int) {
	a.k.n, a.k.k = n, d
	a.k.data = grow(a.k.data, panels(n)*d*nr)
	for pi := range panels(n) {
		c0 := pi * nr
		packKeys(a.k.panel(pi), k[c0*stride+off:], stride, min(nr, n-c0), d)
	}
	a.v.n, a.v.k = d, n
	a.v.data = grow(a.v.data, panels(d)*n*nr)
	for pi := range panels(d) {
		c0 := pi * nr
		packValues(a.v.panel(pi), v[off+c0:], stride, n, min(nr, d-c0))
	}
}

// packKeysGo fills columns [from, nr) of a key panel p (d × nr): column c
// holds the d elements of key c, keys stride elements apart from k[0],
// for c < keys, and zeros beyond.
func packKeysGo(p []float32, k []uint16, stride, from, keys, d int) {
	p = p[:d*nr]
	for c := from; c < nr; c++ {
		if c >= keys {
			for i := range d {
				p[i*nr+c] = 0
			}
			continue
		}
		for i, b := range k[c*stride : c*stride+d] {
			p[i*nr+c] = fromBF16(b)
		}
	}
}

// packValuesGo fills a value panel p (n × nr): row j holds the w
// elements of token j's values, tokens stride elements apart from v[0],
// and zeros beyond.
func packValuesGo(p []float32, v []uint16, stride, n, w int) {
	p = p[:n*nr]
	for j := range n {
		dst := p[j*nr : (j+1)*nr]
		for c, b := range v[j*stride : j*stride+w] {
			dst[c] = fromBF16(b)
		}
		clear(dst[w:])
	}
}

// attend computes causal attention for rows query rows against the packed
// keys and values, which must hold at least pos0+rows tokens. Row r is at
// position pos0+r; its group query heads lie d apart from q[r·ldq], and
// their outputs go to out[r·ldo:] in the same layout.
func (a *attnScratch) attend(out []float32, ldo int, q []float32, ldq, rows, pos0, group, d int) {
	scale := float32(1 / math.Sqrt(float64(d)))
	a.probs = grow(a.probs, group*(pos0+rows))
	for r := range rows {
		n := pos0 + r + 1 // keys 0..pos0+r
		ps := a.probs[:group*n]
		qr := q[r*ldq:]
		for pi := range panels(n) {
			c0 := pi * nr
			panelKernel(ps[c0:], n, qr, d, group, a.k.panel(pi), d, min(nr, n-c0), false)
		}
		for g := range group {
			softmax(ps[g*n:(g+1)*n], scale)
		}
		or := out[r*ldo:]
		for pi := range panels(d) {
			c0 := pi * nr
			panelKernel(or[c0:], d, ps, n, group, a.v.panel(pi), n, min(nr, d-c0), false)
		}
	}
}
