package codec

import (
	"encoding/binary"
	"fmt"
	"math"
)

// GroupSize is the number of bf16 values that share one float32 scale in
// the lossy codecs.
const GroupSize = 64

// Lossy payload, for n raw bytes (n even, m = n/2 bf16 values):
//
//	for each group of k = min(GroupSize, values left) values:
//	    float32 LE scale (finite, ≥ 0), then k one-byte codes
//
// Its length follows from n alone, 4·ceil(m/GroupSize) + m, and grows
// strictly with n, so a payload decodes only at the raw length it was made
// for. Raw input of odd length is not bf16 data and is refused
// (ErrOddLength).
func lossyLen(rawLen int) int {
	vals := rawLen / 2
	return 4*((vals+GroupSize-1)/GroupSize) + vals
}

// checkEven refuses raw input that is not whole bf16 values.
func checkEven(name string, raw []byte) error {
	if len(raw)%2 != 0 {
		return fmt.Errorf("codec: %s: %d bytes: %w", name, len(raw), ErrOddLength)
	}
	return checkRaw(name, raw)
}

// fp8Codec quantizes each group to float8 e4m3 (OCP "e4m3fn": 4 exponent
// bits, bias 7, 3 mantissa bits, no infinities, largest finite ±448) after
// dividing by scale = max|x|/448. Error per value: at most
// max(|x|/16, scale/1024) before the result is rounded back to bf16.
// NaN stays NaN; ±Inf saturates to the group's largest finite magnitude
// (0 when it has none). Ratio ≈ 2/(1 + 4/GroupSize) ≈ 1.88.
type fp8Codec struct{}

func (fp8Codec) ID() ID         { return FP8 }
func (fp8Codec) Name() string   { return "fp8" }
func (fp8Codec) Lossless() bool { return false }

func (fp8Codec) Encode(dst, raw []byte) ([]byte, error) {
	if err := checkEven("fp8", raw); err != nil {
		return dst, err
	}
	return encodeGroups(dst, raw, quantFP8), nil
}

func (fp8Codec) Decode(dst, enc []byte, rawLen int) ([]byte, error) {
	return decodeGroups("fp8", dst, enc, rawLen, quantFP8)
}

// int8Codec quantizes each group to round(x/scale) in [-127, 127] with
// scale = max|x|/127. Error per value: at most scale/2 before the result is
// rounded back to bf16, which adds up to half a bf16 ulp (≤ |y|/256, so
// ≈ scale/4 near the group's maximum). NaN becomes 0; ±Inf saturates to the
// group's largest finite magnitude (0 when it has none). Ratio ≈ 1.88.
type int8Codec struct{}

func (int8Codec) ID() ID         { return INT8 }
func (int8Codec) Name() string   { return "int8" }
func (int8Codec) Lossless() bool { return false }

func (int8Codec) Encode(dst, raw []byte) ([]byte, error) {
	if err := checkEven("int8", raw); err != nil {
		return dst, err
	}
	return encodeGroups(dst, raw, quantINT8), nil
}

func (int8Codec) Decode(dst, enc []byte, rawLen int) ([]byte, error) {
	return decodeGroups("int8", dst, enc, rawLen, quantINT8)
}

// quantizer selects the code format of a lossy codec.
type quantizer uint8

const (
	quantFP8  quantizer = iota // e4m3, largest magnitude 448
	quantINT8                  // int8 in [-127, 127]
)

// encodeGroups appends the lossy payload of raw (even length): per group the
// scale max|x|/qmax and each value's code for x/scale.
func encodeGroups(dst, raw []byte, q quantizer) []byte {
	qmax := float32(448)
	if q == quantINT8 {
		qmax = 127
	}
	vals := len(raw) / 2
	base := len(dst)
	dst = grow(dst, lossyLen(len(raw)))[:base+lossyLen(len(raw))]
	out := dst[base:]
	for off := 0; off < vals; off += GroupSize {
		g := raw[2*off : 2*min(off+GroupSize, vals)]
		// The largest finite magnitude, compared as bits: for non-negative
		// floats the bit patterns order like the values.
		var maxBits uint16
		for i := 0; i+1 < len(g); i += 2 {
			a := binary.LittleEndian.Uint16(g[i:]) & 0x7fff
			if a >= 0x7f80 { // Inf or NaN: rare, predictable
				a = 0
			}
			maxBits = max(maxBits, a) // branch-free
		}
		maxAbs := bf16ToF32(maxBits)
		scale := maxAbs / qmax
		var inv float32
		if scale > 0 {
			inv = 1 / scale
		}
		binary.LittleEndian.PutUint32(out, math.Float32bits(scale))
		codes := out[4 : 4+len(g)/2]
		out = out[4+len(g)/2:]
		for i := range codes {
			v := binary.LittleEndian.Uint16(g[2*i:])
			x := bf16ToF32(v)
			if v&0x7fff == 0x7f80 { // ±Inf: saturate
				x = maxAbs
				if v&0x8000 != 0 {
					x = -maxAbs
				}
			}
			if q == quantFP8 {
				codes[i] = f32ToE4M3(x * inv)
			} else {
				codes[i] = f32ToInt8(float32(x * inv)) // rounded product: never fused
			}
		}
	}
	return dst
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
// value times its group's scale, rounded to bf16.
func decodeGroups(name string, dst, enc []byte, rawLen int, q quantizer) ([]byte, error) {
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
	for off := 0; off < vals; off += GroupSize {
		k := min(GroupSize, vals-off)
		scale := math.Float32frombits(binary.LittleEndian.Uint32(enc))
		if !(scale >= 0 && scale <= math.MaxFloat32) {
			return dst[:base], fmt.Errorf("codec: %s: group at value %d: scale %v: %w", name, off, scale, ErrCorrupt)
		}
		codes := enc[4 : 4+k]
		enc = enc[4+k:]
		o := out[2*off : 2*(off+k)]
		if q == quantFP8 {
			for i, c := range codes {
				binary.LittleEndian.PutUint16(o[2*i:], f32ToBF16(e4m3Values[c]*scale))
			}
			continue
		}
		for i, c := range codes {
			if c == 0x80 { // -128 is never written
				return dst[:base], fmt.Errorf("codec: %s: value %d: code -128: %w", name, off+i, ErrCorrupt)
			}
			binary.LittleEndian.PutUint16(o[2*i:], f32ToBF16(float32(int8(c))*scale))
		}
	}
	return dst, nil
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
