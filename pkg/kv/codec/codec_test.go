package codec_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/kv/codec"
)

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
}

type input struct {
	name string
	raw  []byte
}

// losslessInputs covers the shapes the lossless codecs must get exactly
// right: empty, odd lengths, sizes around the bf16 codec's block and Huffman
// thresholds, runs, incompressible bytes and special bf16 values.
func losslessInputs() []input {
	special := bf16Values(0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		float32(math.NaN()), math.SmallestNonzeroFloat32, -1e-39, math.MaxFloat32, 1, -2, 3.5)
	mixed := gaussianBF16(70000, 128, 4)
	copy(mixed[1000:], make([]byte, 30000)) // a run of zeros inside a block
	ins := []input{
		{"empty", nil},
		{"one byte", []byte{0xab}},
		{"three bytes", []byte{1, 2, 3}},
		{"special values", special},
		{"special values odd", append(bytes.Clone(special), 0x5a)},
		{"zeros 64 KiB", make([]byte, 64<<10)},
		{"constant", bytes.Repeat(bf16Values(0.125), 1000)},
		{"random 100001", randomBytes(100001, 1)},
		{"mixed runs", mixed},
	}
	for _, vals := range []int{1, 3, 4, 5, 255, 256, 257, 4099, 65535, 65536, 65537, 200003} {
		ins = append(ins, input{fmt.Sprintf("gaussian %d values", vals), gaussianBF16(vals, 64, uint64(vals))})
	}
	ins = append(ins, input{"gaussian odd 131073 bytes", append(gaussianBF16(65536, 128, 9), 0x7f)})
	return ins
}

