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
	}
}

func scoresBF16(sc, q []float32, k []uint16, stride int, scale float32) float32 {
	if useAVX2 {
		return scoresBF16AVX2(sc, q, k, stride, scale)
	}
	return scoresBF16Go(sc, q, k, stride, scale)
}

func valuesBF16(out, w []float32, inv float32, v []uint16, stride int) {
	if useAVX2 {
		valuesBF16AVX2(out, w, inv, v, stride)
		return
	}
	valuesBF16Go(out, w, inv, v, stride)
}

func expSub(s []float32, m float32) float32 {
	if useAVX2 {
		return expSubAVX2(s, m)
	}
	return expSubGo(s, m)
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
	storePartial(y, t[:ncols], add)
}

// storePartial writes (or adds) sums to the start of y.
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

// loadBF16x8 widens eight bfloat16 values to float32.
func loadBF16x8(k []uint16) archsimd.Float32x8 {
	return archsimd.LoadUint16x8((*[8]uint16)(k)).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
}

// dotBF16AVX2 returns Σ q[i]·k[i] as two 8-lane FMA chains (alternate
// blocks of eight) reduced in a fixed order, plus a scalar tail.
func dotBF16AVX2(q []float32, k []uint16) float32 {
	k = k[:len(q)]
	n := len(q) &^ 15
	var a0, a1 archsimd.Float32x8
	for i := 0; i < n; i += 16 {
		a0 = archsimd.LoadFloat32x8((*[8]float32)(q[i:i+8])).MulAdd(loadBF16x8(k[i:i+8]), a0)
		a1 = archsimd.LoadFloat32x8((*[8]float32)(q[i+8:i+16])).MulAdd(loadBF16x8(k[i+8:i+16]), a1)
	}
	var t [8]float32
	a0.Add(a1).Store(&t)
	s := ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]))
	for i := n; i < len(q); i++ {
		s += q[i] * fromBF16(k[i])
	}
	return s
}

// axpyBF16AVX2 adds a·v[i] to y[i] with fused multiply-adds.
func axpyBF16AVX2(y []float32, a float32, v []uint16) {
	v = v[:len(y)]
	n := len(y) &^ 7
	av := archsimd.BroadcastFloat32x8(a)
	for i := 0; i < n; i += 8 {
		yp := (*[8]float32)(y[i : i+8])
		loadBF16x8(v[i:i+8]).MulAdd(av, archsimd.LoadFloat32x8(yp)).Store(yp)
	}
	for i := n; i < len(y); i++ {
		y[i] += a * fromBF16(v[i])
	}
}

// exp8 is expf on eight lanes, with the same operations in the same order
// (no fused multiply-adds), so each lane equals expf of its input.
func exp8(x archsimd.Float32x8) archsimd.Float32x8 {
	x = x.Max(archsimd.BroadcastFloat32x8(expLo)).Min(archsimd.BroadcastFloat32x8(expHi))
	n := x.Mul(archsimd.BroadcastFloat32x8(expLog2e)).RoundToEven()
	r := x.Sub(n.Mul(archsimd.BroadcastFloat32x8(expLn2Hi)))
	r = r.Sub(n.Mul(archsimd.BroadcastFloat32x8(expLn2Lo)))
	p := archsimd.BroadcastFloat32x8(expP0).Mul(r).Add(archsimd.BroadcastFloat32x8(expP1))
	p = p.Mul(r).Add(archsimd.BroadcastFloat32x8(expP2))
	p = p.Mul(r).Add(archsimd.BroadcastFloat32x8(expP3))
	p = p.Mul(r).Add(archsimd.BroadcastFloat32x8(expP4))
	p = p.Mul(r).Add(archsimd.BroadcastFloat32x8(expP5))
	p = p.Mul(r.Mul(r)).Add(r)
	p = p.Add(archsimd.BroadcastFloat32x8(1))
	scale := n.ConvertToInt32().Add(archsimd.BroadcastInt32x8(127)).ShiftAllLeft(23).AsFloat32x8()
	return p.Mul(scale)
}

// expSubAVX2 is expSubGo eight lanes at a time; the sum is taken per lane,
// reduced in a fixed order, then the scalar tail is added.
func expSubAVX2(s []float32, m float32) float32 {
	n := len(s) &^ 7
	mv := archsimd.BroadcastFloat32x8(m)
	var acc archsimd.Float32x8
	for i := 0; i < n; i += 8 {
		p := (*[8]float32)(s[i : i+8])
		w := exp8(archsimd.LoadFloat32x8(p).Sub(mv))
		w.Store(p)
		acc = acc.Add(w)
	}
	var t [8]float32
	acc.Store(&t)
	sum := ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]))
	for i := n; i < len(s); i++ {
		w := expf(s[i] - m)
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
	one := archsimd.BroadcastFloat32x8(1)
	var zero archsimd.Float32x8
	for i := 0; i < n; i += 8 {
		gv := archsimd.LoadFloat32x8((*[8]float32)(g[i : i+8]))
		uv := archsimd.LoadFloat32x8((*[8]float32)(u[i : i+8]))
		sig := one.Add(exp8(zero.Sub(gv)))
		gv.Div(sig).Mul(uv).Store((*[8]float32)(dst[i : i+8]))
	}
	for i := n; i < len(dst); i++ {
		dst[i] = silu(g[i]) * u[i]
	}
}

