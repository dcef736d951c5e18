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

// refF16 widens an f16 bit pattern by arithmetic on float64, independent
// of f16ToF32's bit manipulation.
func refF16(v uint16) float64 {
	e, m := int(v>>10&0x1f), float64(v&0x3ff)
	var f float64
	switch e {
	case 0:
		f = m * 0x1p-24
	case 31:
		f = math.Inf(1)
		if m != 0 {
			f = math.NaN()
		}
	default:
		f = math.Ldexp(1+m/1024, e-15)
	}
	if v&0x8000 != 0 {
		f = -f
	}
	return f
}

func TestF16ToF32(t *testing.T) {
	for v := range 1 << 16 {
		got, want := f16ToF32(uint16(v)), refF16(uint16(v))
		if want != want {
			if got == got || math.Float32bits(got)&0x7fffff != uint32(v&0x3ff)<<13 || math.Signbit(float64(got)) != (v&0x8000 != 0) {
				t.Fatalf("f16ToF32(%#04x) = %g [%#08x], want NaN with its payload and sign", v, got, math.Float32bits(got))
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("f16ToF32(%#04x) = %g, want %g", v, got, want)
		}
	}
}

// refF32ToF16 rounds q to f16 by search over the neighbours of its
// truncation: nearest, ties to the even pattern, Inf from 65520 on.
func refF32ToF16(q float32) uint16 {
	f := float64(q)
	if f != f {
		return 0x7e00
	}
	var sign uint16
	if math.Signbit(f) {
		sign, f = 0x8000, -f
	}
	if f >= 65520 {
		return sign | 0x7c00
	}
	best, bestDiff := uint16(0), math.Inf(1)
	for v := uint16(0); v <= 0x7bff; v++ {
		d := math.Abs(refF16(v) - f)
		if d < bestDiff || (d == bestDiff && v&1 == 0) {
			best, bestDiff = v, d
		}
		if refF16(v) > f {
			break
		}
	}
	return sign | best
}

// TestF32ToF16 checks the rounding on every f16 value, the midpoints
// between neighbours and their float32 neighbours (the ties), the overflow
// and underflow edges, NaN and random float32s.
func TestF32ToF16(t *testing.T) {
	check := func(q float32, want uint16) {
		t.Helper()
		if got := f32ToF16(q); got != want {
			t.Fatalf("f32ToF16(%g [%#08x]) = %#04x (%g), want %#04x (%g)", q, math.Float32bits(q), got, refF16(got), want, refF16(want))
		}
	}
	for v := uint16(0); v < 0x7c00; v++ {
		x := float32(refF16(v))
		check(x, v)
		check(-x, v|0x8000)
		// The midpoint to the next value is exact in float32: ties go to
		// the even pattern, anything off the tie to the nearer side.
		next := float32(refF16(v + 1)) // v+1 = 0x7c00 is Inf: midpoint 65520
		if v == 0x7bff {
			next = 65536
		}
		mid := x + (next-x)/2
		even := v
		if v&1 == 1 {
			even = v + 1
		}
		check(mid, even)
		check(-mid, even|0x8000)
		check(math.Nextafter32(mid, 0), v)
		check(math.Nextafter32(mid, float32(math.Inf(1))), v+1)
	}
	for _, tc := range []struct {
		in   float32
		want uint16
	}{
		{65504, 0x7bff}, {65519.99, 0x7bff}, {65520, 0x7c00}, {1e10, 0x7c00}, {float32(math.Inf(1)), 0x7c00}, {float32(math.Inf(-1)), 0xfc00},
		{math.MaxFloat32, 0x7c00}, {0x1p-25, 0}, {math.Nextafter32(0x1p-25, 1), 1}, {0x1p-26, 0}, {math.SmallestNonzeroFloat32, 0},
		{-math.SmallestNonzeroFloat32, 0x8000}, {float32(math.Copysign(0, -1)), 0x8000}, {0x1p-14, 0x0400}, {math.Nextafter32(0x1p-14, 0), 0x0400},
	} {
		check(tc.in, tc.want)
	}
	if got := f32ToF16(float32(math.NaN())); got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
		t.Errorf("f32ToF16(NaN) = %#04x, not a NaN", got)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		var q float32
		switch r.IntN(3) {
		case 0:
			q = float32(r.NormFloat64() * 4)
		case 1:
			q = float32(r.NormFloat64() * 1e-5) // subnormal f16s
		default:
			q = float32(math.Ldexp(r.Float64()*2-1, r.IntN(40)-24))
		}
		check(q, refF32ToF16(q))
	}
}

// TestSplitMergeF16 splits every f16 pattern, at every tail length of the
// fast path, and checks the planes and the inverse.
func TestSplitMergeF16(t *testing.T) {
	raw := make([]byte, 2<<16)
	for v := range 1 << 16 {
		binary.LittleEndian.PutUint16(raw[2*v:], uint16(v*40503))
	}
	for _, n := range []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 1 << 16} {
		hi, lo := make([]byte, n), make([]byte, n)
		splitF16(hi, lo, raw[:2*n])
		for i := range n {
			v := binary.LittleEndian.Uint16(raw[2*i:])
			if hi[i] != byte(v>>8) || lo[i] != byte(v) {
				t.Fatalf("n=%d value %d (%#04x): planes %#02x %#02x", n, i, v, hi[i], lo[i])
			}
		}
		back := make([]byte, 2*n)
		mergeF16(back, hi, lo)
		if string(back) != string(raw[:2*n]) {
			t.Fatalf("n=%d: merge(split(x)) != x", n)
		}
	}
}

func BenchmarkSplitF16(b *testing.B) {
	raw := make([]byte, 2*bf16Block)
	for i := range raw {
		raw[i] = byte(i * 131)
	}
	hi, lo := make([]byte, bf16Block), make([]byte, bf16Block)
	b.SetBytes(int64(len(raw)))
	defer CPUThroughput(b, len(raw))()
	for b.Loop() {
		splitF16(hi, lo, raw)
	}
}

func BenchmarkMergeF16(b *testing.B) {
	raw := make([]byte, 2*bf16Block)
	hi, lo := make([]byte, bf16Block), make([]byte, bf16Block)
	for i := range hi {
		hi[i], lo[i] = byte(i*131), byte(i*7)
	}
	b.SetBytes(int64(len(raw)))
	defer CPUThroughput(b, len(raw))()
	for b.Loop() {
		mergeF16(raw, hi, lo)
	}
}
