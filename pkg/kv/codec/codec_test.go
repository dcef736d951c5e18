package codec_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// floatDTypes are the dtypes every codec takes.
var floatDTypes = []engine.DType{engine.BF16, engine.F16}

func TestRegistry(t *testing.T) {
	var names []string
	lossy := false
	for i, c := range codec.All() {
		names = append(names, c.Name())
		if c.Lossless() && lossy {
			t.Errorf("All()[%d] %s: lossless codec after a lossy one", i, c.Name())
		}
		lossy = lossy || !c.Lossless()
		byName, err := codec.ByName(c.Name())
		if err != nil || byName.ID() != c.ID() {
			t.Errorf("ByName(%q) = %v, %v", c.Name(), byName, err)
		}
		byID, err := codec.ByID(c.ID())
		if err != nil || byID.Name() != c.Name() {
			t.Errorf("ByID(%d) = %v, %v", c.ID(), byID, err)
		}
		if got := c.ID().String(); got != c.Name() {
			t.Errorf("ID(%d).String() = %q, want %q", c.ID(), got, c.Name())
		}
	}
	if diff := cmp.Diff([]string{"none", "s2", "zstd", "bf16", "fp8", "int8"}, names); diff != "" {
		t.Errorf("All() names (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(names, codec.Names()); diff != "" {
		t.Errorf("Names() (-All +Names):\n%s", diff)
	}
	if got := len(codec.LosslessCodecs()); got != 4 {
		t.Errorf("LosslessCodecs() has %d codecs, want 4", got)
	}
	if _, err := codec.ByName("lz4"); !errors.Is(err, codec.ErrUnknownCodec) {
		t.Errorf("ByName(lz4) = %v, want ErrUnknownCodec", err)
	}
	if _, err := codec.ByID(6); !errors.Is(err, codec.ErrUnknownCodec) {
		t.Errorf("ByID(6) = %v, want ErrUnknownCodec", err)
	}
	if got := codec.ID(200).String(); got != "codec(200)" {
		t.Errorf("ID(200).String() = %q", got)
	}
	// The plane codec's aliases: the same codec, which names itself "bf16".
	if diff := cmp.Diff(map[string]string{"f16": "bf16", "planes": "bf16"}, codec.Aliases()); diff != "" {
		t.Errorf("Aliases() (-want +got):\n%s", diff)
	}
	for alias := range codec.Aliases() {
		c, err := codec.ByName(alias)
		if err != nil || c.ID() != codec.BF16 || c.Name() != "bf16" {
			t.Errorf("ByName(%q) = %v, %v; want the bf16 codec", alias, c, err)
		}
	}
}

type input struct {
	name string
	raw  []byte
}

// losslessInputs covers the shapes the lossless codecs must get exactly
// right for dtype dt: empty, odd lengths, sizes around the plane codec's
// block and Huffman thresholds, runs, incompressible bytes and special
// values of the dtype.
func losslessInputs(dt engine.DType) []input {
	ins := []input{
		{"empty", nil},
		{"one byte", []byte{0xab}},
		{"three bytes", []byte{1, 2, 3}},
		{"zeros 64 KiB", make([]byte, 64<<10)},
		{"random 100001", randomBytes(100001, 1)},
	}
	switch dt {
	case engine.BF16:
		special := bf16Values(0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
			float32(math.NaN()), math.SmallestNonzeroFloat32, -1e-39, math.MaxFloat32, 1, -2, 3.5)
		mixed := gaussianBF16(70000, 128, 4)
		copy(mixed[1000:], make([]byte, 30000)) // a run of zeros inside a block
		ins = append(ins,
			input{"special values", special},
			input{"special values odd", append(bytes.Clone(special), 0x5a)},
			input{"constant", bytes.Repeat(bf16Values(0.125), 1000)},
			input{"mixed runs", mixed})
		for _, vals := range []int{1, 3, 4, 5, 255, 256, 257, 4099, 65535, 65536, 65537, 200003} {
			ins = append(ins, input{fmt.Sprintf("gaussian %d values", vals), gaussianBF16(vals, 64, uint64(vals))})
		}
		ins = append(ins, input{"gaussian odd 131073 bytes", append(gaussianBF16(65536, 128, 9), 0x7f)})
	case engine.F16:
		special := f16Values(0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
			float32(math.NaN()), 0x1p-24, -0x1p-24, 0x1p-14, 6e-5, 65504, -65504, 1, -2, 3.5)
		special = append(special, 0x01, 0x7c, 0xff, 0xff) // a signalling NaN and a negative NaN, as bit patterns
		mixed := kvLikeF16(70000, 128, 4)
		copy(mixed[1000:], make([]byte, 30000))
		ins = append(ins,
			input{"special values", special},
			input{"special values odd", append(bytes.Clone(special), 0x5a)},
			input{"constant", bytes.Repeat(f16Values(0.125), 1000)},
			input{"mixed runs", mixed},
			input{"gaussian 70000 values", gaussianF16(70000, 128, 5)})
		for _, vals := range []int{1, 3, 4, 5, 255, 256, 257, 4099, 65535, 65536, 65537, 200003} {
			ins = append(ins, input{fmt.Sprintf("kv-like %d values", vals), kvLikeF16(vals, 64, uint64(vals))})
		}
		ins = append(ins, input{"kv-like odd 131073 bytes", append(kvLikeF16(65536, 128, 9), 0x7f)})
	case engine.Q8_0:
		ins = append(ins,
			input{"one block", q80Rows(kvLikeF32(32, 32, 1))},
			input{"rows of 128", q80Rows(kvLikeF32(128*300, 128, 2))},
			input{"rows with zero blocks", q80Rows(append(make([]float32, 256), kvLikeF32(4096, 128, 3)...))})
	}
	return ins
}

// losslessCases pairs every lossless codec with every dtype it supports.
func losslessCases() []struct {
	c  codec.Codec
	dt engine.DType
} {
	var out []struct {
		c  codec.Codec
		dt engine.DType
	}
	for _, dt := range []engine.DType{engine.BF16, engine.F16, engine.Q8_0} {
		for _, c := range codec.LosslessCodecs() {
			if c.Supports(dt) == nil {
				out = append(out, struct {
					c  codec.Codec
					dt engine.DType
				}{c, dt})
			}
		}
	}
	return out
}

func TestLosslessRoundTrip(t *testing.T) {
	prefix := []byte("prefix")
	for _, tc := range losslessCases() {
		c, dt := tc.c, tc.dt
		for _, in := range losslessInputs(dt) {
			t.Run(fmt.Sprintf("%s/%v/%s", c.Name(), dt, in.name), func(t *testing.T) {
				enc, err := c.Encode(bytes.Clone(prefix), in.raw, dt)
				if err != nil {
					t.Fatalf("Encode: %v", err)
				}
				if !bytes.HasPrefix(enc, prefix) {
					t.Fatalf("Encode did not append to dst")
				}
				enc = enc[len(prefix):]
				got, err := c.Decode(bytes.Clone(prefix), enc, len(in.raw), dt)
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if !bytes.Equal(got[len(prefix):], in.raw) || !bytes.HasPrefix(got, prefix) {
					t.Fatalf("round trip of %d bytes is not bit-exact", len(in.raw))
				}
			})
		}
	}
}

// TestLosslessRoundTripRefKV round-trips KV exported from the reference
// engine (the tiny preset), chunk by layer as a prefill worker sends it.
func TestLosslessRoundTripRefKV(t *testing.T) {
	layers, err := exportRefKV("tiny", 300)
	if err != nil {
		t.Fatalf("reference engine KV: %v", err)
	}
	for _, c := range codec.LosslessCodecs() {
		for l, raw := range layers {
			enc, err := c.Encode(nil, raw, engine.BF16)
			if err != nil {
				t.Fatalf("%s layer %d: Encode: %v", c.Name(), l, err)
			}
			got, err := c.Decode(nil, enc, len(raw), engine.BF16)
			if err != nil || !bytes.Equal(got, raw) {
				t.Fatalf("%s layer %d: round trip of %d bytes not bit-exact (err %v)", c.Name(), l, len(raw), err)
			}
		}
	}
}

func TestPlaneCodecCompresses(t *testing.T) {
	c := mustCodec(t, "bf16")
	for _, tc := range []struct {
		name     string
		dt       engine.DType
		raw      []byte
		minRatio float64
	}{
		// Gaussian bf16 carries ≈11 bits per value: expect well above 1.3×.
		{"gaussian bf16", engine.BF16, gaussianBF16(1<<17, 128, 1), 1.3},
		// f16 keeps 10 mantissa bits, ≈8 of them noise in the low plane:
		// the high plane's ≈5.5 bits give ≈1.15×.
		{"kv-like f16", engine.F16, kvLikeF16(1<<17, 128, 1), 1.1},
		{"gaussian f16", engine.F16, gaussianF16(1<<17, 128, 1), 1.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := c.Encode(nil, tc.raw, tc.dt)
			if err != nil {
				t.Fatal(err)
			}
			ratio := float64(len(tc.raw)) / float64(len(enc))
			if ratio < tc.minRatio {
				t.Errorf("ratio %.3f, want ≥ %.2f", ratio, tc.minRatio)
			}
			t.Logf("ratio %.3f", ratio)
			// Incompressible input grows by at most a few bytes per block.
			raw := randomBytes(1<<18, 2)
			if enc, err = c.Encode(nil, raw, tc.dt); err != nil {
				t.Fatal(err)
			}
			if len(enc) > len(raw)+8 {
				t.Errorf("random %d bytes encoded to %d", len(raw), len(enc))
			}
		})
	}
}

