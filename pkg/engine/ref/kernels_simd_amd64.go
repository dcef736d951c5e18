//go:build goexperiment.simd && amd64

package ref

import (
	"math"
	"simd/archsimd"
)

// nr is the panel width of packed weights (output features per panel):
// two 16-lane or four 8-lane vectors.
const nr = 32

// The vector kernels need AVX2 and FMA; the matmul uses 16-lane vectors
// where AVX-512 is present. Both compute every element as the same chain of
// fused multiply-adds, so they give bit-identical results.
var (
	useAVX2   = archsimd.X86.AVX2() && archsimd.X86.FMA()
	useAVX512 = useAVX2 && archsimd.X86.AVX512()
)

// Kernel names the active kernel set: "go" for the portable one, "avx2" or
// "avx512" (identical results) for the SIMD ones built with
// GOEXPERIMENT=simd on a CPU with AVX2 and FMA.
func Kernel() string {
	switch {
	case useAVX512:
		return "avx512"
	case useAVX2:
		return "avx2"
	}
	return "go"
}

// The SIMD kernels leave the upper halves of the vector registers clear
// (archsimd.ClearAVXUpperBits, VZEROUPPER) before any scalar float code
// runs: Go compiles float32 arithmetic to legacy SSE instructions, and on
// many x86 CPUs each of them, with dirty upper halves, waits for a merge
// with the whole vector register. Without the clearing, a scalar reduction
// inside a vector loop ran 60 times slower than the loop itself, and the
// engine's scalar code after a kernel (norms, RoPE, sampling) slowed down
// with it.

func panelKernel(y []float32, ldy int, x []float32, ldx, rows int, p []float32, k, ncols int, add bool) {
	switch {
	case useAVX512:
		panelKernelAVX512(y, ldy, x, ldx, rows, p, k, ncols, add)
	case useAVX2:
		for c := 0; c < ncols; c += 16 {
			panelKernelAVX2(y[c:], ldy, x, ldx, rows, p[c:], k, min(16, ncols-c), add)
		}
	default:
		panelKernelGo(y, ldy, x, ldx, rows, p, k, ncols, add)
		return
	}
	archsimd.ClearAVXUpperBits()
}

func softmax(s []float32, scale float32) {
	if useAVX2 {
		softmaxAVX2(s, scale)
		return
	}
	softmaxGo(s, scale)
}

func packKeys(p []float32, k []uint16, stride, keys, d int) {
	if useAVX2 && d%8 == 0 {
		packKeysAVX2(p, k, stride, keys, d)
		return
	}
	packKeysGo(p, k, stride, 0, keys, d)
}

func packValues(p []float32, v []uint16, stride, n, w int) {
	if useAVX2 && w%8 == 0 {
		packValuesAVX2(p, v, stride, n, w)
		return
	}
	packValuesGo(p, v, stride, n, w)
}

func swiGLU(dst, g, u []float32) {
	if useAVX2 {
		swiGLUAVX2(dst, g, u)
		return
	}
	swiGLUGo(dst, g, u)
}

