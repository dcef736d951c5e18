package codec

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/pdserve/pdserve/pkg/engine"
)

// GroupSize is the number of values that share one float32 scale in the
// lossy codecs.
const GroupSize = 64

// Lossy payload, for n raw bytes (n even, m = n/2 bf16 or f16 values):
//
//	for each group of k = min(GroupSize, values left) values:
//	    float32 LE scale (finite, ≥ 0), then k one-byte codes
//
// The format does not depend on the dtype: the frame's dtype says which
// values were read and which the decoder writes. Its length follows from n
// alone, 4·ceil(m/GroupSize) + m, and grows strictly with n, so a payload
// decodes only at the raw length it was made for. Raw input of odd length
// is not 2-byte values and is refused (ErrOddLength).
func lossyLen(rawLen int) int {
	vals := rawLen / 2
	return 4*((vals+GroupSize-1)/GroupSize) + vals
}

// checkLossy refuses a dtype other than bf16 and f16 and raw input that is
// not whole 2-byte values.
func checkLossy(name string, raw []byte, dt engine.DType) error {
	if err := checkFloat(name, dt); err != nil {
		return err
	}
	if len(raw)%2 != 0 {
		return fmt.Errorf("codec: %s: %d bytes: %w", name, len(raw), ErrOddLength)
	}
	return checkRaw(name, raw)
}

// fp8Codec quantizes each group to float8 e4m3 (OCP "e4m3fn": 4 exponent
// bits, bias 7, 3 mantissa bits, no infinities, largest finite ±448) after
// dividing by scale = max|x|/448, and decodes to the dtype it read (bf16 or
// f16). Error per value: at most max(|x|/16, scale/1024) before the result
// is rounded back to the dtype, which adds half an ulp of the result y: at
// most |y|/256 for bf16, max(|y|/2048, 2⁻²⁵) for f16 (2⁻²⁵ in its subnormal
// range). NaN stays NaN; ±Inf saturates to the group's largest finite
// magnitude (0 when it has none). Ratio ≈ 2/(1 + 4/GroupSize) ≈ 1.88.
type fp8Codec struct{}

func (fp8Codec) ID() ID         { return FP8 }
func (fp8Codec) Name() string   { return "fp8" }
func (fp8Codec) Lossless() bool { return false }

func (fp8Codec) Supports(dt engine.DType) error { return checkFloat("fp8", dt) }

func (fp8Codec) Encode(dst, raw []byte, dt engine.DType) ([]byte, error) {
	if err := checkLossy("fp8", raw, dt); err != nil {
		return dst, err
	}
	return encodeGroups(dst, raw, dt, quantFP8), nil
}

func (fp8Codec) Decode(dst, enc []byte, rawLen int, dt engine.DType) ([]byte, error) {
	return decodeGroups("fp8", dst, enc, rawLen, dt, quantFP8)
}

// int8Codec quantizes each group to round(x/scale) in [-127, 127] with
// scale = max|x|/127, and decodes to the dtype it read (bf16 or f16). Error
// per value: at most scale/2 before the result y is rounded back to the
// dtype, which adds half an ulp of y: at most |y|/256 for bf16 (≈ scale/4
// near the group's maximum), max(|y|/2048, 2⁻²⁵) for f16 (≈ scale/32). NaN
// becomes 0; ±Inf saturates to the group's largest finite magnitude (0 when
// it has none). Ratio ≈ 1.88.
type int8Codec struct{}

func (int8Codec) ID() ID         { return INT8 }
func (int8Codec) Name() string   { return "int8" }
func (int8Codec) Lossless() bool { return false }

func (int8Codec) Supports(dt engine.DType) error { return checkFloat("int8", dt) }

func (int8Codec) Encode(dst, raw []byte, dt engine.DType) ([]byte, error) {
	if err := checkLossy("int8", raw, dt); err != nil {
		return dst, err
	}
	return encodeGroups(dst, raw, dt, quantINT8), nil
}

func (int8Codec) Decode(dst, enc []byte, rawLen int, dt engine.DType) ([]byte, error) {
	return decodeGroups("int8", dst, enc, rawLen, dt, quantINT8)
}

// quantizer selects the code format of a lossy codec.
type quantizer uint8

const (
	quantFP8  quantizer = iota // e4m3, largest magnitude 448
	quantINT8                  // int8 in [-127, 127]
)