// TestPlaneCodecSplitsByDType checks that the dtype, not the data, picks the
// split: one f16 input, encoded as bf16 and as f16, gives different
// payloads that each decode only with their own dtype.
func TestPlaneCodecSplitsByDType(t *testing.T) {
	c := mustCodec(t, "bf16")
	raw := kvLikeF16(4096, 128, 3)
	asBF16, err := c.Encode(nil, raw, engine.BF16)
	if err != nil {
		t.Fatal(err)
	}
	asF16, err := c.Encode(nil, raw, engine.F16)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(asBF16, asF16) {
		t.Fatal("bf16 and f16 encodings are equal")
	}
	for _, tc := range []struct {
		enc  []byte
		dt   engine.DType
		want bool
	}{{asBF16, engine.BF16, true}, {asF16, engine.F16, true}, {asBF16, engine.F16, false}, {asF16, engine.BF16, false}} {
		got, err := c.Decode(nil, tc.enc, len(raw), tc.dt)
		if err != nil {
			t.Fatalf("decode as %v: %v", tc.dt, err)
		}
		if bytes.Equal(got, raw) != tc.want {
			t.Errorf("decode as %v: equal to the input %v, want %v", tc.dt, !tc.want, tc.want)
		}
	}
}

// TestDTypeSupport checks which codec takes which dtype, and that a codec
// refuses the others in Supports, Encode and Decode alike.
func TestDTypeSupport(t *testing.T) {
	want := map[string][]engine.DType{
		"none": {engine.BF16, engine.F16, engine.Q8_0},
		"s2":   {engine.BF16, engine.F16, engine.Q8_0},
		"zstd": {engine.BF16, engine.F16, engine.Q8_0},
		"bf16": {engine.BF16, engine.F16},
		"fp8":  {engine.BF16, engine.F16},
		"int8": {engine.BF16, engine.F16},
	}
	raw := q80Rows(kvLikeF32(256, 128, 1)) // 272 bytes: even, so only the dtype is wrong
	for _, c := range codec.All() {
		for _, dt := range []engine.DType{engine.BF16, engine.F16, engine.Q8_0, 0, 9} {
			t.Run(fmt.Sprintf("%s/%v", c.Name(), dt), func(t *testing.T) {
				ok := slices.Contains(want[c.Name()], dt) ||
					!dt.Valid() && slices.Contains(want[c.Name()], engine.Q8_0) // opaque codecs take any dtype
				err := c.Supports(dt)
				if ok {
					if err != nil {
						t.Fatalf("Supports = %v, want nil", err)
					}
					return
				}
				if !errors.Is(err, codec.ErrDType) {
					t.Fatalf("Supports = %v, want ErrDType", err)
				}
				if got, err := c.Encode([]byte("dst"), raw, dt); !errors.Is(err, codec.ErrDType) || string(got) != "dst" {
					t.Errorf("Encode = %q, %v; want dst unchanged, ErrDType", got, err)
				}
				enc, err := c.Encode(nil, raw, engine.F16)
				if err != nil {
					t.Fatal(err)
				}
				if got, err := c.Decode([]byte("dst"), enc, len(raw), dt); !errors.Is(err, codec.ErrDType) || string(got) != "dst" {
					t.Errorf("Decode = %q, %v; want dst unchanged, ErrDType", got, err)
				}
			})
		}
	}
}