// panelKernelAVX2 computes sixteen columns of a panel (p starts at the
// first of them, rows of the panel nr apart) with 8-lane fused
// multiply-adds, four rows at a time. Every element is one chain of FMAs
// from i = 0 upwards whichever loop computes it, so results do not depend
// on the row count.
func panelKernelAVX2(y []float32, ldy int, x []float32, ldx, rows int, p []float32, k, ncols int, add bool) {
	p = p[:(k-1)*nr+16]
	r := 0
	for ; r+4 <= rows; r += 4 {
		x0 := x[r*ldx : r*ldx+k]
		x1 := x[(r+1)*ldx : (r+1)*ldx+k]
		x2 := x[(r+2)*ldx : (r+2)*ldx+k]
		x3 := x[(r+3)*ldx : (r+3)*ldx+k]
		var c00, c01, c10, c11, c20, c21, c30, c31 archsimd.Float32x8
		for i := range x0 {
			w := p[i*nr : i*nr+16 : i*nr+16]
			w0 := archsimd.LoadFloat32x8((*[8]float32)(w[0:8]))
			w1 := archsimd.LoadFloat32x8((*[8]float32)(w[8:16]))
			b := archsimd.BroadcastFloat32x8(x0[i])
			c00 = w0.MulAdd(b, c00)
			c01 = w1.MulAdd(b, c01)
			b = archsimd.BroadcastFloat32x8(x1[i])
			c10 = w0.MulAdd(b, c10)
			c11 = w1.MulAdd(b, c11)
			b = archsimd.BroadcastFloat32x8(x2[i])
			c20 = w0.MulAdd(b, c20)
			c21 = w1.MulAdd(b, c21)
			b = archsimd.BroadcastFloat32x8(x3[i])
			c30 = w0.MulAdd(b, c30)
			c31 = w1.MulAdd(b, c31)
		}
		storeRow16(y[r*ldy:], ncols, add, c00, c01)
		storeRow16(y[(r+1)*ldy:], ncols, add, c10, c11)
		storeRow16(y[(r+2)*ldy:], ncols, add, c20, c21)
		storeRow16(y[(r+3)*ldy:], ncols, add, c30, c31)
	}
	for ; r < rows; r++ {
		x0 := x[r*ldx : r*ldx+k]
		var c00, c01 archsimd.Float32x8
		for i, v := range x0 {
			w := p[i*nr : i*nr+16 : i*nr+16]
			w0 := archsimd.LoadFloat32x8((*[8]float32)(w[0:8]))
			w1 := archsimd.LoadFloat32x8((*[8]float32)(w[8:16]))
			b := archsimd.BroadcastFloat32x8(v)
			c00 = w0.MulAdd(b, c00)
			c01 = w1.MulAdd(b, c01)
		}
		storeRow16(y[r*ldy:], ncols, add, c00, c01)
	}
}

// storeRow16 writes (or adds) the first ncols (≤ 16) of sixteen sums to y.
func storeRow16(y []float32, ncols int, add bool, a, b archsimd.Float32x8) {
	if ncols == 16 {
		y0 := (*[8]float32)(y[0:8])
		y1 := (*[8]float32)(y[8:16])
		if add {
			a = a.Add(archsimd.LoadFloat32x8(y0))
			b = b.Add(archsimd.LoadFloat32x8(y1))
		}
		a.Store(y0)
		b.Store(y1)
		return
	}
	var t [16]float32
	a.Store((*[8]float32)(t[0:8]))
	b.Store((*[8]float32)(t[8:16]))
	archsimd.ClearAVXUpperBits()
	storePartial(y, t[:ncols], add)
}

// panelKernelAVX512 is panelKernelAVX2 over a whole panel with 16-lane
// vectors: four rows × thirty-two columns at a time, the same chain of
// FMAs per element.
func panelKernelAVX512(y []float32, ldy int, x []float32, ldx, rows int, p []float32, k, ncols int, add bool) {
	p = p[:k*nr]
	r := 0
	for ; r+4 <= rows; r += 4 {
		x0 := x[r*ldx : r*ldx+k]
		x1 := x[(r+1)*ldx : (r+1)*ldx+k]
		x2 := x[(r+2)*ldx : (r+2)*ldx+k]
		x3 := x[(r+3)*ldx : (r+3)*ldx+k]
		var c00, c01, c10, c11, c20, c21, c30, c31 archsimd.Float32x16
		for i := range x0 {
			w := p[i*nr : i*nr+nr : i*nr+nr]
			w0 := archsimd.LoadFloat32x16((*[16]float32)(w[0:16]))
			w1 := archsimd.LoadFloat32x16((*[16]float32)(w[16:32]))
			b := archsimd.BroadcastFloat32x16(x0[i])
			c00 = w0.MulAdd(b, c00)
			c01 = w1.MulAdd(b, c01)
			b = archsimd.BroadcastFloat32x16(x1[i])
			c10 = w0.MulAdd(b, c10)
			c11 = w1.MulAdd(b, c11)
			b = archsimd.BroadcastFloat32x16(x2[i])
			c20 = w0.MulAdd(b, c20)
			c21 = w1.MulAdd(b, c21)
			b = archsimd.BroadcastFloat32x16(x3[i])
			c30 = w0.MulAdd(b, c30)
			c31 = w1.MulAdd(b, c31)
		}
		storeRow32(y[r*ldy:], ncols, add, c00, c01)
		storeRow32(y[(r+1)*ldy:], ncols, add, c10, c11)
		storeRow32(y[(r+2)*ldy:], ncols, add, c20, c21)
		storeRow32(y[(r+3)*ldy:], ncols, add, c30, c31)
	}
	for ; r < rows; r++ {
		x0 := x[r*ldx : r*ldx+k]
		var c00, c01 archsimd.Float32x16
		for i, v := range x0 {
			w := p[i*nr : i*nr+nr : i*nr+nr]
			w0 := archsimd.LoadFloat32x16((*[16]float32)(w[0:16]))
			w1 := archsimd.LoadFloat32x16((*[16]float32)(w[16:32]))
			b := archsimd.BroadcastFloat32x16(v)
			c00 = w0.MulAdd(b, c00)
			c01 = w1.MulAdd(b, c01)
		}
		storeRow32(y[r*ldy:], ncols, add, c00, c01)
	}
}