// scoresBF16AVX2 is scoresBF16Go with dotBF16AVX2; for a head dim of 64 it
// keeps q in registers across keys, with the same operations as
// dotBF16AVX2 (so the same scores).
func scoresBF16AVX2(sc, q []float32, k []uint16, stride int, scale float32) float32 {
	m := float32(math.Inf(-1))
	if len(q) != 64 {
		for j := range sc {
			v := dotBF16AVX2(q, k[j*stride:]) * scale
			sc[j] = v
			m = max(m, v)
		}
		return m
	}
	q0 := archsimd.LoadFloat32x8((*[8]float32)(q[0:8]))
	q1 := archsimd.LoadFloat32x8((*[8]float32)(q[8:16]))
	q2 := archsimd.LoadFloat32x8((*[8]float32)(q[16:24]))
	q3 := archsimd.LoadFloat32x8((*[8]float32)(q[24:32]))
	q4 := archsimd.LoadFloat32x8((*[8]float32)(q[32:40]))
	q5 := archsimd.LoadFloat32x8((*[8]float32)(q[40:48]))
	q6 := archsimd.LoadFloat32x8((*[8]float32)(q[48:56]))
	q7 := archsimd.LoadFloat32x8((*[8]float32)(q[56:64]))
	var zero archsimd.Float32x8
	var t [8]float32
	for j := range sc {
		kj := k[j*stride : j*stride+64]
		a0 := q0.MulAdd(loadBF16x8(kj[0:8]), zero)
		a1 := q1.MulAdd(loadBF16x8(kj[8:16]), zero)
		a0 = q2.MulAdd(loadBF16x8(kj[16:24]), a0)
		a1 = q3.MulAdd(loadBF16x8(kj[24:32]), a1)
		a0 = q4.MulAdd(loadBF16x8(kj[32:40]), a0)
		a1 = q5.MulAdd(loadBF16x8(kj[40:48]), a1)
		a0 = q6.MulAdd(loadBF16x8(kj[48:56]), a0)
		a1 = q7.MulAdd(loadBF16x8(kj[56:64]), a1)
		a0.Add(a1).Store(&t)
		v := (((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]))) * scale
		sc[j] = v
		m = max(m, v)
	}
	return m
}

// valuesBF16AVX2 is valuesBF16Go with fused multiply-adds; for a head dim
// of 64 it keeps the output in registers across keys, with the same
// operations as axpyBF16AVX2 (so the same result).
func valuesBF16AVX2(out, w []float32, inv float32, v []uint16, stride int) {
	if len(out) != 64 {
		clear(out)
		for j, wj := range w {
			axpyBF16AVX2(out, wj*inv, v[j*stride:])
		}
		return
	}
	var o0, o1, o2, o3, o4, o5, o6, o7 archsimd.Float32x8
	for j, wj := range w {
		a := archsimd.BroadcastFloat32x8(wj * inv)
		vj := v[j*stride : j*stride+64]
		o0 = loadBF16x8(vj[0:8]).MulAdd(a, o0)
		o1 = loadBF16x8(vj[8:16]).MulAdd(a, o1)
		o2 = loadBF16x8(vj[16:24]).MulAdd(a, o2)
		o3 = loadBF16x8(vj[24:32]).MulAdd(a, o3)
		o4 = loadBF16x8(vj[32:40]).MulAdd(a, o4)
		o5 = loadBF16x8(vj[40:48]).MulAdd(a, o5)
		o6 = loadBF16x8(vj[48:56]).MulAdd(a, o6)
		o7 = loadBF16x8(vj[56:64]).MulAdd(a, o7)
	}
	out = out[:64]
	o0.Store((*[8]float32)(out[0:8]))
	o1.Store((*[8]float32)(out[8:16]))
	o2.Store((*[8]float32)(out[16:24]))
	o3.Store((*[8]float32)(out[24:32]))
	o4.Store((*[8]float32)(out[32:40]))
	o5.Store((*[8]float32)(out[40:48]))
	o6.Store((*[8]float32)(out[48:56]))
	o7.Store((*[8]float32)(out[56:64]))
}