func TestDecodeRejectsWrongLengths(t *testing.T) {
	for _, dt := range floatDTypes {
		raw := gaussianBF16(3000, 64, 5)
		if dt == engine.F16 {
			raw = kvLikeF16(3000, 64, 5)
		}
		for _, c := range codec.All() {
			enc, err := c.Encode(nil, raw, dt)
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				name   string
				enc    []byte
				rawLen int
			}{
				{"raw length -1", enc, len(raw) - 1},
				{"raw length +1", enc, len(raw) + 1},
				{"raw length +2", enc, len(raw) + 2},
				{"raw length 0", enc, 0},
				{"negative raw length", enc, -1},
				{"truncated", enc[:len(enc)-1], len(raw)},
				{"half", enc[:len(enc)/2], len(raw)},
				{"trailing byte", append(bytes.Clone(enc), 0), len(raw)},
				{"empty", nil, len(raw)},
			} {
				t.Run(fmt.Sprintf("%s/%v/%s", c.Name(), dt, tc.name), func(t *testing.T) {
					dst := []byte("keep")
					got, err := c.Decode(dst, tc.enc, tc.rawLen, dt)
					if !errors.Is(err, codec.ErrCorrupt) {
						t.Fatalf("Decode = %v, want ErrCorrupt", err)
					}
					if string(got) != "keep" {
						t.Errorf("Decode error returned dst %q, want it at its original length", got)
					}
				})
			}
		}
	}
}