// encodeGroups appends the lossy payload of raw (even length, values of dt,
// bf16 or f16): per group the scale max|x|/qmax and each value's code for
// x/scale.
func encodeGroups(dst, raw []byte, dt engine.DType, q quantizer) []byte {
	qmax := float32(448)
	if q == quantINT8 {
		qmax = 127
	}
	vals := len(raw) / 2
	base := len(dst)
	dst = grow(dst, lossyLen(len(raw)))[:base+lossyLen(len(raw))]
	out := dst[base:]
	var buf [GroupSize]float32
	for off := 0; off < vals; off += GroupSize {
		g := raw[2*off : 2*min(off+GroupSize, vals)]
		xs := buf[:len(g)/2]
		var maxAbs float32
		var inf bool
		if dt == engine.F16 {
			maxAbs, inf = loadF16(xs, g)
		} else {
			maxAbs, inf = loadBF16(xs, g)
		}
		if inf { // ±Inf saturates: rare
			for i, x := range xs {
				if math.IsInf(float64(x), 0) {
					xs[i] = float32(math.Copysign(float64(maxAbs), float64(x)))
				}
			}
		}
		scale := maxAbs / qmax
		var inv float32
		if scale > 0 {
			inv = 1 / scale
		}
		binary.LittleEndian.PutUint32(out, math.Float32bits(scale))
		codes := out[4 : 4+len(xs)]
		out = out[4+len(xs):]
		if q == quantFP8 {
			for i, x := range xs {
				codes[i] = f32ToE4M3(x * inv)
			}
		} else {
			for i, x := range xs {
				codes[i] = f32ToInt8(float32(x * inv)) // rounded product: never fused
			}
		}
	}
	return dst
}

// loadBF16 widens the len(xs) bf16 values of g into xs and returns their
// largest finite magnitude and whether any is ±Inf.
func loadBF16(xs []float32, g []byte) (maxAbs float32, inf bool) {
	// The largest finite magnitude, compared as bits: for non-negative
	// floats the bit patterns order like the values.
	var maxBits uint16
	g = g[:2*len(xs)]
	for i := range xs {
		v := binary.LittleEndian.Uint16(g[2*i:])
		a := v & 0x7fff
		if a >= 0x7f80 { // Inf or NaN: rare, predictable
			inf = inf || a == 0x7f80
			a = 0
		}
		maxBits = max(maxBits, a) // branch-free
		xs[i] = bf16ToF32(v)
	}
	return bf16ToF32(maxBits), inf
}

// loadF16 widens the len(xs) f16 values of g into xs and returns their
// largest finite magnitude and whether any is ±Inf.
func loadF16(xs []float32, g []byte) (maxAbs float32, inf bool) {
	var maxBits uint16
	g = g[:2*len(xs)]
	for i := range xs {
		v := binary.LittleEndian.Uint16(g[2*i:])
		a := v & 0x7fff
		if a >= 0x7c00 { // Inf or NaN: rare, predictable
			inf = inf || a == 0x7c00
			a = 0
		}
		maxBits = max(maxBits, a)
		xs[i] = f16ToF32(v)
	}
	return f16ToF32(maxBits), inf
}

// f32ToInt8 rounds q to the nearest integer in [-127, 127], ties to even; NaN
// gives 0.
func f32ToInt8(q float32) byte {
	if q != q {
		return 0
	}
	q = min(max(q, -127), 127) // branch-free clamp
	// Adding 1.5·2^23 leaves no fraction bits: float32 addition rounds to
	// the nearest integer, ties to even, exactly as RoundToEven.
	const magic = 1 << 23 * 1.5
	return byte(int8(int32((q + magic) - magic)))
}

// decodeGroups appends the rawLen bytes of a lossy payload: each code's
// value times its group's scale, rounded to dt (bf16 or f16).
func decodeGroups(name string, dst, enc []byte, rawLen int, dt engine.DType, q quantizer) ([]byte, error) {
	if err := checkFloat(name, dt); err != nil {
		return dst, err
	}
	if err := checkRawLen(name, rawLen); err != nil {
		return dst, err
	}
	if rawLen%2 != 0 {
		return dst, fmt.Errorf("codec: %s: odd raw length %d: %w", name, rawLen, ErrCorrupt)
	}
	if want := lossyLen(rawLen); len(enc) != want {
		return dst, fmt.Errorf("codec: %s: %d encoded bytes for %d raw, want %d: %w", name, len(enc), rawLen, want, ErrCorrupt)
	}
	base := len(dst)
	dst = grow(dst, rawLen)[:base+rawLen]
	out := dst[base:]
	vals := rawLen / 2
	var buf [GroupSize]float32
	for off := 0; off < vals; off += GroupSize {
		k := min(GroupSize, vals-off)
		scale := math.Float32frombits(binary.LittleEndian.Uint32(enc))
		if !(scale >= 0 && scale <= math.MaxFloat32) {
			return dst[:base], fmt.Errorf("codec: %s: group at value %d: scale %v: %w", name, off, scale, ErrCorrupt)
		}
		codes := enc[4 : 4+k]
		enc = enc[4+k:]
		o := out[2*off : 2*(off+k)]
		// One loop per code format and dtype, so that each inlines its
		// conversions; f16 converts a group at a time (f32ToF16 is too
		// large to inline).
		switch {
		case q == quantFP8 && dt == engine.F16:
			ys := buf[:k]
			for i, c := range codes {
				ys[i] = e4m3Values[c] * scale
			}
			putF16s(o, ys)
		case q == quantFP8:
			for i, c := range codes {
				binary.LittleEndian.PutUint16(o[2*i:], f32ToBF16(e4m3Values[c]*scale))
			}
		case dt == engine.F16:
			ys := buf[:k]
			for i, c := range codes {
				if c == 0x80 { // -128 is never written
					return dst[:base], errMinus128(name, off+i)
				}
				ys[i] = float32(int8(c)) * scale
			}
			putF16s(o, ys)
		default:
			for i, c := range codes {
				if c == 0x80 {
					return dst[:base], errMinus128(name, off+i)
				}
				binary.LittleEndian.PutUint16(o[2*i:], f32ToBF16(float32(int8(c))*scale))
			}
		}
	}
	return dst, nil
}

