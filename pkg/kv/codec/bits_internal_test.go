package codec

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// refE4M3 rounds q to the nearest finite e4m3 value by search: ties go to
// the even code (mantissa LSB 0); beyond ±448 it saturates; NaN gives NaN.
func refE4M3(q float32) byte {
	if q != q {
		return 0x7f
	}
	best, bestDiff := byte(0), math.Inf(1)
	for c := 0; c < 256; c++ {
		v := e4m3Values[c]
		if v != v || (c&0x80 != 0) != math.Signbit(float64(q)) {
			continue
		}
		d := math.Abs(float64(v) - float64(q))
		if d < bestDiff || (d == bestDiff && c&1 == 0) {
			best, bestDiff = byte(c), d
		}
	}
	return best
}

func TestE4M3Table(t *testing.T) {
	for _, tc := range []struct {
		code byte
		want float64
	}{{0x00, 0}, {0x01, 1.0 / 512}, {0x07, 7.0 / 512}, {0x08, 1.0 / 64}, {0x38, 1}, {0x39, 1.125}, {0x7e, 448}, {0xfe, -448}, {0xb8, -1}} {
		if got := e4m3Values[tc.code]; float64(got) != tc.want {
			t.Errorf("e4m3 %#02x = %g, want %g", tc.code, got, tc.want)
		}
	}
	if v := e4m3Values[0x7f]; v == v {
		t.Errorf("e4m3 0x7f = %g, want NaN", v)
	}
}

// TestF32ToE4M3 checks the bit-twiddling rounding against the search on every
// code's value and midpoints, every bf16 pattern, and random float32s.
func TestF32ToE4M3(t *testing.T) {
	check := func(q float32) {
		t.Helper()
		if got, want := f32ToE4M3(q), refE4M3(q); got != want && !(q != q && got&0x7f == 0x7f) {
			t.Fatalf("f32ToE4M3(%g [%#08x]) = %#02x (%g), want %#02x (%g)", q, math.Float32bits(q), got, e4m3Values[got], want, e4m3Values[want])
		}
	}
	for c := 0; c < 0x7e; c++ {
		lo, hi := e4m3Values[c], e4m3Values[c+1]
		mid := (lo + hi) / 2 // exact in float32
		for _, q := range []float32{lo, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1000), hi} {
			check(q)
			check(-q)
		}
	}
	for v := range 1 << 16 {
		check(bf16ToF32(uint16(v)))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		check(math.Float32frombits(r.Uint32()))
		check(float32(r.NormFloat64() * 100))
	}
}

func TestF32ToBF16(t *testing.T) {
	for _, tc := range []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1
		{0x3f808000, 0x3f80}, // tie, even stays
		{0x3f818000, 0x3f82}, // tie, odd rounds up
		{0x3f808001, 0x3f81}, // above the tie
		{0x7f7fffff, 0x7f80}, // max float32 rounds to Inf
		{0x80000000, 0x8000}, // -0
		{0x7f800000, 0x7f80}, // Inf
	} {
		if got := f32ToBF16(math.Float32frombits(tc.in)); got != tc.want {
			t.Errorf("f32ToBF16(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
	if got := f32ToBF16(float32(math.NaN())); got&0x7f80 != 0x7f80 || got&0x7f == 0 {
		t.Errorf("f32ToBF16(NaN) = %#04x, not a NaN", got)
	}
	for v := range 1 << 16 { // every bf16 survives the round trip
		if got := f32ToBF16(bf16ToF32(uint16(v))); got != uint16(v) && v&0x7fff <= 0x7f80 {
			t.Fatalf("f32ToBF16(bf16 %#04x) = %#04x", v, got)
		}
	}
}

// TestSplitMergeBF16 splits every bf16 pattern, at every tail length of the
// 4-value fast path, and checks the planes and the inverse.
func TestSplitMergeBF16(t *testing.T) {
	raw := make([]byte, 2<<16)
	for v := range 1 << 16 {
		binary.LittleEndian.PutUint16(raw[2*v:], uint16(v*40503)) // all patterns, shuffled
	}
	for _, n := range []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 1 << 16} {
		e, s := make([]byte, n), make([]byte, n)
		splitBF16(e, s, raw[:2*n])
		for i := range n {
			v := binary.LittleEndian.Uint16(raw[2*i:])
			if e[i] != byte(v>>7) || s[i] != byte(v>>8)&0x80|byte(v)&0x7f {
				t.Fatalf("n=%d value %d (%#04x): planes %#02x %#02x", n, i, v, e[i], s[i])
			}
		}
		back := make([]byte, 2*n)
		mergeBF16(back, e, s)
		if string(back) != string(raw[:2*n]) {
			t.Fatalf("n=%d: merge(split(x)) != x", n)
		}
	}
}

func BenchmarkSplitBF16(b *testing.B) {
	raw := make([]byte, 2*bf16Block)
	for i := range raw {
		raw[i] = byte(i * 131)
	}
	e, s := make([]byte, bf16Block), make([]byte, bf16Block)
	b.SetBytes(int64(len(raw)))
	defer CPUThroughput(b, len(raw))()
	for b.Loop() {
		splitBF16(e, s, raw)
	}
}

func BenchmarkMergeBF16(b *testing.B) {
	raw := make([]byte, 2*bf16Block)
	e, s := make([]byte, bf16Block), make([]byte, bf16Block)
	for i := range e {
		e[i], s[i] = byte(i*131), byte(i*7)
	}
	b.SetBytes(int64(len(raw)))
	defer CPUThroughput(b, len(raw))()
	for b.Loop() {
		mergeBF16(raw, e, s)
	}
}

func BenchmarkWorthCoding(b *testing.B) {
	p := make([]byte, bf16Block)
	for i := range p {
		p[i] = byte(i * 131)
	}
	b.SetBytes(int64(2 * len(p))) // per raw byte of the block
	defer CPUThroughput(b, 2*len(p))()
	for b.Loop() {
		worthCoding(p)
	}
}

func TestF32ToInt8(t *testing.T) {
	for _, tc := range []struct {
		in   float32
		want int8
	}{{0, 0}, {0.5, 0}, {1.5, 2}, {2.5, 2}, {-0.5, 0}, {-1.5, -2}, {-2.5, -2}, {126.5, 126}, {126.6, 127}, {127, 127},
		{1000, 127}, {-1000, -127}, {float32(math.Inf(-1)), -127}, {float32(math.NaN()), 0}, {0.49999997, 0}, {-3.7, -4}} {
		if got := int8(f32ToInt8(tc.in)); got != tc.want {
			t.Errorf("f32ToInt8(%g) = %d, want %d", tc.in, got, tc.want)
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		q := float32((r.Float64()*2 - 1) * 127)
		if got, want := int8(f32ToInt8(q)), int8(math.RoundToEven(float64(q))); got != want {
			t.Fatalf("f32ToInt8(%g) = %d, want %d", q, got, want)
		}
	}
}