// TestDecodeRefusesBombs feeds each codec an input that expands far beyond
// the stated raw length and checks that decoding neither succeeds nor
// allocates the bomb's size.
func TestDecodeRefusesBombs(t *testing.T) {
	const bomb = 8 << 20
	zeros := make([]byte, bomb)
	for _, tc := range losslessCases() {
		c, dt := tc.c, tc.dt
		if c.Name() == "none" {
			continue
		}
		enc, err := c.Encode(nil, zeros, dt)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(fmt.Sprintf("%s/%v", c.Name(), dt), func(t *testing.T) {
			if _, err := c.Decode(nil, enc, 4096, dt); err == nil { // warm pools and decoders
				t.Fatal("decoding a bomb to 4096 bytes succeeded")
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := c.Decode(nil, enc, 4096, dt)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, codec.ErrCorrupt) {
				t.Errorf("Decode = %v, want ErrCorrupt", err)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
				t.Errorf("decoding a %d-byte bomb (%d encoded) to 4096 bytes allocated %d bytes", bomb, len(enc), got)
			}
			if testing.Verbose() {
				t.Logf("%d-byte bomb, %d encoded: decoding allocated %d bytes", bomb, len(enc), after.TotalAlloc-before.TotalAlloc)
			}
		})
	}
}

// float reads value i of raw, little-endian bf16 or f16.
func float(raw []byte, i int, dt engine.DType) float32 {
	v := binary.LittleEndian.Uint16(raw[2*i:])
	if dt == engine.F16 {
		return fromF16(v)
	}
	return fromBF16(v)
}

