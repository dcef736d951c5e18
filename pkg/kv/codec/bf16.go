package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/klauspost/compress/huff0"

	"github.com/pdserve/pdserve/pkg/engine"
)

// The bf16 codec (also named "f16" and "planes"): byte planes of 2-byte
// float values, lossless. One wire id for both float dtypes: the frame's
// dtype says how a value splits.
//
// Dense KV holds a few bits of information in a value's exponent and close
// to random bits in its low mantissa, so the codec splits each value into
// two bytes, gathers each kind into a plane, and Huffman-codes (huff0, 4
// streams) the planes that shrink; the others are stored:
//
//   - bf16, sign(1) exponent(8) mantissa(7): an exponent byte and a
//     sign+mantissa byte (sign in bit 7). The exponent plane compresses.
//   - f16, sign(1) exponent(5) mantissa(10): the value's high byte (sign,
//     exponent, top 2 mantissa bits) and its low byte (8 mantissa bits).
//     The high plane compresses; the low one is near random. f16 has three
//     more mantissa bits than bf16, so it compresses less: ≈1.15× on dense
//     Gaussian KV, where bf16 gets ≈1.46×. (Splitting f16 like bf16, its
//     bits 7–14 apart from the sign and low 7 bits, measured within ±0.15%
//     of this on synthetic KV; this split keeps sign and exponent together
//     and is a plain byte deinterleave.)
//
// Planes are coded in blocks of bf16Block values, each with its own table,
// so the coder adapts within a long chunk and any block decodes on its own.
//
// Payload, for n raw bytes (m = n/2 values):
//
//	for each block of k = min(bf16Block, values left) values:
//	    first plane (bf16: exponents; f16: high bytes), then second plane
//	    (bf16: signs and mantissas; f16: low bytes), each one of
//	        0x00, k bytes              stored
//	        0x01, 1 byte               every byte equal (run)
//	        0x02, uint16 LE L, L bytes huff0 4X table+streams, L < k
//	[the odd last raw byte, when n is odd]
//
// Block sizes follow from n, so a decoder writes exactly n bytes and no
// encoded field can make it allocate more.
const (
	bf16Block   = 1 << 16 // values per block
	bf16MinHuff = 256     // planes shorter than this are stored

	planeStored = 0x00
	planeRun    = 0x01
	planeHuff   = 0x02
)

type bf16Codec struct{}

func (bf16Codec) ID() ID         { return BF16 }
func (bf16Codec) Name() string   { return "bf16" }
func (bf16Codec) Lossless() bool { return true }

func (bf16Codec) Supports(dt engine.DType) error { return checkFloat("bf16", dt) }

// bf16State is the per-call scratch of an encode or decode; pooled.
type bf16State struct {
	huff *huff0.Scratch
	exp  []byte // bf16Block bytes: the first plane
	sm   []byte // bf16Block bytes: the second plane
}

var bf16States = sync.Pool{New: func() any {
	return &bf16State{
		huff: &huff0.Scratch{Reuse: huff0.ReusePolicyNone},
		exp:  make([]byte, bf16Block),
		sm:   make([]byte, bf16Block),
	}
}}

func (bf16Codec) Encode(dst, raw []byte, dt engine.DType) ([]byte, error) {
	if err := checkFloat("bf16", dt); err != nil {
		return dst, err
	}
	if err := checkRaw("bf16", raw); err != nil {
		return dst, err
	}
	split := splitBF16
	if dt == engine.F16 {
		split = splitF16
	}
	st := bf16States.Get().(*bf16State)
	defer bf16States.Put(st)
	base := len(dst)
	vals := len(raw) / 2
	blocks := (vals + bf16Block - 1) / bf16Block
	dst = grow(dst, len(raw)+6*blocks) // the largest encoding: every plane stored or nearly
	for off := 0; off < vals; off += bf16Block {
		k := min(bf16Block, vals-off)
		e, s := st.exp[:k], st.sm[:k]
		split(e, s, raw[2*off:2*(off+k)])
		var err error
		if dst, err = st.appendPlane(dst, e); err != nil {
			return dst[:base], err
		}
		if dst, err = st.appendPlane(dst, s); err != nil {
			return dst[:base], err
		}
	}
	if len(raw)%2 == 1 {
		dst = append(dst, raw[len(raw)-1])
	}
	return dst, nil
}

// appendPlane appends the smallest of the stored, run and Huffman forms of p
// (Huffman only tried when a sample predicts it pays).
func (st *bf16State) appendPlane(dst, p []byte) ([]byte, error) {
	if len(p) >= bf16MinHuff && worthCoding(p) {
		out, _, err := huff0.Compress4X(p, st.huff)
		switch {
		case err == nil:
			dst = append(dst, planeHuff, byte(len(out)), byte(len(out)>>8))
			return append(dst, out...), nil
		case errors.Is(err, huff0.ErrUseRLE):
			return append(dst, planeRun, p[0]), nil
		case !errors.Is(err, huff0.ErrIncompressible):
			return dst, fmt.Errorf("codec: bf16: huffman: %w", err)
		}
	}
	dst = append(dst, planeStored)
	return append(dst, p...), nil
}