func TestLosslessRoundTrip(t *testing.T) {
	prefix := []byte("prefix")
	for _, c := range codec.LosslessCodecs() {
		for _, in := range losslessInputs() {
			t.Run(c.Name()+"/"+in.name, func(t *testing.T) {
				enc, err := c.Encode(bytes.Clone(prefix), in.raw)
				if err != nil {
					t.Fatalf("Encode: %v", err)
				}
				if !bytes.HasPrefix(enc, prefix) {
					t.Fatalf("Encode did not append to dst")
				}
				enc = enc[len(prefix):]
				got, err := c.Decode(bytes.Clone(prefix), enc, len(in.raw))
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
			enc, err := c.Encode(nil, raw)
			if err != nil {
				t.Fatalf("%s layer %d: Encode: %v", c.Name(), l, err)
			}
			got, err := c.Decode(nil, enc, len(raw))
			if err != nil || !bytes.Equal(got, raw) {
				t.Fatalf("%s layer %d: round trip of %d bytes not bit-exact (err %v)", c.Name(), l, len(raw), err)
			}
		}
	}
}

func TestBF16CodecCompressesBF16(t *testing.T) {
	c, err := codec.ByName("bf16")
	if err != nil {
		t.Fatal(err)
	}
	raw := gaussianBF16(1<<17, 128, 1)
	enc, err := c.Encode(nil, raw)
	if err != nil {
		t.Fatal(err)
	}
	// Gaussian bf16 carries ≈11 bits per value: expect well above 1.3×.
	if ratio := float64(len(raw)) / float64(len(enc)); ratio < 1.3 {
		t.Errorf("bf16 codec ratio on Gaussian bf16 = %.3f, want ≥ 1.3", ratio)
	}
	// Incompressible input grows by at most a few bytes per block.
	raw = randomBytes(1<<18, 2)
	enc, err = c.Encode(nil, raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(enc) > len(raw)+8 {
		t.Errorf("random %d bytes encoded to %d", len(raw), len(enc))
	}
}

func TestDecodeRejectsWrongLengths(t *testing.T) {
	raw := gaussianBF16(3000, 64, 5)
	for _, c := range codec.All() {
		enc, err := c.Encode(nil, raw)
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
			t.Run(c.Name()+"/"+tc.name, func(t *testing.T) {
				dst := []byte("keep")
				got, err := c.Decode(dst, tc.enc, tc.rawLen)
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

// TestDecodeRefusesBombs feeds each codec an input that expands far beyond
// the stated raw length and checks that decoding neither succeeds nor
// allocates the bomb's size.
func TestDecodeRefusesBombs(t *testing.T) {
	const bomb = 8 << 20
	zeros := make([]byte, bomb)
	for _, c := range codec.LosslessCodecs() {
		if c.Name() == "none" {
			continue
		}
		enc, err := c.Encode(nil, zeros)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(c.Name(), func(t *testing.T) {
			if _, err := c.Decode(nil, enc, 4096); err == nil { // warm pools and decoders
				t.Fatal("decoding a bomb to 4096 bytes succeeded")
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := c.Decode(nil, enc, 4096)
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

// groupScale returns max|x|/qmax over the finite values of group.
func groupScale(group []byte, qmax float32) float32 {
	var m float32
	for i := 0; i+1 < len(group); i += 2 {
		x := fromBF16(binary.LittleEndian.Uint16(group[i:]))
		if a := float32(math.Abs(float64(x))); a > m && !math.IsInf(float64(a), 0) && a == a {
			m = a
		}
	}
	return m / qmax
}

func TestLossyErrorBounds(t *testing.T) {
	outliers := gaussianBF16(4096, 128, 11)
	for i := 0; i < len(outliers); i += 2 * 97 {
		binary.LittleEndian.PutUint16(outliers[i:], toBF16(300*fromBF16(binary.LittleEndian.Uint16(outliers[i:]))))
	}
	tiny := gaussianBF16(1000, 64, 12)
	for i := 0; i+1 < len(tiny); i += 2 {
		binary.LittleEndian.PutUint16(tiny[i:], toBF16(1e-30*fromBF16(binary.LittleEndian.Uint16(tiny[i:]))))
	}
	inputs := []input{
		{"gaussian", gaussianBF16(10000, 128, 10)},
		{"outliers", outliers},
		{"tiny magnitudes", tiny},
		{"zeros", make([]byte, 1000)},
		{"partial group", gaussianBF16(100, 64, 13)},
		{"empty", nil},
	}
	for _, tc := range []struct {
		name  string
		qmax  float32
		bound func(x, scale float32) float64 // before rounding back to bf16
	}{
		{"int8", 127, func(x, scale float32) float64 { return float64(scale) / 2 }},
		{"fp8", 448, func(x, scale float32) float64 { return math.Max(math.Abs(float64(x))/16, float64(scale)/1024) }},
	} {
		c, err := codec.ByName(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if c.Lossless() {
			t.Errorf("%s claims to be lossless", tc.name)
		}
		for _, in := range inputs {
			t.Run(tc.name+"/"+in.name, func(t *testing.T) {
				enc, err := c.Encode(nil, in.raw)
				if err != nil {
					t.Fatal(err)
				}
				vals := len(in.raw) / 2
				groups := (vals + codec.GroupSize - 1) / codec.GroupSize
				if want := 4*groups + vals; len(enc) != want {
					t.Errorf("encoded %d bytes to %d, want %d", len(in.raw), len(enc), want)
				}
				got, err := c.Decode(nil, enc, len(in.raw))
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(in.raw) {
					t.Fatalf("decoded %d bytes, want %d", len(got), len(in.raw))
				}
				worst := 0.0
				for g := 0; g < groups; g++ {
					lo, hi := 2*g*codec.GroupSize, 2*min((g+1)*codec.GroupSize, vals)
					scale := groupScale(in.raw[lo:hi], tc.qmax)
					for i := lo; i < hi; i += 2 {
						x := fromBF16(binary.LittleEndian.Uint16(in.raw[i:]))
						y := fromBF16(binary.LittleEndian.Uint16(got[i:]))
						// The quantizer's bound, bf16 rounding of the result
						// (half an ulp: ≤ |y|/256) and float32 slack.
						bound := tc.bound(x, scale) + math.Abs(float64(y))/256 + float64(scale)*1e-5
						diff := math.Abs(float64(x) - float64(y))
						if diff > bound {
							t.Fatalf("value %d: %g decoded as %g: error %g > bound %g (scale %g)", i/2, x, y, diff, bound, scale)
						}
						if scale > 0 {
							worst = math.Max(worst, diff/float64(scale))
						}
					}
				}
				t.Logf("worst error %.4f × scale", worst)
			})
		}
	}
}

func TestLossyRefusesOddLengths(t *testing.T) {
	for _, name := range []string{"fp8", "int8"} {
		c, _ := codec.ByName(name)
		if got, err := c.Encode([]byte("x"), []byte{1, 2, 3}); !errors.Is(err, codec.ErrOddLength) || string(got) != "x" {
			t.Errorf("%s: Encode of 3 bytes = %q, %v; want dst unchanged, ErrOddLength", name, got, err)
		}
	}
}

func TestLossySpecialValues(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	raw := bf16Values(1, -2, inf, -inf, nan, 0.5)
	for _, tc := range []struct {
		name string
		want []float32 // NaN compares by IsNaN
	}{
		{"fp8", []float32{1, -2, 2, -2, nan, 0.5}},
		{"int8", []float32{1, -2, 2, -2, 0, 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := codec.ByName(tc.name)
			enc, err := c.Encode(nil, raw)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Decode(nil, enc, len(raw))
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range tc.want {
				y := fromBF16(binary.LittleEndian.Uint16(got[2*i:]))
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

func TestLossyRejectsBadScales(t *testing.T) {
	raw := gaussianBF16(100, 64, 3)
	for _, name := range []string{"fp8", "int8"} {
		c, _ := codec.ByName(name)
		enc, err := c.Encode(nil, raw)
		if err != nil {
			t.Fatal(err)
		}
		for _, scale := range []float32{float32(math.NaN()), float32(math.Inf(1)), -1} {
			bad := bytes.Clone(enc)
			binary.LittleEndian.PutUint32(bad[4+codec.GroupSize:], math.Float32bits(scale)) // second group
			if _, err := c.Decode(nil, bad, len(raw)); !errors.Is(err, codec.ErrCorrupt) {
				t.Errorf("%s: scale %g: Decode = %v, want ErrCorrupt", name, scale, err)
			}
		}
	}
	c, _ := codec.ByName("int8")
	enc, _ := c.Encode(nil, raw)
	enc[4] = 0x80 // -128 is never written
	if _, err := c.Decode(nil, enc, len(raw)); !errors.Is(err, codec.ErrCorrupt) {
		t.Errorf("int8 code -128: Decode = %v, want ErrCorrupt", err)
	}
}

// TestCodecsConcurrent runs every codec from several goroutines at once, so
// that -race checks the shared encoders, decoders and pools.
func TestCodecsConcurrent(t *testing.T) {
	raw := gaussianBF16(20000, 128, 8)
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for _, c := range codec.All() {
		for range 4 {
			wg.Go(func() {
				for range 5 {
					enc, err := c.Encode(nil, raw)
					if err != nil {
						errc <- err
						return
					}
					got, err := c.Decode(nil, enc, len(raw))
					if err != nil {
						errc <- fmt.Errorf("%s: %w", c.Name(), err)
						return
					}
					if c.Lossless() && !bytes.Equal(got, raw) {
						errc <- fmt.Errorf("%s: concurrent round trip differs", c.Name())
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}
