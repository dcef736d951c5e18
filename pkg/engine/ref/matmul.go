package ref

import "math"

// matrix is a weight matrix of n output features × k input features,
// packed for the matmul kernels: panels of nr consecutive output features,
// each panel stored k-major ([k][nr]), the last panel zero-padded. The
// packing makes every kernel read its weights as one contiguous stream.
type matrix struct {
	n, k int
	data []float32 // panels(n) × k × nr
}

func panels(n int) int { return (n + nr - 1) / nr }

// newMatrix returns an n × k matrix whose element (row, col) is
// f(row, col).
func newMatrix(n, k int, f func(row, col int) float32) *matrix {
	m := &matrix{n: n, k: k, data: make([]float32, panels(n)*k*nr)}
	for row := range n {
		p, j := row/nr, row%nr
		base := p * k * nr
		for col := range k {
			m.data[base+col*nr+j] = f(row, col)
		}
	}
	return m
}

// at returns element (row, col).
func (m *matrix) at(row, col int) float32 {
	return m.data[(row/nr)*m.k*nr+col*nr+row%nr]
}

// panel returns the packed data of panel p.
func (m *matrix) panel(p int) []float32 {
	size := m.k * nr
	return m.data[p*size : (p+1)*size : (p+1)*size]
}

// Rows of activations a matmul unit covers: enough to reuse each weight
// panel from cache many times, few enough that the rows stay in L2.
const matmulRowBlock = 64

// matmulJob computes y[r][c] (+)= Σ_i x[r][i] · w(c, i) for r < rows,
// c < w.n, where y and x are row-major with strides ldy and ldx. Every
// element is accumulated from i = 0 upwards in one unit, so the result does
// not depend on the batch it is part of, on the split into units or on the
// worker that runs it; with add, the finished sum is added to y once.
type matmulJob struct {
	y        []float32
	ldy      int
	x        []float32
	ldx      int
	rows     int
	w        *matrix
	add      bool
	perUnit  int // panels per unit
	colUnits int // units across the panels
}

func (j *matmulJob) do(_, unit int) {
	rb, cb := unit/j.colUnits, unit%j.colUnits
	r0 := rb * matmulRowBlock
	rows := min(matmulRowBlock, j.rows-r0)
	np := panels(j.w.n)
	p0 := cb * j.perUnit
	p1 := min(p0+j.perUnit, np)
	x := j.x[r0*j.ldx:]
	for p := p0; p < p1; p++ {
		c0 := p * nr
		panelKernel(j.y[r0*j.ldy+c0:], j.ldy, x, j.ldx, rows, j.w.panel(p), j.w.k, min(nr, j.w.n-c0), j.add)
	}
}

// matmul runs j (whose y, x, rows, w and add the caller has set) on the
// pool: it splits the work into row blocks × panel ranges, enough units
// for every worker to take several.
func (pl *pool) matmul(j *matmulJob) {
	if j.rows == 0 {
		return
	}
	np := panels(j.w.n)
	rowUnits := (j.rows + matmulRowBlock - 1) / matmulRowBlock
	want := 4 * pl.size // units wanted, for balance on a busy machine
	colUnits := min(np, max(1, (want+rowUnits-1)/rowUnits))
	j.perUnit = (np + colUnits - 1) / colUnits
	j.colUnits = (np + j.perUnit - 1) / j.perUnit
	pl.run(j, rowUnits*j.colUnits)
}

// panelKernelGo is the portable kernel: it computes columns [0, ncols) of
// y for rows [0, rows) against one packed panel p (k × nr), two rows × four
// columns at a time. y[r*ldy+c] receives the sum for row r, column c.
func panelKernelGo(y []float32, ldy int, x []float32, ldx, rows int, p []float32, k, ncols int, add bool) {
	for c := 0; c < ncols; c += 4 {
		cols := min(4, ncols-c)
		r := 0
		for ; r+2 <= rows; r += 2 {
			x0 := x[r*ldx : r*ldx+k]
			x1 := x[(r+1)*ldx : (r+1)*ldx+k]
			x1 = x1[:len(x0)]
			var a0, a1, a2, a3, b0, b1, b2, b3 float32
			for i, v0 := range x0 {
				o := i*nr + c
				w := p[o : o+4 : o+4]
				w0, w1, w2, w3 := w[0], w[1], w[2], w[3]
				v1 := x1[i]
				a0 += v0 * w0
				b0 += v1 * w0
				a1 += v0 * w1
				b1 += v1 * w1
				a2 += v0 * w2
				b2 += v1 * w2
				a3 += v0 * w3
				b3 += v1 * w3
			}
			store4(y[r*ldy+c:], cols, add, a0, a1, a2, a3)
			store4(y[(r+1)*ldy+c:], cols, add, b0, b1, b2, b3)
		}
		if r < rows {
			x0 := x[r*ldx : r*ldx+k]
			var a0, a1, a2, a3 float32
			for i, v0 := range x0 {
				o := i*nr + c
				w := p[o : o+4 : o+4]
				a0 += v0 * w[0]
				a1 += v0 * w[1]
				a2 += v0 * w[2]
				a3 += v0 * w[3]
			}
			store4(y[r*ldy+c:], cols, add, a0, a1, a2, a3)
		}
	}
}

// store4 writes (or adds) the first cols of four sums to y.
func store4(y []float32, cols int, add bool, a0, a1, a2, a3 float32) {
	if cols == 4 {
		y = y[:4]
		if add {
			y[0] += a0
			y[1] += a1
			y[2] += a2
			y[3] += a3
		} else {
			y[0], y[1], y[2], y[3] = a0, a1, a2, a3
		}
		return
	}
	a := [4]float32{a0, a1, a2, a3}
	for j := range cols {
		if add {
			y[j] += a[j]
		} else {
			y[j] = a[j]
		}
	}
}

// dotBF16Go returns Σ q[i]·k[i] with k in bfloat16, len(k) ≥ len(q), as
// four interleaved partial sums combined in a fixed order.
func dotBF16Go(q []float32, k []uint16) float32 {
	k = k[:len(q)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(q); i += 4 {
		s0 += q[i] * fromBF16(k[i])
		s1 += q[i+1] * fromBF16(k[i+1])
		s2 += q[i+2] * fromBF16(k[i+2])
		s3 += q[i+3] * fromBF16(k[i+3])
	}
	for ; i < len(q); i++ {
		s0 += q[i] * fromBF16(k[i])
	}
	return (s0 + s1) + (s2 + s3)
}

// axpyBF16Go adds a·v[i] to y[i], v in bfloat16, len(v) ≥ len(y).
func axpyBF16Go(y []float32, a float32, v []uint16) {
	v = v[:len(y)]
	for i, b := range v {
		y[i] += a * fromBF16(b)
	}
}

// scoresBF16Go sets sc[j] = (q · k_j)·scale for the keys k_j =
// k[j·stride:], j < len(sc), and returns the largest score.
func scoresBF16Go(sc, q []float32, k []uint16, stride int, scale float32) float32 {
	m := float32(math.Inf(-1))
	for j := range sc {
		v := dotBF16Go(q, k[j*stride:]) * scale
		sc[j] = v
		m = max(m, v)
	}
	return m
}

// valuesBF16Go sets out = Σ_j (w[j]·inv)·v_j with v_j = v[j·stride:],
// accumulated in order of j.
func valuesBF16Go(out, w []float32, inv float32, v []uint16, stride int) {
	clear(out)
	for j, wj := range w {
		axpyBF16Go(out, wj*inv, v[j*stride:])
	}
}