// worthCoding estimates the byte entropy of p from every 8th byte and
// reports whether Huffman coding may save at least ≈6% (below 7.5 bits per
// byte). The second plane of dense KV (bf16 signs and mantissas, f16 low
// bytes) sits near 8 bits; coding it would cost a fifth of the encode time
// for ≈0.1% of size. Short planes are always tried.
func worthCoding(p []byte) bool {
	const stride, minSample = 8, 512
	n := len(p) / stride
	if n < minSample {
		return true
	}
	var hist [256]uint32
	for i := 0; i < n; i++ {
		hist[p[i*stride]]++
	}
	// H = log2(n) - Σ c·log2(c) / n
	sum := 0.0
	for _, c := range hist {
		if c > 1 {
			sum += float64(c) * math.Log2(float64(c))
		}
	}
	return math.Log2(float64(n))-sum/float64(n) < 7.5
}

func (bf16Codec) Decode(dst, enc []byte, rawLen int, dt engine.DType) ([]byte, error) {
	if err := checkFloat("bf16", dt); err != nil {
		return dst, err
	}
	if err := checkRawLen("bf16", rawLen); err != nil {
		return dst, err
	}
	merge, first, second := mergeBF16, "exponents", "signs and mantissas"
	if dt == engine.F16 {
		merge, first, second = mergeF16, "high bytes", "low bytes"
	}
	vals := rawLen / 2
	// Every block takes at least 4 bytes: reject short input before growing dst.
	if minLen := 4*((vals+bf16Block-1)/bf16Block) + rawLen%2; len(enc) < minLen {
		return dst, fmt.Errorf("codec: bf16: %d bytes cannot hold %d raw bytes: %w", len(enc), rawLen, ErrCorrupt)
	}
	st := bf16States.Get().(*bf16State)
	defer bf16States.Put(st)
	base := len(dst)
	dst = grow(dst, rawLen)[:base+rawLen]
	out := dst[base:]
	for off := 0; off < vals; off += bf16Block {
		k := min(bf16Block, vals-off)
		var e, s []byte
		var err error
		if e, enc, err = st.readPlane(enc, st.exp[:k]); err != nil {
			return dst[:base], fmt.Errorf("codec: bf16: %v block at value %d: %s: %w", dt, off, first, err)
		}
		if s, enc, err = st.readPlane(enc, st.sm[:k]); err != nil {
			return dst[:base], fmt.Errorf("codec: bf16: %v block at value %d: %s: %w", dt, off, second, err)
		}
		merge(out[2*off:2*(off+k)], e, s)
	}
	if rawLen%2 == 1 {
		if len(enc) < 1 {
			return dst[:base], fmt.Errorf("codec: bf16: missing odd last byte: %w", ErrCorrupt)
		}
		out[rawLen-1] = enc[0]
		enc = enc[1:]
	}
	if len(enc) != 0 {
		return dst[:base], fmt.Errorf("codec: bf16: %d bytes after the last block: %w", len(enc), ErrCorrupt)
	}
	return dst, nil
}

// readPlane decodes one plane of len(buf) bytes from the front of enc and
// returns it (in buf, or a view into enc when stored) and the rest of enc.
func (st *bf16State) readPlane(enc, buf []byte) (plane, rest []byte, err error) {
	k := len(buf)
	if len(enc) < 1 {
		return nil, nil, fmt.Errorf("truncated: %w", ErrCorrupt)
	}
	mode, enc := enc[0], enc[1:]
	switch mode {
	case planeStored:
		if len(enc) < k {
			return nil, nil, fmt.Errorf("stored plane: %d of %d bytes: %w", len(enc), k, ErrCorrupt)
		}
		return enc[:k], enc[k:], nil
	case planeRun:
		if len(enc) < 1 {
			return nil, nil, fmt.Errorf("run plane truncated: %w", ErrCorrupt)
		}
		for i := range buf {
			buf[i] = enc[0]
		}
		return buf, enc[1:], nil
	case planeHuff:
		if len(enc) < 2 {
			return nil, nil, fmt.Errorf("huffman plane truncated: %w", ErrCorrupt)
		}
		n := int(binary.LittleEndian.Uint16(enc))
		enc = enc[2:]
		if n >= k || n > len(enc) {
			return nil, nil, fmt.Errorf("huffman plane of %d bytes for %d values, %d left: %w", n, k, len(enc), ErrCorrupt)
		}
		s, data, err := huff0.ReadTable(enc[:n], st.huff)
		if err != nil {
			return nil, nil, fmt.Errorf("huffman table: %v: %w", err, ErrCorrupt)
		}
		st.huff = s
		// Decompress4X writes exactly cap(dst) bytes.
		got, err := s.Decoder().Decompress4X(buf[:0:k], data)
		if err != nil {
			return nil, nil, fmt.Errorf("huffman data: %v: %w", err, ErrCorrupt)
		}
		if len(got) != k {
			return nil, nil, fmt.Errorf("huffman plane decoded to %d bytes, want %d: %w", len(got), k, ErrCorrupt)
		}
		return got, enc[n:], nil
	default:
		return nil, nil, fmt.Errorf("plane mode %#x: %w", mode, ErrCorrupt)
	}
}

