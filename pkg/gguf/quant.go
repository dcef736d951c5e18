package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// q8Block is the number of values in one Q8_0 block (ggml's QK8_0).
const q8Block = 32

// q8BlockBytes is the size of one Q8_0 block: an IEEE half scale d
// followed by 32 int8 quants; value j is d*qs[j].
const q8BlockBytes = 2 + q8Block

// F32ToF16 returns the IEEE 754 half-precision bits nearest to f, ties to
// even (as ggml's FP32_TO_FP16): values beyond ±65504 round to ±Inf,
// values below 2⁻²⁴ to ±0 through the subnormals; NaN stays a quiet NaN.
//
// It touches no memory; go:norace and go:nocheckptr spare it the race
// detector's and checkptr's per-call bookkeeping (it runs once per value
// written).
//
//go:norace
//go:nocheckptr
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff:
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	case exp >= 143: // 2^16 and beyond: past the largest half
		return sign | 0x7c00
	case exp >= 113: // half normal range: exponent 1..30 after rebias
		h := uint32(exp-112)<<10 | mant>>13
		rem := mant & 0x1fff
		if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
			h++ // may carry into the exponent, up to Inf: correct rounding
		}
		return sign | uint16(h)
	}
	// Half subnormal: value = m * 2^-24 with m = M * 2^(exp-126), M the
	// float's significand with its implicit bit.
	shift := uint32(126 - exp)
	if shift > 24 {
		return sign
	}
	m := mant | 0x800000
	q := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	return sign | uint16(q)
}

// F16ToF32 returns the float32 value of the IEEE half-precision bits h
// (exact: every half is a float32).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal half: normalise.
	e := uint32(113)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
}

// quantizeQ8Block stores the Q8_0 encoding of 32 values x in the 34 bytes
// of b, as ggml's quantize_row_q8_0_ref: d = max|x|/127 stored as a half,
// then qs[j] = round(x[j]/d) half away from zero.
//
//go:norace
//go:nocheckptr
func quantizeQ8Block(b []byte, x []float32) {
	x = x[:q8Block]
	b = b[:q8BlockBytes]
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(b, F32ToF16(d))
	for j, v := range x {
		b[2+j] = byte(int8(math.Round(float64(v * id))))
	}
}

// Q8Bound returns the largest error |x - decode(encode(x))| Q8_0 makes on
// a value of a block whose largest magnitude is amax: half a quant step
// d/2, d = amax/127, plus the rounding of d to a half (relative 2⁻¹¹, or
// 2⁻²⁵ absolute where d is a subnormal half) times the largest quant 127,
// plus a margin for float32 arithmetic. amax must stay below 127·65504,
// where d would overflow the half range.
func Q8Bound(amax float32) float64 {
	d := float64(amax) / 127
	return d/2 + 127*max(d*0x1p-11, 0x1p-25) + float64(amax)*0x1p-20
}

// EncodedSize returns the size in bytes of n values of type t. n must be a
// multiple of t's block size.
func EncodedSize(t TensorType, n uint64) (uint64, error) {
	tr, ok := tensorTypes[t]
	if !ok {
		return 0, fmt.Errorf("gguf: size of %v: unknown tensor type", t)
	}
	if n%tr.blockSize != 0 {
		return 0, fmt.Errorf("gguf: size of %d %v values: not a multiple of the block size %d", n, t, tr.blockSize)
	}
	return n / tr.blockSize * tr.typeSize, nil
}

// AppendEncoded appends the encoding of vals as type t (F32, F16 or Q8_0)
// to dst and returns the extended slice. For Q8_0, len(vals) must be a
// multiple of 32.
func AppendEncoded(dst []byte, t TensorType, vals []float32) ([]byte, error) {
	switch t {
	case F32:
		dst, b := grow(dst, 4*len(vals))
		encodeF32(b, vals)
		return dst, nil
	case F16:
		dst, b := grow(dst, 2*len(vals))
		encodeF16(b, vals)
		return dst, nil
	case Q8_0:
		if len(vals)%q8Block != 0 {
			return dst, fmt.Errorf("gguf: encode Q8_0: %d values are not whole blocks of %d", len(vals), q8Block)
		}
		dst, b := grow(dst, len(vals)/q8Block*q8BlockBytes)
		encodeQ8(b, vals)
		return dst, nil
	}
	return dst, fmt.Errorf("gguf: encode %v: unsupported tensor type", t)
}

// The encode loops below read only vals and write only b, buffers their
// caller holds; go:norace keeps the race detector from checking every value
// and go:nocheckptr checkptr from checking every math bit conversion, which
// made writing a model under -race (as every test runs) three times slower.

//go:norace
//go:nocheckptr
func encodeF32(b []byte, vals []float32) {
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
}

//go:norace
func encodeF16(b []byte, vals []float32) {
	for i, v := range vals {
		binary.LittleEndian.PutUint16(b[2*i:], F32ToF16(v))
	}
}

//go:norace
//go:nocheckptr
func encodeQ8(b []byte, vals []float32) {
	for i := 0; i < len(vals); i += q8Block {
		quantizeQ8Block(b[i/q8Block*q8BlockBytes:][:q8BlockBytes], vals[i:i+q8Block])
	}
}

// grow extends dst by n bytes and returns it and the new n bytes.
func grow(dst []byte, n int) ([]byte, []byte) {
	dst = slices.Grow(dst, n)
	dst = dst[:len(dst)+n]
	return dst, dst[len(dst)-n:]
}

// DecodeFloat32 decodes raw, whole values (F32, F16) or blocks (Q8_0) of
// type t, into a new slice the caller owns.
func DecodeFloat32(t TensorType, raw []byte) ([]float32, error) {
	switch t {
	case F32:
		if len(raw)%4 != 0 {
			return nil, fmt.Errorf("gguf: decode F32: %d bytes are not whole values", len(raw))
		}
		out := make([]float32, len(raw)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		return out, nil
	case F16:
		if len(raw)%2 != 0 {
			return nil, fmt.Errorf("gguf: decode F16: %d bytes are not whole values", len(raw))
		}
		out := make([]float32, len(raw)/2)
		for i := range out {
			out[i] = F16ToF32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
		return out, nil
	case Q8_0:
		if len(raw)%q8BlockBytes != 0 {
			return nil, fmt.Errorf("gguf: decode Q8_0: %d bytes are not whole blocks of %d", len(raw), q8BlockBytes)
		}
		out := make([]float32, 0, len(raw)/q8BlockBytes*q8Block)
		for b := 0; b < len(raw); b += q8BlockBytes {
			d := F16ToF32(binary.LittleEndian.Uint16(raw[b:]))
			for _, q := range raw[b+2 : b+q8BlockBytes] {
				out = append(out, d*float32(int8(q)))
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("gguf: decode %v: unsupported tensor type", t)
}
