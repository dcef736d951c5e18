package ref

import (
	"math"
	"testing"
)

func TestBF16Rounding(t *testing.T) {
	tests := []struct {
		in   float32
		want uint16
	}{
		{0, 0x0000},
		{1, 0x3f80},
		{-2, 0xc000},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie, even below: down
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie, odd below: up
		{math.Float32frombits(0x3f808001), 0x3f81}, // above the tie: up
		{math.Float32frombits(0x3f807fff), 0x3f80}, // below the tie: down
		{math.Float32frombits(0x7f7fffff), 0x7f80}, // max float32 rounds to +Inf
		{float32(math.Inf(-1)), 0xff80},
		{math.Float32frombits(0x00000001), 0x0000}, // smallest denormal
	}
	for _, tc := range tests {
		if got := toBF16(tc.in); got != tc.want {
			t.Errorf("toBF16(%g = %#08x) = %#04x, want %#04x", tc.in, math.Float32bits(tc.in), got, tc.want)
		}
	}
	if got := fromBF16(toBF16(float32(math.NaN()))); !math.IsNaN(float64(got)) {
		t.Errorf("NaN round trip = %v, want NaN", got)
	}
	// Every bf16 value survives a round trip through float32.
	for b := range 1 << 16 {
		f := fromBF16(uint16(b))
		if f != f {
			continue
		}
		if got := toBF16(f); got != uint16(b) {
			t.Fatalf("toBF16(fromBF16(%#04x)) = %#04x", b, got)
		}
	}
}

func TestExpf(t *testing.T) {
	maxRel := 0.0
	for x := float32(-87); x <= 88; x += 0.0137 {
		got := float64(expf(x))
		want := math.Exp(float64(x))
		maxRel = max(maxRel, math.Abs(got-want)/want)
	}
	if maxRel > 3e-7 {
		t.Errorf("expf: max relative error %g over [-87, 88], want ≤ 3e-7", maxRel)
	}
	if got := expf(-1000); got <= 0 || got > 1e-37 {
		t.Errorf("expf(-1000) = %g, want the clamped e^-87", got)
	}
	if got := expf(0); got != 1 {
		t.Errorf("expf(0) = %g, want 1", got)
	}
}

// TestVectorHelpersMatchScalar checks that the active kernels' softmax and
// SwiGLU agree with the portable ones to rounding (the SIMD softmax sums
// in another order).
func TestVectorHelpersMatchScalar(t *testing.T) {
	for _, n := range []int{1, 7, 8, 9, 64, 100} {
		s := make([]float32, n)
		fill(s, uniform(5, uint64(n), 10))
		a, b := append([]float32(nil), s...), append([]float32(nil), s...)
		softmax(a, 0.3)
		softmaxGo(b, 0.3)
		var total float64
		for i := range a {
			if math.Abs(float64(a[i]-b[i])) > 1e-5*float64(b[i]) {
				t.Fatalf("n %d: softmax[%d] = %g, softmaxGo %g", n, i, a[i], b[i])
			}
			total += float64(a[i])
		}
		if math.Abs(total-1) > 1e-5 {
			t.Errorf("n %d: softmax sums to %g", n, total)
		}
		g, u := make([]float32, n), make([]float32, n)
		fill(g, uniform(6, uint64(n), 4))
		fill(u, uniform(7, uint64(n), 1))
		da, db := make([]float32, n), make([]float32, n)
		swiGLU(da, g, u)
		swiGLUGo(db, g, u)
		for i := range da {
			if math.Abs(float64(da[i]-db[i])) > 1e-6*(1+math.Abs(float64(db[i]))) {
				t.Fatalf("n %d: swiGLU[%d] = %g, swiGLUGo %g", n, i, da[i], db[i])
			}
		}
	}
}
