package codec

import (
	"fmt"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/pdserve/pdserve/pkg/engine"
)

// s2Codec is one S2 block (s2.Encode): the fastest general-purpose codec,
// useful on KV with runs (padding, zeroed heads); near 1.0× on dense bf16
// or f16. Any dtype.
type s2Codec struct{ anyDType }

func (s2Codec) ID() ID         { return S2 }
func (s2Codec) Name() string   { return "s2" }
func (s2Codec) Lossless() bool { return true }

func (s2Codec) Encode(dst, raw []byte, _ engine.DType) ([]byte, error) {
	n := s2.MaxEncodedLen(len(raw))
	if n < 0 || len(raw) > s2.MaxBlockSize {
		return dst, fmt.Errorf("codec: s2: encode %d bytes: %w", len(raw), ErrTooLarge)
	}
	dst = grow(dst, n)
	out := s2.Encode(dst[len(dst):len(dst)+n], raw)
	return dst[:len(dst)+len(out)], nil
}

func (s2Codec) Decode(dst, enc []byte, rawLen int, _ engine.DType) ([]byte, error) {
	if err := checkRawLen("s2", rawLen); err != nil {
		return dst, err
	}
	n, err := s2.DecodedLen(enc)
	if err != nil {
		return dst, fmt.Errorf("codec: s2: %v: %w", err, ErrCorrupt)
	}
	if n != rawLen {
		return dst, fmt.Errorf("codec: s2: block holds %d bytes, want %d: %w", n, rawLen, ErrCorrupt)
	}
	dst = grow(dst, rawLen)
	out, err := s2.Decode(dst[len(dst):len(dst)+rawLen], enc)
	if err != nil {
		return dst, fmt.Errorf("codec: s2: %v: %w", err, ErrCorrupt)
	}
	if len(out) != rawLen {
		return dst, fmt.Errorf("codec: s2: decoded %d bytes, want %d: %w", len(out), rawLen, ErrCorrupt)
	}
	return dst[:len(dst)+rawLen], nil
}

// zstdWindow is the encoder's window and the largest window the decoder
// accepts: frames from this package never need more.
const zstdWindow = 8 << 20

// zstdCoders holds the one encoder and one decoder every zstd call shares:
// EncodeAll and DecodeAll are safe for concurrent use (each runs up to
// GOMAXPROCS at once). They are built on first use and never closed; used
// only through EncodeAll/DecodeAll they start no goroutines.
var zstdCoders = sync.OnceValues(func() (*zstdPair, error) {
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderCRC(false), // frames carry their own CRC-32C
		zstd.WithWindowSize(zstdWindow),
	)
	if err != nil {
		return nil, fmt.Errorf("codec: zstd: new encoder: %w", err)
	}
	dec, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(0),
		zstd.WithDecoderMaxWindow(zstdWindow),
		zstd.WithDecoderMaxMemory(MaxRawLen),
		zstd.WithDecodeAllCapLimit(true), // never decode past cap(dst)
	)
	if err != nil {
		return nil, fmt.Errorf("codec: zstd: new decoder: %w", err)
	}
	return &zstdPair{enc: enc, dec: dec}, nil
})

type zstdPair struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

// zstdCodec is one zstd frame at the fastest level (≈1.2–1.3× on real bf16
// tensors). Any dtype.
type zstdCodec struct{ anyDType }

func (zstdCodec) ID() ID         { return Zstd }
func (zstdCodec) Name() string   { return "zstd" }
func (zstdCodec) Lossless() bool { return true }

func (zstdCodec) Encode(dst, raw []byte, _ engine.DType) ([]byte, error) {
	if err := checkRaw("zstd", raw); err != nil {
		return dst, err
	}
	z, err := zstdCoders()
	if err != nil {
		return dst, err
	}
	return z.enc.EncodeAll(raw, dst), nil
}

func (zstdCodec) Decode(dst, enc []byte, rawLen int, _ engine.DType) ([]byte, error) {
	if err := checkRawLen("zstd", rawLen); err != nil {
		return dst, err
	}
	z, err := zstdCoders()
	if err != nil {
		return dst, err
	}
	base := len(dst)
	dst = grow(dst, rawLen)
	// The cap limit bounds the output to exactly rawLen bytes.
	out, err := z.dec.DecodeAll(enc, dst[:base:base+rawLen])
	if err != nil {
		return dst[:base], fmt.Errorf("codec: zstd: %v: %w", err, ErrCorrupt)
	}
	if len(out) != base+rawLen {
		return dst[:base], fmt.Errorf("codec: zstd: decoded %d bytes, want %d: %w", len(out)-base, rawLen, ErrCorrupt)
	}
	dst = dst[:base+rawLen]
	if rawLen > 0 && &out[base] != &dst[base] {
		copy(dst[base:], out[base:]) // not expected with the cap limit; stay correct regardless
	}
	return dst, nil
}
