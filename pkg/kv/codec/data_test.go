package codec_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"

	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// gaussianBF16 returns n little-endian bf16 values laid out like one layer of
// KV: rows of width channels, each channel Gaussian with its own spread
// (log-normal, as attention K/V channels differ by orders of magnitude).
// Deterministic in seed.
func gaussianBF16(n, width int, seed uint64) []byte { return gaussian(n, width, seed, toBF16) }

// gaussian draws gaussianBF16's values and rounds each with round.
func gaussian(n, width int, seed uint64, round func(float32) uint16) []byte {
	r := rand.New(rand.NewPCG(seed, 0x6b76))
	sigma := make([]float64, width)
	for i := range sigma {
		sigma[i] = math.Exp(0.75 * r.NormFloat64())
	}
	out := make([]byte, 2*n)
	for i := range n {
		x := float32(r.NormFloat64() * sigma[i%width])
		binary.LittleEndian.PutUint16(out[2*i:], round(x))
	}
	return out
}

// toBF16 rounds x to bf16, ties to even (finite x).
func toBF16(x float32) uint16 {
	b := math.Float32bits(x)
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

func fromBF16(v uint16) float32 { return math.Float32frombits(uint32(v) << 16) }

// bf16Values encodes xs as little-endian bf16.
func bf16Values(xs ...float32) []byte {
	out := make([]byte, 2*len(xs))
	for i, x := range xs {
		var v uint16
		if x != x {
			v = 0x7fc0
		} else {
			v = toBF16(x)
		}
		binary.LittleEndian.PutUint16(out[2*i:], v)
	}
	return out
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	out := make([]byte, n)
	for i := range out {
		out[i] = byte(r.Uint32())
	}
	return out
}

// kvLikeF32 returns n float32 values shaped like one layer of KV as an
// f16 engine (llama.cpp) stores it: rows of width channels, each channel
// normal with σ in [1, 4]; one channel in 16 is an outlier channel (σ × 8)
// and one value in 500 an outlier (× 30). Deterministic in seed; every
// value lies well inside the f16 range.
func kvLikeF32(n, width int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 0xf16))
	sigma := make([]float64, width)
	for i := range sigma {
		sigma[i] = math.Exp2(2 * r.Float64())
		if r.IntN(16) == 0 {
			sigma[i] *= 8
		}
	}
	out := make([]float32, n)
	for i := range out {
		x := r.NormFloat64() * sigma[i%width]
		if r.IntN(500) == 0 {
			x *= 30
		}
		out[i] = float32(x)
	}
	return out
}

// kvLikeF16 is kvLikeF32 rounded to little-endian f16.
func kvLikeF16(n, width int, seed uint64) []byte { return f16Values(kvLikeF32(n, width, seed)...) }

// gaussianF16 is gaussianBF16's distribution (the same values for the same
// seed) rounded to f16 instead: the two dtypes on one corpus.
func gaussianF16(n, width int, seed uint64) []byte { return gaussian(n, width, seed, toF16) }

// toF16 rounds x to IEEE half, ties to even, by arithmetic on float64 (a
// reference independent of the package's bit manipulation): ±Inf beyond
// 65520, subnormals in steps of 2⁻²⁴, NaN to 0x7e00.
func toF16(x float32) uint16 {
	f := float64(x)
	var sign uint16
	if math.Signbit(f) {
		sign, f = 0x8000, -f
	}
	switch {
	case f != f:
		return 0x7e00
	case f >= 65520:
		return sign | 0x7c00
	case f < 0x1p-14: // subnormal: a whole number of 2⁻²⁴ steps
		return sign | uint16(math.RoundToEven(f*0x1p24))
	}
	frac, exp := math.Frexp(f)         // f = frac·2^exp, frac in [0.5, 1)
	m := math.RoundToEven(frac * 2048) // 11 significant bits
	if m == 2048 {
		m, exp = 1024, exp+1
	}
	return sign | uint16(exp+14)<<10 | uint16(m-1024)
}

// fromF16 widens an f16 bit pattern by arithmetic on float64 (the
// package's internal reference, independent of its bit manipulation).
func fromF16(v uint16) float32 { return float32(codec.RefF16(v)) }

// f16Values encodes xs as little-endian f16.
func f16Values(xs ...float32) []byte {
	out := make([]byte, 2*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint16(out[2*i:], toF16(x))
	}
	return out
}

// q80Rows quantizes rows of width values (width a multiple of 32) of xs
// to llama.cpp's q8_0: per block of 32 an f16 scale d = max|x|/127, then
// round(x/d) as int8. len(xs) must be whole rows.
func q80Rows(xs []float32) []byte {
	const block = 32
	out := make([]byte, 0, len(xs)/block*(2+block))
	for b := 0; b+block <= len(xs); b += block {
		g := xs[b : b+block]
		m := 0.0
		for _, x := range g {
			m = math.Max(m, math.Abs(float64(x)))
		}
		d := m / 127
		out = binary.LittleEndian.AppendUint16(out, toF16(float32(d)))
		for _, x := range g {
			q := 0.0
			if d > 0 {
				q = math.RoundToEven(float64(x) / d)
			}
			out = append(out, byte(int8(q)))
		}
	}
	return out
}