// floatValues encodes xs as little-endian dt, bf16 or f16.
func floatValues(dt engine.DType, xs ...float32) []byte {
	if dt == engine.F16 {
		return f16Values(xs...)
	}
	return bf16Values(xs...)
}

// scaled returns raw (values of dt) with every value multiplied by f.
func scaled(raw []byte, dt engine.DType, f float32) []byte {
	xs := make([]float32, len(raw)/2)
	for i := range xs {
		xs[i] = f * float(raw, i, dt)
	}
	return floatValues(dt, xs...)
}

// groupScale returns max|x|/qmax over the finite values [lo, hi) of raw.
func groupScale(raw []byte, lo, hi int, dt engine.DType, qmax float32) float32 {
	var m float32
	for i := lo; i < hi; i++ {
		x := float(raw, i, dt)
		if a := float32(math.Abs(float64(x))); a > m && !math.IsInf(float64(a), 0) && a == a {
			m = a
		}
	}
	return m / qmax
}

// roundingBound is the most that rounding a float32 y to dt can change it:
// half an ulp of y. bf16 keeps 8 significant bits (≤ |y|/256, bf16 has
// float32's exponent range); f16 keeps 11 (≤ |y|/2048) down to 2⁻¹⁴ and
// steps by 2⁻²⁴ below (≤ 2⁻²⁵).
func roundingBound(y float32, dt engine.DType) float64 {
	a := math.Abs(float64(y))
	if dt == engine.F16 {
		return math.Max(a/2048, 0x1p-25)
	}
	return a / 256
}

