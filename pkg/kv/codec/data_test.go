package codec_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// gaussianBF16 returns n little-endian bf16 values laid out like one layer of
// KV: rows of width channels, each channel Gaussian with its own spread
// (log-normal, as attention K/V channels differ by orders of magnitude).
// Deterministic in seed.
func gaussianBF16(n, width int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x6b76))
	sigma := make([]float64, width)
	for i := range sigma {
		sigma[i] = math.Exp(0.75 * r.NormFloat64())
	}
	out := make([]byte, 2*n)
	for i := range n {
		x := float32(r.NormFloat64() * sigma[i%width])
		binary.LittleEndian.PutUint16(out[2*i:], toBF16(x))
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
