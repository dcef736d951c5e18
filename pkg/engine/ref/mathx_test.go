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
// SwiGLU helpers agree with the portable ones: bit for bit element-wise
// (the same operations), and the sums to rounding.
func TestVectorHelpersMatchScalar(t *testing.T) {
	for _, n := range []int{1, 7, 8, 9, 64, 100} {
		s := make([]float32, n)
		fill(s, uniform(5, uint64(n), 10))
		a, b := append([]float32(nil), s...), append([]float32(nil), s...)
		sa, sb := expSub(a, 3), expSubGo(b, 3)
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("n %d: expSub[%d] = %g, expSubGo %g", n, i, a[i], b[i])
			}
		}
		if math.Abs(float64(sa-sb)) > 1e-6*math.Abs(float64(sb)) {
			t.Errorf("n %d: expSub sum %g, expSubGo %g", n, sa, sb)
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

// TestAttentionHelpersMatchScalar checks the active kernels' attention
// helpers against the portable ones, to rounding, for several head dims.
func TestAttentionHelpersMatchScalar(t *testing.T) {
	for _, d := range []int{8, 16, 24, 64, 128} {
		const keys = 37
		stride := 3 * d // another head's values in between
		q := make([]float32, d)
		fill(q, uniform(8, uint64(d), 1))
		kv := make([]uint16, keys*stride)
		for i := range kv {
			kv[i] = toBF16(uniform(9, uint64(d), 1)(i))
		}
		off := d
		sa, sb := make([]float32, keys), make([]float32, keys)
		ma, mb := scoresBF16(sa, q, kv[off:], stride, 0.25), scoresBF16Go(sb, q, kv[off:], stride, 0.25)
		if math.Abs(float64(ma-mb)) > 1e-5 {
			t.Errorf("d %d: max score %g, portable %g", d, ma, mb)
		}
		for j := range sa {
			if math.Abs(float64(sa[j]-sb[j])) > 1e-5*float64(d) {
				t.Fatalf("d %d: score %d = %g, portable %g", d, j, sa[j], sb[j])
			}
		}
		oa, ob := make([]float32, d), make([]float32, d)
		valuesBF16(oa, sb, 0.5, kv[off:], stride)
		valuesBF16Go(ob, sb, 0.5, kv[off:], stride)
		for i := range oa {
			if math.Abs(float64(oa[i]-ob[i])) > 1e-5*(1+math.Abs(float64(ob[i]))) {
				t.Fatalf("d %d: value %d = %g, portable %g", d, i, oa[i], ob[i])
			}
		}
	}
}