// TestLossyErrorBounds checks every decoded value against the bound the
// codec documents, per value and per group.
//
// int8, for a group of scale s = max|x|/127: the code is round(x/s), so
// |x − code·s| ≤ s/2; rounding code·s to the dtype adds at most half an
// ulp of the result, whose magnitude is ≤ 127·s. Per group the error is
// hence ≤ s/2 + 127·s/256 ≈ 1.0·s for bf16 and ≤ s/2 + max(127·s/2048,
// 2⁻²⁵) ≈ 0.56·s for f16.
//
// fp8 (e4m3, 3 mantissa bits), scale s = max|x|/448: x/s rounds to within
// half an e4m3 step, a relative 2⁻⁴ for normal codes and 2⁻¹⁰ (absolute,
// ×s) among the subnormal ones, so |x − y| ≤ max(|x|/16, s/1024) before the
// dtype's rounding. Per group: ≤ 448·s/16 + 448·s·(17/16)/256 ≈ 29.9·s for
// bf16, ≤ 28·s + 448·s·(17/16)/2048 ≈ 28.2·s for f16.
//
// Both get float32 slack of 10⁻⁵·s for the products x·(1/s) and code·s.
func TestLossyErrorBounds(t *testing.T) {
	inputs := map[engine.DType][]input{}
	{
		outliers := gaussianBF16(4096, 128, 11)
		for i := 0; i < len(outliers)/2; i += 97 {
			binary.LittleEndian.PutUint16(outliers[2*i:], toBF16(300*float(outliers, i, engine.BF16)))
		}
		inputs[engine.BF16] = []input{
			{"gaussian", gaussianBF16(10000, 128, 10)},
			{"outliers", outliers},
			{"tiny magnitudes", scaled(gaussianBF16(1000, 64, 12), engine.BF16, 1e-30)},
			{"zeros", make([]byte, 1000)},
			{"partial group", gaussianBF16(100, 64, 13)},
			{"empty", nil},
		}
	}
	inputs[engine.F16] = []input{
		{"kv-like", kvLikeF16(20000, 128, 10)},
		{"gaussian", gaussianF16(10000, 128, 14)},
		// Groups whose smaller values are f16 subnormals (below 6.1e-5).
		{"subnormal magnitudes", scaled(kvLikeF16(1000, 64, 12), engine.F16, 1e-5)},
		{"near the f16 maximum", scaled(kvLikeF16(1000, 64, 15), engine.F16, 65504/200.0)},
		{"zeros", make([]byte, 1000)},
		{"partial group", kvLikeF16(100, 64, 13)},
		{"empty", nil},
	}
	for _, tc := range []struct {
		name  string
		qmax  float32
		bound func(x, scale float32) float64 // before rounding to the dtype
		group map[engine.DType]float64       // per group, × scale
	}{
		{"int8", 127, func(x, scale float32) float64 { return float64(scale) / 2 },
			map[engine.DType]float64{engine.BF16: 0.5 + 127.0/256, engine.F16: 0.5 + 127.0/2048}},
		{"fp8", 448, func(x, scale float32) float64 { return math.Max(math.Abs(float64(x))/16, float64(scale)/1024) },
			map[engine.DType]float64{engine.BF16: 28 + 448*17.0/16/256, engine.F16: 28 + 448*17.0/16/2048}},
	} {
		c := mustCodec(t, tc.name)
		if c.Lossless() {
			t.Errorf("%s claims to be lossless", tc.name)
		}
		for _, dt := range floatDTypes {
			for _, in := range inputs[dt] {
				t.Run(fmt.Sprintf("%s/%v/%s", tc.name, dt, in.name), func(t *testing.T) {
					enc, err := c.Encode(nil, in.raw, dt)
					if err != nil {
						t.Fatal(err)
					}
					vals := len(in.raw) / 2
					groups := (vals + codec.GroupSize - 1) / codec.GroupSize
					if want := 4*groups + vals; len(enc) != want {
						t.Errorf("encoded %d bytes to %d, want %d", len(in.raw), len(enc), want)
					}
					got, err := c.Decode(nil, enc, len(in.raw), dt)
					if err != nil {
						t.Fatal(err)
					}
					if len(got) != len(in.raw) {
						t.Fatalf("decoded %d bytes, want %d", len(got), len(in.raw))
					}
					worst := 0.0
					for g := 0; g < groups; g++ {
						lo, hi := g*codec.GroupSize, min((g+1)*codec.GroupSize, vals)
						scale := groupScale(in.raw, lo, hi, dt, tc.qmax)
						slack := float64(scale) * 1e-5
						groupWorst := 0.0
						for i := lo; i < hi; i++ {
							x, y := float(in.raw, i, dt), float(got, i, dt)
							bound := tc.bound(x, scale) + roundingBound(y, dt) + slack
							diff := math.Abs(float64(x) - float64(y))
							if diff > bound {
								t.Fatalf("value %d: %g decoded as %g: error %g > bound %g (scale %g)", i, x, y, diff, bound, scale)
							}
							groupWorst = math.Max(groupWorst, diff)
						}
						if limit := tc.group[dt]*float64(scale) + 0x1p-25 + slack; groupWorst > limit {
							t.Fatalf("group %d: worst error %g > %g (scale %g)", g, groupWorst, limit, scale)
						}
						if scale > 0 {
							worst = math.Max(worst, groupWorst/float64(scale))
						}
					}
					t.Logf("worst error %.4f × scale", worst)
				})
			}
		}
	}
}

func TestLossyRefusesOddLengths(t *testing.T) {
	for _, name := range []string{"fp8", "int8"} {
		c := mustCodec(t, name)
		for _, dt := range floatDTypes {
			if got, err := c.Encode([]byte("x"), []byte{1, 2, 3}, dt); !errors.Is(err, codec.ErrOddLength) || string(got) != "x" {
				t.Errorf("%s %v: Encode of 3 bytes = %q, %v; want dst unchanged, ErrOddLength", name, dt, got, err)
			}
		}
	}
}

func TestLossySpecialValues(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, dt := range floatDTypes {
		raw := floatValues(dt, 1, -2, inf, -inf, nan, 0.5)
		for _, tc := range []struct {
			name string
			want []float32 // NaN compares by IsNaN
		}{
			{"fp8", []float32{1, -2, 2, -2, nan, 0.5}},
			{"int8", []float32{1, -2, 2, -2, 0, 0.5}},
		} {
			t.Run(fmt.Sprintf("%s/%v", tc.name, dt), func(t *testing.T) {
				c := mustCodec(t, tc.name)
				enc, err := c.Encode(nil, raw, dt)
				if err != nil {
					t.Fatal(err)
				}
				got, err := c.Decode(nil, enc, len(raw), dt)
				if err != nil {
					t.Fatal(err)
				}
				for i, want := range tc.want {
					y := float(got, i, dt)
					if want != want {
						if y == y {
							t.Errorf("value %d = %g, want NaN", i, y)
						}
						continue
					}
					if math.Abs(float64(y-want)) > math.Abs(float64(want))/16+0.01 {
						t.Errorf("value %d = %g, want ≈%g", i, y, want)
					}
				}
			})
		}
	}
}

