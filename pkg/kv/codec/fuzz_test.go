package codec_test

import (
	"bytes"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// fuzzMaxRaw caps what a fuzzed frame may decode to.
const fuzzMaxRaw = 1 << 20

// seedRaws are the raw inputs whose frames seed the fuzzers: every codec
// path (stored, run and Huffman planes; partial groups) in a few KiB, as
// bf16, f16 and q8_0 data.
func seedRaws() [][]byte {
	return [][]byte{
		nil,
		{0x42, 0x3f},
		gaussianBF16(70, 64, 1),
		gaussianBF16(300, 64, 2), // ≥ 256 values: Huffman-coded planes
		kvLikeF16(70, 64, 1),
		kvLikeF16(300, 64, 2),
		q80Rows(kvLikeF32(128, 64, 3)),
		make([]byte, 600),
		randomBytes(301, 3),
	}
}

// seedDTypes are the dtypes the fuzzers' seed frames carry.
var seedDTypes = []engine.DType{engine.BF16, engine.F16, engine.Q8_0}

// FuzzDecodeFrame feeds DecodeFrame arbitrary bytes. It must never panic or
// decode more than the limit, and whatever it accepts must be a frame that
// re-encodes to the same raw bytes.
func FuzzDecodeFrame(f *testing.F) {
	for _, c := range codec.All() {
		for _, dt := range seedDTypes {
			if c.Supports(dt) != nil {
				continue
			}
			h := testHeader()
			h.DType = dt
			for _, raw := range seedRaws() {
				frame, err := codec.AppendFrame(nil, h, c, raw)
				if errors.Is(err, codec.ErrOddLength) {
					continue
				}
				if err != nil {
					f.Fatal(err)
				}
				f.Add(frame)
				f.Add(frame[:len(frame)-1])
				f.Add(frame[:len(frame)/2])
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, out, n, err := codec.DecodeFrame(nil, data, fuzzMaxRaw)
		if err != nil {
			if len(out) != 0 || n != 0 {
				t.Fatalf("error %v with %d bytes out, %d consumed", err, len(out), n)
			}
			return
		}
		if n > len(data) || n < codec.HeaderLen(h.RequestID) {
			t.Fatalf("consumed %d bytes of %d", n, len(data))
		}
		if len(out) != int(h.RawLen) || len(out) > fuzzMaxRaw {
			t.Fatalf("decoded %d bytes, header says %d, limit %d", len(out), h.RawLen, fuzzMaxRaw)
		}
		if cap(out) > 2*len(out)+64 {
			t.Fatalf("decoded %d bytes into a buffer of %d", len(out), cap(out))
		}
		if crc32.Checksum(out, crc32.MakeTable(crc32.Castagnoli)) != h.Checksum {
			t.Fatal("accepted a frame whose checksum does not match")
		}
		c, err := codec.ByID(h.Codec)
		if err != nil {
			t.Fatalf("accepted unknown codec %d", h.Codec)
		}
		if err := c.Supports(h.DType); err != nil {
			t.Fatalf("accepted a frame of dtype %v for %s: %v", h.DType, c.Name(), err)
		}
		if !c.Lossless() {
			return // re-quantizing dequantized values need not be exact
		}
		again, err := codec.AppendFrame(nil, h, c, out)
		if err != nil {
			t.Fatalf("re-encoding an accepted frame: %v", err)
		}
		h2, out2, _, err := codec.DecodeFrame(nil, again, fuzzMaxRaw)
		if err != nil || h2 != h || !bytes.Equal(out, out2) {
			t.Fatalf("re-encoded frame decodes to %+v, %v (was %+v)", h2, err, h)
		}
	})
}

// FuzzCodecDecode feeds each codec's Decode arbitrary bytes, raw lengths
// and dtypes, without the frame's header checksum in the way.
func FuzzCodecDecode(f *testing.F) {
	for _, c := range codec.All() {
		for _, dt := range seedDTypes {
			if c.Supports(dt) != nil {
				continue
			}
			for _, raw := range seedRaws() {
				enc, err := c.Encode(nil, raw, dt)
				if errors.Is(err, codec.ErrOddLength) {
					continue
				}
				if err != nil {
					f.Fatal(err)
				}
				f.Add(uint8(c.ID()), uint8(dt), enc, uint32(len(raw)))
				f.Add(uint8(c.ID()), uint8(dt), enc, uint32(len(raw)+2))
			}
		}
	}
	f.Fuzz(func(t *testing.T, id, dtype uint8, enc []byte, rawLen uint32) {
		c, err := codec.ByID(codec.ID(id % 6))
		if err != nil {
			t.Fatal(err)
		}
		dt := engine.DType(dtype % 5) // the known dtypes and two unknown ones
		n := int(rawLen % (fuzzMaxRaw + 1))
		out, err := c.Decode([]byte{7}, enc, n, dt)
		if err != nil {
			if len(out) != 1 || out[0] != 7 {
				t.Fatalf("%s: error %v changed dst to %d bytes", c.Name(), err, len(out))
			}
			if (c.Supports(dt) != nil) != errors.Is(err, codec.ErrDType) {
				t.Fatalf("%s: dtype %v: error %v", c.Name(), dt, err)
			}
			return
		}
		if c.Supports(dt) != nil {
			t.Fatalf("%s: decoded dtype %v, which it does not support", c.Name(), dt)
		}
		if len(out) != 1+n || out[0] != 7 {
			t.Fatalf("%s: decoded %d bytes, want %d", c.Name(), len(out)-1, n)
		}
	})
}

// FuzzLosslessRoundTrip checks that every lossless codec reproduces
// arbitrary input exactly, as every dtype it takes.
func FuzzLosslessRoundTrip(f *testing.F) {
	for _, raw := range seedRaws() {
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, tc := range losslessCases() {
			enc, err := tc.c.Encode(nil, raw, tc.dt)
			if err != nil {
				t.Fatalf("%s %v: Encode: %v", tc.c.Name(), tc.dt, err)
			}
			got, err := tc.c.Decode(nil, enc, len(raw), tc.dt)
			if err != nil || !bytes.Equal(got, raw) {
				t.Fatalf("%s %v: round trip of %d bytes: %v", tc.c.Name(), tc.dt, len(raw), err)
			}
		}
	})
}
