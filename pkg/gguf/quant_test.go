package gguf

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

func TestF16RoundTripsEveryHalf(t *testing.T) {
	for h := range 1 << 16 {
		f := F16ToF32(uint16(h))
		got := F32ToF16(f)
		if math.IsNaN(float64(f)) {
			if got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
				t.Errorf("F32ToF16(NaN from %#04x) = %#04x, not a NaN", h, got)
			}
			continue
		}
		if got != uint16(h) {
			t.Errorf("F32ToF16(F16ToF32(%#04x) = %g) = %#04x", h, f, got)
		}
	}
}

func TestF32ToF16Rounding(t *testing.T) {
	tests := []struct {
		name string
		f    float32
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"minus two", -2, 0xc000},
		{"minus zero", float32(math.Copysign(0, -1)), 0x8000},
		{"largest half", 65504, 0x7bff},
		{"just below the tie to inf", 65519.996, 0x7bff},
		{"tie between 65504 and 65536 goes to even: inf", 65520, 0x7c00},
		{"overflow", 1e6, 0x7c00},
		{"inf", float32(math.Inf(1)), 0x7c00},
		{"minus inf", float32(math.Inf(-1)), 0xfc00},
		{"tie above one goes to even (down)", 1 + 0x1p-11, 0x3c00},
		{"tie above 1+ulp goes to even (up)", 1 + 3*0x1p-11, 0x3c02},
		{"above the tie rounds up", 1 + 0x1p-11 + 0x1p-20, 0x3c01},
		{"smallest normal", 0x1p-14, 0x0400},
		{"smallest subnormal", 0x1p-24, 0x0001},
		{"half the smallest subnormal ties to zero", 0x1p-25, 0x0000},
		{"above half the smallest subnormal", 0x1.8p-25, 0x0001},
		{"subnormal tie 1.5 ulp goes to 2", 3 * 0x1p-25, 0x0002},
		{"subnormal rounding up into the normals", 0x1p-14 - 0x1p-26, 0x0400},
		{"tiny", 1e-10, 0x0000},
		{"float32 subnormal", 1e-40, 0x0000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := F32ToF16(tt.f); got != tt.want {
				t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tt.f, got, tt.want)
			}
		})
	}
	if h := F32ToF16(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("F32ToF16(NaN) = %#04x, not a NaN", h)
	}
}

// TestF32ToF16IsNearest checks on random floats in the half range that no
// neighbouring half is nearer than the one chosen.
func TestF32ToF16IsNearest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		f := float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(40)-25)))
		if math.Abs(float64(f)) > 65504 {
			continue
		}
		h := F32ToF16(f)
		err := math.Abs(float64(f) - float64(F16ToF32(h)))
		for _, n := range []uint16{h - 1, h + 1} {
			v := F16ToF32(n)
			if n&0x7fff >= 0x7c00 || math.Signbit(float64(v)) != math.Signbit(float64(f)) {
				continue
			}
			if e := math.Abs(float64(f) - float64(v)); e < err {
				t.Fatalf("F32ToF16(%g) = %#04x (%g, error %g), but %#04x (%g) is nearer (%g)", f, h, F16ToF32(h), err, n, v, e)
			}
		}
	}
}

func TestQ8BlockLayout(t *testing.T) {
	x := make([]float32, 32)
	for j := range x {
		x[j] = float32(j - 16) // amax 16
	}
	raw, err := AppendEncoded(nil, Q8_0, x)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != 34 {
		t.Fatalf("one block encodes to %d bytes, want 34", len(raw))
	}
	if d, want := binary.LittleEndian.Uint16(raw), F32ToF16(16.0/127); d != want {
		t.Errorf("scale %#04x, want %#04x (16/127)", d, want)
	}
	for j, q := range raw[2:] {
		want := int8(math.Round(float64(x[j] * (127.0 / 16))))
		if int8(q) != want {
			t.Errorf("qs[%d] = %d, want %d", j, int8(q), want)
		}
	}
	if int8(raw[2]) != -127 {
		t.Errorf("qs[0] for -amax = %d, want -127", int8(raw[2]))
	}
}

func TestQ8RoundTripWithinBound(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	block := func(f func(j int) float64) []float32 {
		x := make([]float32, 32)
		for j := range x {
			x[j] = float32(f(j))
		}
		return x
	}
	tests := []struct {
		name string
		x    []float32
	}{
		{"zeros", block(func(int) float64 { return 0 })},
		{"constant", block(func(int) float64 { return 0.7 })},
		{"ramp", block(func(j int) float64 { return float64(j) - 15.5 })},
		{"normal", block(func(int) float64 { return r.NormFloat64() })},
		{"one spike", block(func(j int) float64 { return map[bool]float64{true: 1000, false: 0.001}[j == 5] })},
		{"wide", block(func(int) float64 { return r.NormFloat64() * 3e4 })},
		{"tiny (subnormal scale)", block(func(int) float64 { return r.NormFloat64() * 1e-4 })},
		{"uniform weights", block(func(int) float64 { return (r.Float64()*2 - 1) * 0.06 })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := AppendEncoded(nil, Q8_0, tt.x)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeFloat32(Q8_0, raw)
			if err != nil {
				t.Fatal(err)
			}
			var amax float32
			for _, v := range tt.x {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			bound := Q8Bound(amax)
			for j := range tt.x {
				if e := math.Abs(float64(got[j]) - float64(tt.x[j])); e > bound {
					t.Errorf("value %d: %g decodes to %g, error %g > bound %g", j, tt.x[j], got[j], e, bound)
				}
				if tt.x[j] == 0 && got[j] != 0 {
					t.Errorf("value %d: 0 decodes to %g", j, got[j])
				}
			}
		})
	}
}

func TestEncodeDecodeErrors(t *testing.T) {
	if _, err := AppendEncoded(nil, Q8_0, make([]float32, 33)); err == nil {
		t.Error("encoding 33 values as Q8_0 succeeded")
	}
	if _, err := AppendEncoded(nil, Q4_0, make([]float32, 32)); err == nil {
		t.Error("encoding Q4_0 succeeded")
	}
	for _, tt := range []struct {
		typ TensorType
		n   int
	}{{F32, 6}, {F16, 3}, {Q8_0, 35}, {Q4_K, 144}} {
		if _, err := DecodeFloat32(tt.typ, make([]byte, tt.n)); err == nil {
			t.Errorf("decoding %d bytes of %v succeeded", tt.n, tt.typ)
		}
	}
	if n, err := EncodedSize(Q8_0, 64); err != nil || n != 68 {
		t.Errorf("EncodedSize(Q8_0, 64) = %d, %v; want 68", n, err)
	}
	if _, err := EncodedSize(Q8_0, 48); err == nil {
		t.Error("EncodedSize(Q8_0, 48) succeeded")
	}
}

func TestParseTensorType(t *testing.T) {
	for s, want := range map[string]TensorType{"f32": F32, "F16": F16, "q8_0": Q8_0, "Q4_K": Q4_K, "bf16": BF16} {
		if got, err := ParseTensorType(s); err != nil || got != want {
			t.Errorf("ParseTensorType(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := ParseTensorType("q9"); err == nil {
		t.Error(`ParseTensorType("q9") succeeded`)
	}
}