// TestLossyExactValues checks that values a group's codes represent
// exactly come back bit-exact in both dtypes: integers up to 127 with a
// scale of 1 (int8) and powers of two (fp8).
func TestLossyExactValues(t *testing.T) {
	ints := make([]float32, 0, 64)
	for v := -62; v <= 127; v += 3 { // 64 values, the largest 127
		ints = append(ints, float32(v))
	}
	pows := []float32{448, 224, 1, 0.5, -0.25, 0x1p-6, -0x1p-9}
	for _, dt := range floatDTypes {
		for _, tc := range []struct {
			name string
			xs   []float32
		}{{"int8", ints}, {"fp8", pows}} {
			raw := floatValues(dt, tc.xs...)
			c := mustCodec(t, tc.name)
			enc, err := c.Encode(nil, raw, dt)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Decode(nil, enc, len(raw), dt)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, raw) {
				t.Errorf("%s %v: exactly representable values changed", tc.name, dt)
			}
		}
	}
}

func TestLossyRejectsBadScales(t *testing.T) {
	for _, dt := range floatDTypes {
		raw := floatValues(dt, kvLikeF32(100, 64, 3)...)
		for _, name := range []string{"fp8", "int8"} {
			c := mustCodec(t, name)
			enc, err := c.Encode(nil, raw, dt)
			if err != nil {
				t.Fatal(err)
			}
			for _, scale := range []float32{float32(math.NaN()), float32(math.Inf(1)), -1} {
				bad := bytes.Clone(enc)
				binary.LittleEndian.PutUint32(bad[4+codec.GroupSize:], math.Float32bits(scale)) // second group
				if _, err := c.Decode(nil, bad, len(raw), dt); !errors.Is(err, codec.ErrCorrupt) {
					t.Errorf("%s %v: scale %g: Decode = %v, want ErrCorrupt", name, dt, scale, err)
				}
			}
		}
		c := mustCodec(t, "int8")
		enc, _ := c.Encode(nil, raw, dt)
		enc[4] = 0x80 // -128 is never written
		if _, err := c.Decode(nil, enc, len(raw), dt); !errors.Is(err, codec.ErrCorrupt) {
			t.Errorf("int8 %v code -128: Decode = %v, want ErrCorrupt", dt, err)
		}
	}
}

// TestCodecsConcurrent runs every codec on every dtype it takes from
// several goroutines at once, so that -race checks the shared encoders,
// decoders and pools.
func TestCodecsConcurrent(t *testing.T) {
	inputs := map[engine.DType][]byte{
		engine.BF16: gaussianBF16(20000, 128, 8),
		engine.F16:  kvLikeF16(20000, 128, 8),
		engine.Q8_0: q80Rows(kvLikeF32(128*150, 128, 8)),
	}
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for _, c := range codec.All() {
		for dt, raw := range inputs {
			if c.Supports(dt) != nil {
				continue
			}
			for range 2 {
				wg.Go(func() {
					for range 5 {
						enc, err := c.Encode(nil, raw, dt)
						if err != nil {
							errc <- err
							return
						}
						got, err := c.Decode(nil, enc, len(raw), dt)
						if err != nil {
							errc <- fmt.Errorf("%s %v: %w", c.Name(), dt, err)
							return
						}
						if c.Lossless() && !bytes.Equal(got, raw) {
							errc <- fmt.Errorf("%s %v: concurrent round trip differs", c.Name(), dt)
							return
						}
					}
				})
			}
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}
