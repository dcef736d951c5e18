package ref

import "math"

// toBF16 rounds f to bfloat16 (round to nearest, ties to even) and returns
// its bits. NaN becomes a quiet NaN with the sign kept.
func toBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN
		return uint16(u>>16) | 0x0040
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// fromBF16 widens bfloat16 bits to float32 (exact).
func fromBF16(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// Constants of expf (Cephes' expf): x = n·ln2 + r with |r| ≤ ln2/2,
// e^r by a degree-6 polynomial, scaled by 2^n. The input is clamped to
// [expLo, expHi] so that 2^n stays a normal float32.
const (
	expLo    = -87
	expHi    = 88
	expLog2e = 1.44269504088896341
	expLn2Hi = 0.693359375
	expLn2Lo = -2.12194440e-4
	expP0    = 1.9875691500e-4
	expP1    = 1.3981999507e-3
	expP2    = 8.3334519073e-3
	expP3    = 4.1665795894e-2
	expP4    = 1.6666665459e-1
	expP5    = 5.0000001201e-1
)

// expf returns e^x in float32 with a relative error below 3e-7 for x in
// [-87, 88]; outside, x is clamped to that range (e^-87 ≈ 1.6e-38 stands
// for 0). x must not be NaN. It is pure Go and performs the same
// operations as the vector version of the SIMD build, element by element.
func expf(x float32) float32 {
	x = min(max(x, expLo), expHi)
	n := float32(math.RoundToEven(float64(x * expLog2e)))
	r := x - n*expLn2Hi
	r = r - n*expLn2Lo
	p := expP0*r + expP1
	p = p*r + expP2
	p = p*r + expP3
	p = p*r + expP4
	p = p*r + expP5
	p = p*(r*r) + r
	p = p + 1
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}

// softmaxGo replaces s by softmax(s·scale): every v by v·scale, then by
// e^(v·scale − m) with m the largest of them, then by that over the sum of
// all (expSubGo), multiplied by the sum's reciprocal.
func softmaxGo(s []float32, scale float32) {
	m := float32(math.Inf(-1))
	for i, v := range s {
		v *= scale
		s[i] = v
		m = max(m, v)
	}
	inv := 1 / expSubGo(s, m)
	for i := range s {
		s[i] *= inv
	}
}

// expSubGo replaces every v in s by e^(v−m) and returns their sum, added in
// index order.
func expSubGo(s []float32, m float32) float32 {
	var sum float32
	for i, v := range s {
		w := expf(v - m)
		s[i] = w
		sum += w
	}
	return sum
}

// swiGLUGo writes silu(g[i])·u[i] to dst[i].
func swiGLUGo(dst, g, u []float32) {
	g = g[:len(dst)]
	u = u[:len(dst)]
	for i, gv := range g {
		dst[i] = silu(gv) * u[i]
	}
}

// silu returns x·σ(x).
func silu(x float32) float32 { return x / (1 + expf(-x)) }

// rmsNorm writes x / sqrt(mean(x²) + eps) · w to dst. len(dst) == len(x)
// == len(w). The mean is accumulated in float64 in index order.
func rmsNorm(dst, x, w []float32, eps float64) {
	x = x[:len(dst)]
	w = w[:len(dst)]
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	scale := float32(1 / math.Sqrt(ss/float64(len(x))+eps))
	for i, v := range x {
		dst[i] = v * scale * w[i]
	}
}

// rope rotates consecutive pairs (v[2i], v[2i+1]) of one head by the angles
// of one position: cs holds cos, sin interleaved, one pair per i (the
// original Llama / GGUF convention, not the half-split one).
func rope(v, cs []float32) {
	cs = cs[:len(v)]
	for i := 0; i+1 < len(v); i += 2 {
		c, s := cs[i], cs[i+1]
		a, b := v[i], v[i+1]
		v[i] = a*c - b*s
		v[i+1] = a*s + b*c
	}
}
