package ref

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
// y for rows [0, rows) against one packed panel p (k × nr, row i holding
// input feature i of the panel's nr output features); y[r*ldy+c] is set to
// (with add, increased by) the sum for row r, column c. Each row meets six
// columns at a time (dot6; a panel width that is not a multiple of six
// leaves a few columns to dot1). Both compute every sum as the same chain of float32
// multiply-adds from i = 0 upwards, so an element does not depend on the
// rows, columns or worker it is computed with.
func panelKernelGo(y []float32, ldy int, x []float32, ldx, rows int, p []float32, k, ncols int, add bool) {
	if k == 0 {
		if !add {
			for r := range rows {
				clear(y[r*ldy : r*ldy+ncols])
			}
		}
		return
	}
	p = p[:k*nr]
	for r := range rows {
		xr := x[r*ldx : r*ldx+k]
		yr := y[r*ldy : r*ldy+ncols]
		c := 0
		for ; c < ncols && c+6 <= nr; c += 6 {
			s0, s1, s2, s3, s4, s5 := dot6(xr, p[c:])
			store6(yr[c:], add, s0, s1, s2, s3, s4, s5)
		}
		for ; c < ncols; c++ {
			if s := dot1(xr, p[c:]); add {
				yr[c] += s
			} else {
				yr[c] = s
			}
		}
	}
}

// dot6 returns the six sums Σ_i x[i]·w[i*nr+j], j < 6, each accumulated
// from i = 0 upwards with the product rounded to float32 before it is added
// (the conversions forbid fused multiply-adds on any architecture).
// len(w) must be at least (len(x)-1)*nr + 6.
//
// The shape suits the Go compiler, which neither vectorises nor schedules
// for register pressure:
//   - Four steps per iteration, taken while more than four remain, so w
//     holds at least 4*nr+6 values: one bounds check (the conversion of w)
//     per four steps, and re-slices the compiler knows are non-empty.
//   - Six accumulators. The compiler places an iteration's multiplies
//     before the additions whose results leave the loop body, so six
//     products and six sums are live at once: 12 of the 15 float registers
//     amd64 code may use. Eight would spill.
//   - Each accumulator holds the negated sum and takes "a -= product".
//     Subtraction does not commute, so the register allocator updates it in
//     place; with "a += product" it may put the result in the product's
//     register and shuffle all six back at the end of every iteration. The
//     sum is returned as 0 - a, the same bits as summing upwards from +0:
//     rounding to nearest is symmetric, and neither form ever yields -0.
//
// A step is then a load of x and, per column, a load of w, a multiply and a
// subtract: three instructions per multiply-add, close to two
// multiply-adds a cycle on a core with two multipliers and two adders.
func dot6(x, w []float32) (s0, s1, s2, s3, s4, s5 float32) {
	var a0, a1, a2, a3, a4, a5 float32
	for len(x) > 4 {
		xa := (*[4]float32)(x)
		wa := (*[4*nr + 6]float32)(w)
		v := xa[0]
		a0 -= float32(v * wa[0])
		a1 -= float32(v * wa[1])
		a2 -= float32(v * wa[2])
		a3 -= float32(v * wa[3])
		a4 -= float32(v * wa[4])
		a5 -= float32(v * wa[5])
		v = xa[1]
		a0 -= float32(v * wa[nr])
		a1 -= float32(v * wa[nr+1])
		a2 -= float32(v * wa[nr+2])
		a3 -= float32(v * wa[nr+3])
		a4 -= float32(v * wa[nr+4])
		a5 -= float32(v * wa[nr+5])
		v = xa[2]
		a0 -= float32(v * wa[2*nr])
		a1 -= float32(v * wa[2*nr+1])
		a2 -= float32(v * wa[2*nr+2])
		a3 -= float32(v * wa[2*nr+3])
		a4 -= float32(v * wa[2*nr+4])
		a5 -= float32(v * wa[2*nr+5])
		v = xa[3]
		a0 -= float32(v * wa[3*nr])
		a1 -= float32(v * wa[3*nr+1])
		a2 -= float32(v * wa[3*nr+2])
		a3 -= float32(v * wa[3*nr+3])
		a4 -= float32(v * wa[3*nr+4])
		a5 -= float32(v * wa[3*nr+5])
		x = x[4:]
		w = w[4*nr:]
	}
	for i, v := range x {
		wi := w[i*nr : i*nr+6 : i*nr+6]
		a0 -= float32(v * wi[0])
		a1 -= float32(v * wi[1])
		a2 -= float32(v * wi[2])
		a3 -= float32(v * wi[3])
		a4 -= float32(v * wi[4])
		a5 -= float32(v * wi[5])
	}
	return 0 - a0, 0 - a1, 0 - a2, 0 - a3, 0 - a4, 0 - a5
}

// dot1 returns Σ_i x[i]·w[i*nr] with the operations of one column of dot6
// (so the same bits). len(w) must be at least (len(x)-1)*nr + 1.
func dot1(x, w []float32) float32 {
	var a float32
	for i, v := range x {
		a -= float32(v * w[i*nr])
	}
	return 0 - a
}

// store6 writes (or adds) the first min(len(y), 6) of six sums to y.
func store6(y []float32, add bool, s0, s1, s2, s3, s4, s5 float32) {
	s := [6]float32{s0, s1, s2, s3, s4, s5}
	y = y[:min(len(y), 6)]
	for j := range y {
		if add {
			y[j] += s[j]
		} else {
			y[j] = s[j]
		}
	}
}