// splitBF16 splits the len(e) little-endian bf16 values of raw into their
// exponent bytes e and sign+mantissa bytes s (sign in bit 7).
func splitBF16(e, s, raw []byte) {
	n := len(e)
	raw, s = raw[:2*n], s[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		x0 := binary.LittleEndian.Uint64(raw[2*i:])
		x1 := binary.LittleEndian.Uint64(raw[2*i+8:])
		e0 := (x0 >> 7) & 0x00ff00ff00ff00ff
		e1 := (x1 >> 7) & 0x00ff00ff00ff00ff
		s0 := (x0>>8)&0x0080008000800080 | x0&0x007f007f007f007f
		s1 := (x1>>8)&0x0080008000800080 | x1&0x007f007f007f007f
		binary.LittleEndian.PutUint64(e[i:], uint64(pack4(e0))|uint64(pack4(e1))<<32)
		binary.LittleEndian.PutUint64(s[i:], uint64(pack4(s0))|uint64(pack4(s1))<<32)
	}
	for ; i < n; i++ {
		v := binary.LittleEndian.Uint16(raw[2*i:])
		e[i] = byte(v >> 7)
		s[i] = byte(v>>8)&0x80 | byte(v)&0x7f
	}
}

// mergeBF16 is the inverse of splitBF16.
func mergeBF16(raw, e, s []byte) {
	n := len(e)
	raw, s = raw[:2*n], s[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		ew := binary.LittleEndian.Uint64(e[i:])
		sw := binary.LittleEndian.Uint64(s[i:])
		e0, e1 := spread4(uint32(ew)), spread4(uint32(ew>>32))
		s0, s1 := spread4(uint32(sw)), spread4(uint32(sw>>32))
		binary.LittleEndian.PutUint64(raw[2*i:], (s0&0x0080008000800080)<<8|e0<<7|s0&0x007f007f007f007f)
		binary.LittleEndian.PutUint64(raw[2*i+8:], (s1&0x0080008000800080)<<8|e1<<7|s1&0x007f007f007f007f)
	}
	for ; i < n; i++ {
		v := uint16(s[i]&0x80)<<8 | uint16(e[i])<<7 | uint16(s[i]&0x7f)
		binary.LittleEndian.PutUint16(raw[2*i:], v)
	}
}

// splitF16 splits the len(hi) little-endian f16 values of raw into their
// high bytes hi (sign, exponent, top two mantissa bits) and low bytes lo.
func splitF16(hi, lo, raw []byte) {
	n := len(hi)
	raw, lo = raw[:2*n], lo[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		x0 := binary.LittleEndian.Uint64(raw[2*i:])
		x1 := binary.LittleEndian.Uint64(raw[2*i+8:])
		const m = 0x00ff00ff00ff00ff
		binary.LittleEndian.PutUint64(hi[i:], uint64(pack4(x0>>8&m))|uint64(pack4(x1>>8&m))<<32)
		binary.LittleEndian.PutUint64(lo[i:], uint64(pack4(x0&m))|uint64(pack4(x1&m))<<32)
	}
	for ; i < n; i++ {
		lo[i], hi[i] = raw[2*i], raw[2*i+1]
	}
}

// mergeF16 is the inverse of splitF16.
func mergeF16(raw, hi, lo []byte) {
	n := len(hi)
	raw, lo = raw[:2*n], lo[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		hw := binary.LittleEndian.Uint64(hi[i:])
		lw := binary.LittleEndian.Uint64(lo[i:])
		binary.LittleEndian.PutUint64(raw[2*i:], spread4(uint32(hw))<<8|spread4(uint32(lw)))
		binary.LittleEndian.PutUint64(raw[2*i+8:], spread4(uint32(hw>>32))<<8|spread4(uint32(lw>>32)))
	}
	for ; i < n; i++ {
		raw[2*i], raw[2*i+1] = lo[i], hi[i]
	}
}

// pack4 gathers bytes 0, 2, 4 and 6 of x (the others must be zero) into a
// uint32.
func pack4(x uint64) uint32 {
	x |= x >> 8 // bytes 0,1 = lanes 0,1; bytes 4,5 = lanes 2,3
	return uint32(x&0xffff) | uint32(x>>32)<<16
}

// spread4 is the inverse of pack4: byte j of x goes to byte 2j.
func spread4(x uint32) uint64 {
	y := uint64(x)
	y = (y | y<<16) & 0x0000ffff0000ffff
	return (y | y<<8) & 0x00ff00ff00ff00ff
}