func errMinus128(name string, i int) error {
	return fmt.Errorf("codec: %s: value %d: code -128: %w", name, i, ErrCorrupt)
}

// bf16ToF32 widens a bfloat16 bit pattern exactly.
func bf16ToF32(v uint16) float32 { return math.Float32frombits(uint32(v) << 16) }

// f32ToBF16 rounds f to the nearest bfloat16, ties to even; NaN stays a
// (quiet) NaN.
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// f16ToF32 widens an IEEE half bit pattern exactly (subnormals included;
// NaN keeps its payload).
func f16ToF32(v uint16) float32 {
	const expMask = 0x7c00 << 13 // f16 exponent, at its float32 place
	b := uint32(v&0x7fff) << 13
	e := b & expMask
	b += (127 - 15) << 23 // rebias
	switch e {
	case expMask: // Inf or NaN
		b += (128 - 16) << 23
	case 0: // zero or subnormal: renormalize in float32, exactly
		b += 1 << 23
		b = math.Float32bits(math.Float32frombits(b) - math.Float32frombits(113<<23))
	}
	return math.Float32frombits(b | uint32(v&0x8000)<<16)
}

// f32ToF16 rounds f to the nearest IEEE half, ties to even: beyond the
// largest half (65504, half an ulp included) it gives ±Inf, below the
// smallest subnormal (2⁻²⁴) ±0; NaN stays a (quiet) NaN. Loops use
// putF16s, which it calls.
func f32ToF16(f float32) uint16 {
	var o [2]byte
	putF16s(o[:], []float32{f})
	return binary.LittleEndian.Uint16(o[:])
}

// putF16s stores ys as little-endian f16 in o (2·len(ys) bytes), each
// rounded as f32ToF16 says. The normal halves take the loop's fast path
// (f32ToF16 of one value is too large for Go to inline).
func putF16s(o []byte, ys []float32) {
	o = o[:2*len(ys)]
	for i, y := range ys {
		b := math.Float32bits(y)
		a := b & 0x7fffffff
		var h uint16
		// One unsigned comparison keeps [2⁻¹⁴, 2¹⁶) on the fast path:
		// rebias 127 → 15 and keep 10 of the 23 mantissa bits, rounding
		// to nearest even; a carry moves into the exponent (up to Inf
		// from 65520 on).
		if a-(127-14)<<23 < (16+14)<<23 {
			h = uint16(b>>16)&0x8000 | uint16((a-(127-15)<<23+0xfff+(a>>13)&1)>>13)
		} else {
			h = f32ToF16Rare(b)
		}
		binary.LittleEndian.PutUint16(o[2*i:], h)
	}
}

// f32ToF16Rare is f32ToF16 of the float32 bits b of a magnitude below 2⁻¹⁴
// or from 2¹⁶ on, out of putF16s's loop.
//
//go:noinline
func f32ToF16Rare(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	b &= 0x7fffffff
	switch {
	case b > 0x7f800000: // NaN
		return sign | 0x7e00
	case b >= (127+16)<<23: // ≥ 2¹⁶ or Inf
		return sign | 0x7c00
	}
	// A subnormal half or zero: adding 0.5 (ulp 2⁻²⁴, the subnormal step)
	// rounds f to a whole number of steps, ties to even, in the low
	// mantissa bits.
	const half = (127 - 1) << 23
	return sign | uint16(math.Float32bits(math.Float32frombits(b)+math.Float32frombits(half))-half)
}

// f32ToE4M3 rounds q to the nearest e4m3 code, ties to even, saturating at
// ±448; NaN gives the NaN code.
func f32ToE4M3(q float32) byte {
	b := math.Float32bits(q)
	sign := byte(b>>24) & 0x80
	a := b & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN
		return sign | 0x7f
	case a >= 0x43e00000: // ≥ 448, or Inf
		return sign | 0x7e
	case a < 0x3c800000: // below 2^-6: subnormal steps of 2^-9
		return sign | byte(math.RoundToEven(float64(math.Float32frombits(a))*512))
	}
	// Normal: keep 3 of the 23 mantissa bits, rounding to nearest even; a
	// carry moves into the exponent. Rebias 127 → 7.
	r := (a + 0x7ffff + (a>>20)&1) >> 20
	return sign | byte(r-(127-7)<<3)
}

// e4m3Values maps an e4m3 code to its value.
var e4m3Values = func() (t [256]float32) {
	for c := range t {
		e, m := c>>3&15, float64(c&7)
		var v float64
		switch {
		case e == 15 && m == 7:
			v = math.NaN()
		case e == 0:
			v = m / 512
		default:
			v = (1 + m/8) * math.Ldexp(1, e-7)
		}
		if c&0x80 != 0 {
			v = -v
		}
		t[c] = float32(v)
	}
	return t
}()