// storeRow32 writes (or adds) the first ncols (≤ 32) of thirty-two sums
// to y.
func storeRow32(y []float32, ncols int, add bool, a, b archsimd.Float32x16) {
	if ncols == 32 {
		y0 := (*[16]float32)(y[0:16])
		y1 := (*[16]float32)(y[16:32])
		if add {
			a = a.Add(archsimd.LoadFloat32x16(y0))
			b = b.Add(archsimd.LoadFloat32x16(y1))
		}
		a.Store(y0)
		b.Store(y1)
		return
	}
	var t [32]float32
	a.Store((*[16]float32)(t[0:16]))
	b.Store((*[16]float32)(t[16:32]))
	archsimd.ClearAVXUpperBits()
	storePartial(y, t[:ncols], add)
}

// storePartial writes (or adds) sums to the start of y (scalar code: the
// caller has cleared the upper halves).
func storePartial(y, sums []float32, add bool) {
	y = y[:len(sums)]
	for j, v := range sums {
		if add {
			y[j] += v
		} else {
			y[j] = v
		}
	}
}

// expConsts are the constants of expf broadcast to eight lanes. A kernel
// sets them once, outside its loop (init), so that exp8 stays small enough
// to inline: a call in a vector loop spills every live vector and scalar
// around it, and a scalar spill is a legacy SSE move. init, a call itself,
// returns with the upper halves clear.
type expConsts struct {
	lo, hi, log2e, ln2Hi, ln2Lo, p0, p1, p2, p3, p4, p5, one archsimd.Float32x8
	bias                                                     archsimd.Int32x8
}

func (k *expConsts) init() {
	k.lo = archsimd.BroadcastFloat32x8(expLo)
	k.hi = archsimd.BroadcastFloat32x8(expHi)
	k.log2e = archsimd.BroadcastFloat32x8(expLog2e)
	k.ln2Hi = archsimd.BroadcastFloat32x8(expLn2Hi)
	k.ln2Lo = archsimd.BroadcastFloat32x8(expLn2Lo)
	k.p0 = archsimd.BroadcastFloat32x8(expP0)
	k.p1 = archsimd.BroadcastFloat32x8(expP1)
	k.p2 = archsimd.BroadcastFloat32x8(expP2)
	k.p3 = archsimd.BroadcastFloat32x8(expP3)
	k.p4 = archsimd.BroadcastFloat32x8(expP4)
	k.p5 = archsimd.BroadcastFloat32x8(expP5)
	k.one = archsimd.BroadcastFloat32x8(1)
	k.bias = archsimd.BroadcastInt32x8(127)
	archsimd.ClearAVXUpperBits() // the caller may reload scalars next
}

// exp8 is expf on eight lanes, with the same operations in the same order
// (no fused multiply-adds), so each lane equals expf of its input.
func exp8(x archsimd.Float32x8, k *expConsts) archsimd.Float32x8 {
	x = x.Max(k.lo).Min(k.hi)
	n := x.Mul(k.log2e).RoundToEven()
	r := x.Sub(n.Mul(k.ln2Hi))
	r = r.Sub(n.Mul(k.ln2Lo))
	p := k.p0.Mul(r).Add(k.p1)
	p = p.Mul(r).Add(k.p2)
	p = p.Mul(r).Add(k.p3)
	p = p.Mul(r).Add(k.p4)
	p = p.Mul(r).Add(k.p5)
	p = p.Mul(r.Mul(r)).Add(r)
	p = p.Add(k.one)
	scale := n.ConvertToInt32().Add(k.bias).ShiftAllLeft(23).AsFloat32x8()
	return p.Mul(scale)
}

