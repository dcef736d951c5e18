package codec_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// Wire offsets of the frame header (see frame.go); the tests pin them.
const (
	offMagic    = 0
	offVersion  = 4
	offCodec    = 5
	offDType    = 6
	offIDLen    = 7
	offLayer    = 8
	offStart    = 12
	offEnd      = 16
	offRawLen   = 20
	offChecksum = 24
	offPayload  = 28
	offHdrCRC   = 32
	fixedHeader = 36
)

// reseal recomputes the header CRC of a frame whose header a test edited,
// so the edit reaches the checks behind the header checksum.
func reseal(frame []byte) []byte {
	hdr := fixedHeader + int(frame[offIDLen])
	crc := crc32.Update(0, crc32.MakeTable(crc32.Castagnoli), frame[:offHdrCRC])
	crc = crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), frame[fixedHeader:hdr])
	binary.LittleEndian.PutUint32(frame[offHdrCRC:], crc)
	return frame
}

func testHeader() codec.Header {
	return codec.Header{RequestID: "req-42", Layer: 7, Start: 16, End: 48, DType: engine.BF16}
}

func mustCodec(t testing.TB, name string) codec.Codec {
	t.Helper()
	c, err := codec.ByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// frameInputs are the raw chunks TestFrameRoundTrip frames, per dtype.
func frameInputs() map[engine.DType][]byte {
	return map[engine.DType][]byte{
		engine.BF16: gaussianBF16(32*64, 64, 21),
		engine.F16:  kvLikeF16(32*64, 64, 21),
		engine.Q8_0: q80Rows(kvLikeF32(32*64, 64, 21)),
	}
}

func TestFrameRoundTrip(t *testing.T) {
	for dt, raw := range frameInputs() {
		for _, c := range codec.All() {
			if c.Supports(dt) != nil {
				continue
			}
			t.Run(fmt.Sprintf("%s/%v", c.Name(), dt), func(t *testing.T) {
				h0 := testHeader()
				h0.DType = dt
				frame, err := codec.AppendFrame([]byte("head"), h0, c, raw)
				if err != nil {
					t.Fatalf("AppendFrame: %v", err)
				}
				frame = frame[4:]
				// Two frames back to back, and trailing bytes, parse one at a time.
				stream := append(append(bytes.Clone(frame), frame...), 0xff)
				var want []byte
				if c.Lossless() {
					want = raw
				} else {
					enc, _ := c.Encode(nil, raw, dt)
					want, _ = c.Decode(nil, enc, len(raw), dt)
				}
				wantHdr := h0
				wantHdr.Codec, wantHdr.RawLen = c.ID(), uint32(len(raw))
				wantHdr.Checksum = crc32.Checksum(want, crc32.MakeTable(crc32.Castagnoli))
				for i := range 2 {
					h, got, n, err := codec.DecodeFrame([]byte("dst"), stream, len(raw))
					if err != nil {
						t.Fatalf("frame %d: DecodeFrame: %v", i, err)
					}
					if diff := cmp.Diff(wantHdr, h); diff != "" {
						t.Errorf("frame %d: header (-want +got):\n%s", i, diff)
					}
					if n != len(frame) {
						t.Errorf("frame %d: consumed %d bytes, frame is %d", i, n, len(frame))
					}
					if !bytes.Equal(got, append([]byte("dst"), want...)) {
						t.Errorf("frame %d: decoded bytes differ", i)
					}
					ph, total, err := codec.PeekHeader(stream, len(raw))
					if err != nil || total != len(frame) || ph != h {
						t.Errorf("PeekHeader = %+v, %d, %v; want the decoded header, %d", ph, total, err, len(frame))
					}
					stream = stream[n:]
				}
				if len(stream) != 1 {
					t.Errorf("%d bytes left after two frames, want 1", len(stream))
				}
			})
		}
	}
}

// TestFrameDType checks the dtype checks of frames: a float-aware codec
// refuses q8_0 when framing and when decoding, and a frame decodes with
// its own dtype.
func TestFrameDType(t *testing.T) {
	q80 := q80Rows(kvLikeF32(32*64, 64, 22))
	f16 := kvLikeF16(32*64, 64, 22)
	for _, c := range codec.All() {
		t.Run(c.Name(), func(t *testing.T) {
			h := testHeader()
			h.DType = engine.Q8_0
			frame, err := codec.AppendFrame([]byte("x"), h, c, q80)
			if c.Supports(engine.Q8_0) == nil {
				if err != nil {
					t.Fatalf("AppendFrame of q8_0: %v", err)
				}
				return
			}
			if !errors.Is(err, codec.ErrDType) || string(frame) != "x" {
				t.Fatalf("AppendFrame of q8_0 = %q, %v; want dst unchanged, ErrDType", frame, err)
			}
			// A forged frame: f16 KV relabelled q8_0 under a valid header CRC.
			h.DType = engine.F16
			valid, err := codec.AppendFrame(nil, h, c, f16)
			if err != nil {
				t.Fatal(err)
			}
			forged := bytes.Clone(valid)
			forged[offDType] = byte(engine.Q8_0)
			reseal(forged)
			if _, out, n, err := codec.DecodeFrame([]byte("dst"), forged, len(f16)); !errors.Is(err, codec.ErrDType) || string(out) != "dst" || n != 0 {
				t.Errorf("DecodeFrame of a q8_0 frame = %q, %d, %v; want dst unchanged, 0, ErrDType", out, n, err)
			}
			if _, _, err := codec.PeekHeader(forged, len(f16)); !errors.Is(err, codec.ErrDType) {
				t.Errorf("PeekHeader of a q8_0 frame = %v, want ErrDType", err)
			}
			// The same payload read as bf16 decodes to other bytes: the
			// checksum catches it, so the decoder did use the frame's dtype.
			forged[offDType] = byte(engine.BF16)
			reseal(forged)
			if _, _, _, err := codec.DecodeFrame(nil, forged, len(f16)); !errors.Is(err, codec.ErrChecksum) {
				t.Errorf("DecodeFrame of f16 KV relabelled bf16 = %v, want ErrChecksum", err)
			}
		})
	}
}

func TestFrameEmptyPayloadAndLongID(t *testing.T) {
	h := testHeader()
	h.RequestID = strings.Repeat("x", codec.MaxRequestID)
	h.Start, h.End = 5, 5
	frame, err := codec.AppendFrame(nil, h, mustCodec(t, "none"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(frame) != codec.HeaderLen(h.RequestID) {
		t.Errorf("empty frame is %d bytes, want the header's %d", len(frame), codec.HeaderLen(h.RequestID))
	}
	got, out, n, err := codec.DecodeFrame(nil, frame, 0)
	if err != nil || len(out) != 0 || n != len(frame) || got.RequestID != h.RequestID {
		t.Errorf("DecodeFrame = %+v, %d bytes, %d, %v", got, len(out), n, err)
	}
}

func TestAppendFrameRejectsBadHeaders(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*codec.Header)
	}{
		{"request id too long", func(h *codec.Header) { h.RequestID = strings.Repeat("x", 256) }},
		{"start after end", func(h *codec.Header) { h.Start, h.End = 9, 8 }},
		{"unknown dtype", func(h *codec.Header) { h.DType = 0 }},
		{"dtype 9", func(h *codec.Header) { h.DType = 9 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testHeader()
			tc.edit(&h)
			got, err := codec.AppendFrame([]byte("x"), h, mustCodec(t, "none"), []byte{1, 2})
			if !errors.Is(err, codec.ErrBadHeader) || string(got) != "x" {
				t.Errorf("AppendFrame = %q, %v; want dst unchanged, ErrBadHeader", got, err)
			}
		})
	}
	h := testHeader()
	h.DType = engine.F16
	got, err := codec.AppendFrame([]byte("x"), h, mustCodec(t, "int8"), []byte{1, 2, 3})
	if !errors.Is(err, codec.ErrOddLength) || string(got) != "x" {
		t.Errorf("AppendFrame of odd bytes with int8 = %q, %v; want dst unchanged, ErrOddLength", got, err)
	}
}

// TestDecodeFrameTampered edits one field of a valid frame at a time and
// checks the error DecodeFrame reports.
func TestDecodeFrameTampered(t *testing.T) {
	for _, tcase := range []struct {
		name string
		dt   engine.DType
	}{{"none", engine.BF16}, {"bf16", engine.BF16}, {"zstd", engine.BF16}, {"fp8", engine.BF16}, {"bf16", engine.F16}, {"int8", engine.F16}, {"s2", engine.Q8_0}} {
		testDecodeFrameTampered(t, tcase.name, tcase.dt)
	}
}

func testDecodeFrameTampered(t *testing.T, name string, dt engine.DType) {
	raw := frameInputs()[dt][:2048]
	h0 := testHeader()
	h0.DType = dt
	c := mustCodec(t, name)
	label := name + "/" + dt.String()
	valid, err := codec.AppendFrame(nil, h0, c, raw)
	if err != nil {
		t.Fatal(err)
	}
	hdr := fixedHeader + len(testHeader().RequestID)
	put32 := func(off int, v uint32) func([]byte) []byte {
		return func(f []byte) []byte { binary.LittleEndian.PutUint32(f[off:], v); return f }
	}
	add32 := func(off int, d uint32) func([]byte) []byte {
		return func(f []byte) []byte {
			binary.LittleEndian.PutUint32(f[off:], binary.LittleEndian.Uint32(f[off:])+d)
			return f
		}
	}
	sealed := func(edit func([]byte) []byte) func([]byte) []byte {
		return func(f []byte) []byte { return reseal(edit(f)) }
	}
	setByte := func(off int, v byte) func([]byte) []byte {
		return func(f []byte) []byte { f[off] = v; return f }
	}
	for _, tc := range []struct {
		name   string
		edit   func([]byte) []byte
		maxRaw int
		want   error
	}{
		{"magic", setByte(offMagic, 'X'), len(raw), codec.ErrCorrupt},
		{"version", setByte(offVersion, 2), len(raw), codec.ErrVersion},
		{"unknown codec", sealed(setByte(offCodec, 77)), len(raw), codec.ErrUnknownCodec},
		{"codec unsealed", setByte(offCodec, byte((c.ID()+1)%6)), len(raw), codec.ErrCorrupt},
		{"unknown dtype", sealed(setByte(offDType, 9)), len(raw), codec.ErrCorrupt},
		{"request id length", setByte(offIDLen, 3), len(raw), codec.ErrCorrupt},
		{"request id byte", setByte(fixedHeader, 'R'), len(raw), codec.ErrCorrupt},
		{"layer", add32(offLayer, 1), len(raw), codec.ErrCorrupt},
		{"start", add32(offStart, 1), len(raw), codec.ErrCorrupt},
		{"end", add32(offEnd, 1), len(raw), codec.ErrCorrupt},
		{"start after end", sealed(put32(offStart, 1000)), len(raw), codec.ErrCorrupt},
		{"raw length above limit", nil, len(raw) - 1, codec.ErrTooLarge},
		{"raw length huge", sealed(put32(offRawLen, 1<<31)), 1 << 20, codec.ErrTooLarge},
		{"raw length unsealed", add32(offRawLen, 2), len(raw) + 2, codec.ErrCorrupt},
		{"raw length sealed", sealed(add32(offRawLen, 2)), len(raw) + 2, codec.ErrCorrupt},
		{"raw length shorter", sealed(add32(offRawLen, ^uint32(1))), len(raw), codec.ErrCorrupt},
		{"checksum", add32(offChecksum, 1), len(raw), codec.ErrCorrupt},
		{"checksum sealed", sealed(add32(offChecksum, 1)), len(raw), codec.ErrChecksum},
		{"payload length beyond frame", sealed(add32(offPayload, 1)), len(raw), codec.ErrCorrupt},
		{"payload length shorter", sealed(add32(offPayload, ^uint32(0))), len(raw), codec.ErrCorrupt},
		{"header crc", add32(offHdrCRC, 1), len(raw), codec.ErrCorrupt},
		{"payload last byte", func(f []byte) []byte { f[len(f)-1] ^= 0x10; return f }, len(raw), errors.Join(codec.ErrChecksum, codec.ErrCorrupt)},
		{"payload fifth byte", func(f []byte) []byte { f[hdr+4] ^= 0x01; return f }, len(raw), errors.Join(codec.ErrChecksum, codec.ErrCorrupt)},
		{"negative limit", nil, -1, codec.ErrTooLarge},
	} {
		t.Run(label+"/"+tc.name, func(t *testing.T) {
			frame := bytes.Clone(valid)
			if tc.edit != nil {
				frame = tc.edit(frame)
			}
			h, out, n, err := codec.DecodeFrame([]byte("dst"), frame, tc.maxRaw)
			if !matches(err, tc.want) {
				t.Fatalf("DecodeFrame = %v, want %v", err, tc.want)
			}
			if string(out) != "dst" || n != 0 || h != (codec.Header{}) {
				t.Errorf("on error DecodeFrame returned %q, %d, %+v; want dst unchanged, 0, zero header", out, n, h)
			}
		})
	}
	// Every truncation fails cleanly.
	for cut := range len(valid) {
		if _, _, _, err := codec.DecodeFrame(nil, valid[:cut], len(raw)); !errors.Is(err, codec.ErrCorrupt) {
			t.Fatalf("%s: frame cut to %d of %d bytes: %v, want ErrCorrupt", label, cut, len(valid), err)
		}
	}
}

// matches reports whether err is want or, for a want made by errors.Join,
// any one of its errors.
func matches(err, want error) bool {
	if any, ok := want.(interface{ Unwrap() []error }); ok {
		for _, w := range any.Unwrap() {
			if errors.Is(err, w) {
				return true
			}
		}
		return false
	}
	return errors.Is(err, want)
}