// The kernels below pass a scalar float across vector code only inside a
// vector (broadcast before, stored and read back after the clearing), so
// that no spill or reload of it, a legacy SSE move, lands where the upper
// halves are dirty.

// softmaxAVX2 is softmaxGo eight lanes at a time: the same values
// element by element, except that the sum (expSubAVX2) is added in another
// order.
func softmaxAVX2(s []float32, scale float32) {
	n := len(s) &^ 7
	sv := archsimd.BroadcastFloat32x8(scale)
	mv := archsimd.BroadcastFloat32x8(float32(math.Inf(-1)))
	for i := 0; i < n; i += 8 {
		p := (*[8]float32)(s[i : i+8])
		v := archsimd.LoadFloat32x8(p).Mul(sv)
		v.Store(p)
		mv = mv.Max(v)
	}
	var t [8]float32
	mv.Store(&t)
	var c [8]float32
	sv.Store(&c)
	archsimd.ClearAVXUpperBits()
	m := max(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7])
	for i := n; i < len(s); i++ {
		v := s[i] * c[0]
		s[i] = v
		m = max(m, v)
	}
	iv := archsimd.BroadcastFloat32x8(1 / expSubAVX2(s, m))
	for i := 0; i < n; i += 8 {
		p := (*[8]float32)(s[i : i+8])
		archsimd.LoadFloat32x8(p).Mul(iv).Store(p)
	}
	iv.Store(&c)
	archsimd.ClearAVXUpperBits()
	for i := n; i < len(s); i++ {
		s[i] *= c[0]
	}
}

// expSubAVX2 is expSubGo eight lanes at a time; the sum is taken per lane,
// reduced in a fixed order, then the scalar tail is added.
func expSubAVX2(s []float32, m float32) float32 {
	n := len(s) &^ 7
	mv := archsimd.BroadcastFloat32x8(m)
	var k expConsts
	k.init()
	var acc archsimd.Float32x8
	for i := 0; i < n; i += 8 {
		p := (*[8]float32)(s[i : i+8])
		w := exp8(archsimd.LoadFloat32x8(p).Sub(mv), &k)
		w.Store(p)
		acc = acc.Add(w)
	}
	var t, c [8]float32
	acc.Store(&t)
	mv.Store(&c)
	archsimd.ClearAVXUpperBits()
	sum := ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]))
	for i := n; i < len(s); i++ {
		w := expf(s[i] - c[0])
		s[i] = w
		sum += w
	}
	return sum
}

// swiGLUAVX2 is swiGLUGo eight lanes at a time.
func swiGLUAVX2(dst, g, u []float32) {
	g = g[:len(dst)]
	u = u[:len(dst)]
	n := len(dst) &^ 7
	var k expConsts
	k.init()
	var zero archsimd.Float32x8
	for i := 0; i < n; i += 8 {
		gv := archsimd.LoadFloat32x8((*[8]float32)(g[i : i+8]))
		uv := archsimd.LoadFloat32x8((*[8]float32)(u[i : i+8]))
		sig := k.one.Add(exp8(zero.Sub(gv), &k))
		gv.Div(sig).Mul(uv).Store((*[8]float32)(dst[i : i+8]))
	}
	archsimd.ClearAVXUpperBits()
	for i := n; i < len(dst); i++ {
		dst[i] = silu(g[i]) * u[i]
	}
}

// widenBF16x8 returns eight bfloat16 values as float32.
func widenBF16x8(v archsimd.Uint16x8) archsimd.Float32x8 {
	return v.ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
}

// packValuesAVX2 is packValuesGo for a width that is a multiple of eight.
func packValuesAVX2(p []float32, v []uint16, stride, n, w int) {
	p = p[:n*nr]
	var zero archsimd.Float32x8
	for j := range n {
		src := v[j*stride : j*stride+w]
		dst := p[j*nr : (j+1)*nr]
		c := 0
		for ; c < w; c += 8 {
			widenBF16x8(archsimd.LoadUint16x8((*[8]uint16)(src[c : c+8]))).Store((*[8]float32)(dst[c : c+8]))
		}
		for ; c < nr; c += 8 {
			zero.Store((*[8]float32)(dst[c : c+8]))
		}
	}
	archsimd.ClearAVXUpperBits()
}

// packKeysAVX2 is packKeysGo (from column 0) for a head dim that is a
// multiple of eight: each block of eight keys × eight elements is
// transposed in registers (three rounds of interleaving) and widened, so
// that a row of the panel receives eight keys with one store. Columns
// past the last whole block of keys are left to packKeysGo.
func packKeysAVX2(p []float32, k []uint16, stride, keys, d int) {
	p = p[:d*nr]
	full := keys &^ 7
	for c := 0; c < full; c += 8 {
		kc := k[c*stride:]
		for i := 0; i < d; i += 8 {
			r0 := archsimd.LoadUint16x8((*[8]uint16)(kc[i : i+8]))
			r1 := archsimd.LoadUint16x8((*[8]uint16)(kc[stride+i : stride+i+8]))
			r2 := archsimd.LoadUint16x8((*[8]uint16)(kc[2*stride+i : 2*stride+i+8]))
			r3 := archsimd.LoadUint16x8((*[8]uint16)(kc[3*stride+i : 3*stride+i+8]))
			r4 := archsimd.LoadUint16x8((*[8]uint16)(kc[4*stride+i : 4*stride+i+8]))
			r5 := archsimd.LoadUint16x8((*[8]uint16)(kc[5*stride+i : 5*stride+i+8]))
			r6 := archsimd.LoadUint16x8((*[8]uint16)(kc[6*stride+i : 6*stride+i+8]))
			r7 := archsimd.LoadUint16x8((*[8]uint16)(kc[7*stride+i : 7*stride+i+8]))
			// Pairs of keys, element by element.
			a0, a1 := r0.InterleaveLo(r1).AsUint32x4(), r0.InterleaveHi(r1).AsUint32x4()
			a2, a3 := r2.InterleaveLo(r3).AsUint32x4(), r2.InterleaveHi(r3).AsUint32x4()
			a4, a5 := r4.InterleaveLo(r5).AsUint32x4(), r4.InterleaveHi(r5).AsUint32x4()
			a6, a7 := r6.InterleaveLo(r7).AsUint32x4(), r6.InterleaveHi(r7).AsUint32x4()
			// Quadruples of keys, two elements per vector.
			b0, b1 := a0.InterleaveLo(a2).AsUint64x2(), a0.InterleaveHi(a2).AsUint64x2()
			b2, b3 := a1.InterleaveLo(a3).AsUint64x2(), a1.InterleaveHi(a3).AsUint64x2()
			b4, b5 := a4.InterleaveLo(a6).AsUint64x2(), a4.InterleaveHi(a6).AsUint64x2()
			b6, b7 := a5.InterleaveLo(a7).AsUint64x2(), a5.InterleaveHi(a7).AsUint64x2()
			// All eight keys, one element per vector.
			row := p[i*nr+c:]
			widenBF16x8(b0.InterleaveLo(b4).AsUint16x8()).Store((*[8]float32)(row[0:8]))
			widenBF16x8(b0.InterleaveHi(b4).AsUint16x8()).Store((*[8]float32)(row[nr : nr+8]))
			widenBF16x8(b1.InterleaveLo(b5).AsUint16x8()).Store((*[8]float32)(row[2*nr : 2*nr+8]))
			widenBF16x8(b1.InterleaveHi(b5).AsUint16x8()).Store((*[8]float32)(row[3*nr : 3*nr+8]))
			widenBF16x8(b2.InterleaveLo(b6).AsUint16x8()).Store((*[8]float32)(row[4*nr : 4*nr+8]))
			widenBF16x8(b2.InterleaveHi(b6).AsUint16x8()).Store((*[8]float32)(row[5*nr : 5*nr+8]))
			widenBF16x8(b3.InterleaveLo(b7).AsUint16x8()).Store((*[8]float32)(row[6*nr : 6*nr+8]))
			widenBF16x8(b3.InterleaveHi(b7).AsUint16x8()).Store((*[8]float32)(row[7*nr : 7*nr+8]))
		}
	}
	archsimd.ClearAVXUpperBits()
	packKeysGo(p, k, stride, full, keys, d)
}
