package codec

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sync"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// Header describes one frame: one layer × token range of one request.
type Header struct {
	RequestID  string // at most MaxRequestID bytes
	Layer      uint32
	Start, End uint32       // token range [Start, End), Start ≤ End
	DType      engine.DType // element type of the raw bytes, a known dtype: the codec codes it, the receiver decodes to it
	Codec      ID
	RawLen     uint32 // length of the raw (decoded) bytes
	// Checksum is the CRC-32C (Castagnoli) of the raw bytes as the receiver
	// decodes them: for a lossless codec the sender's raw bytes, for a lossy
	// one their dequantized form.
	Checksum uint32
}

// Frame layout (all integers little endian):
//
//	off len
//	0   4   magic "PDKV"
//	4   1   version (1)
//	5   1   codec id
//	6   1   dtype
//	7   1   request id length r
//	8   4   layer
//	12  4   start
//	16  4   end
//	20  4   raw length
//	24  4   CRC-32C of the raw bytes
//	28  4   payload length p
//	32  4   CRC-32C of bytes [0, 32) and the request id
//	36  r   request id
//	36+r p  payload (the codec's encoding of the raw bytes)
const (
	frameMagic   = "PDKV"
	frameVersion = 1
	fixedHeader  = 36 // bytes before the request id
	hdrCRCOffset = 32
)

// MaxRequestID is the longest request id a frame carries, in bytes.
const MaxRequestID = vocab.MaxRequestID

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// HeaderLen returns the size in bytes of a frame header carrying requestID;
// a frame is HeaderLen + payload bytes.
func HeaderLen(requestID string) int { return fixedHeader + len(requestID) }

// AppendFrame encodes raw, KV of dtype h.DType, with c and appends one
// complete frame (header and payload) to dst, returning the extended slice.
// It sets h.Codec, h.RawLen and h.Checksum itself. Errors: ErrBadHeader
// (request id longer than MaxRequestID, Start > End, unknown dtype),
// ErrDType (c cannot code h.DType, see Codec.Supports), ErrTooLarge (raw or
// payload beyond MaxRawLen), the codec's. On error dst is returned
// unextended.
func AppendFrame(dst []byte, h Header, c Codec, raw []byte) ([]byte, error) {
	switch {
	case len(h.RequestID) > MaxRequestID:
		return dst, fmt.Errorf("codec: frame: request id of %d bytes, max %d: %w", len(h.RequestID), MaxRequestID, ErrBadHeader)
	case h.Start > h.End:
		return dst, fmt.Errorf("codec: frame: token range [%d, %d): %w", h.Start, h.End, ErrBadHeader)
	case !h.DType.Valid():
		return dst, fmt.Errorf("codec: frame: dtype %v: %w", h.DType, ErrBadHeader)
	case uint64(len(raw)) > MaxRawLen:
		return dst, fmt.Errorf("codec: frame: %d raw bytes: %w", len(raw), ErrTooLarge)
	}
	if err := c.Supports(h.DType); err != nil {
		return dst, fmt.Errorf("codec: frame: %w", err)
	}
	base := len(dst)
	hdr := HeaderLen(h.RequestID)
	dst = append(grow(dst, hdr)[:base+fixedHeader], h.RequestID...) // codecs grow for the payload
	out, err := c.Encode(dst, raw, h.DType)
	if err != nil {
		return dst[:base], fmt.Errorf("codec: frame: %w", err)
	}
	dst = out
	payload := len(dst) - base - hdr
	if uint64(payload) > MaxRawLen {
		return dst[:base], fmt.Errorf("codec: frame: payload of %d bytes: %w", payload, ErrTooLarge)
	}
	h.Codec, h.RawLen = c.ID(), uint32(len(raw))
	if h.Checksum, err = decodedChecksum(c, dst[base+hdr:], raw, h.DType); err != nil {
		return dst[:base], fmt.Errorf("codec: frame: %w", err)
	}
	putHeader(dst[base:base+hdr], h, uint32(payload))
	return dst, nil
}

// decodedChecksum returns the CRC-32C of what a receiver decodes from enc
// (KV of dtype dt): raw itself for a lossless codec.
func decodedChecksum(c Codec, enc, raw []byte, dt engine.DType) (uint32, error) {
	if c.Lossless() {
		return crc32.Checksum(raw, castagnoli), nil
	}
	bp := scratch.Get().(*[]byte)
	defer scratch.Put(bp)
	dec, err := c.Decode((*bp)[:0], enc, len(raw), dt)
	if err != nil {
		return 0, fmt.Errorf("%s: decoding its own output: %w", c.Name(), err)
	}
	*bp = dec
	return crc32.Checksum(dec, castagnoli), nil
}

var scratch = sync.Pool{New: func() any { return new([]byte) }}

func putHeader(b []byte, h Header, payload uint32) {
	le := binary.LittleEndian
	copy(b, frameMagic)
	b[4], b[5], b[6], b[7] = frameVersion, byte(h.Codec), byte(h.DType), byte(len(h.RequestID))
	le.PutUint32(b[8:], h.Layer)
	le.PutUint32(b[12:], h.Start)
	le.PutUint32(b[16:], h.End)
	le.PutUint32(b[20:], h.RawLen)
	le.PutUint32(b[24:], h.Checksum)
	le.PutUint32(b[28:], payload)
	copy(b[fixedHeader:], h.RequestID)
	le.PutUint32(b[hdrCRCOffset:], headerCRC(b))
}

// headerCRC is the CRC-32C of the fixed header before its CRC field and of
// the request id; b holds the whole header.
func headerCRC(b []byte) uint32 {
	crc := crc32.Update(0, castagnoli, b[:hdrCRCOffset])
	return crc32.Update(crc, castagnoli, b[fixedHeader:])
}

// DecodeFrame parses one frame from the start of frame, decodes its payload
// and appends the raw bytes to dst. maxRaw (≥ 0) caps the raw length the
// caller accepts: DecodeFrame allocates at most that many bytes, and only
// after the header has checked out. It returns the header, the extended dst
// and the number of bytes of frame consumed (the frame may be followed by
// more data).
//
// The payload decodes to KV of the header's dtype.
//
// Errors, in the order checked: ErrCorrupt (truncated header, bad magic),
// ErrVersion, ErrCorrupt (truncated frame, Start > End, unknown dtype),
// ErrUnknownCodec, ErrTooLarge (raw length > maxRaw), ErrCorrupt (header
// checksum), ErrDType (a codec that cannot read the frame's dtype, such as
// bf16 on q8_0), ErrCorrupt (payload that does not decode to exactly the
// raw length), ErrChecksum (decoded bytes fail the CRC-32C). On error dst
// is returned at its original length and consumed is 0.
func DecodeFrame(dst, frame []byte, maxRaw int) (Header, []byte, int, error) {
	h, hdr, payload, err := parseHeader(frame, maxRaw)
	if err != nil {
		return Header{}, dst, 0, err
	}
	c, _ := ByID(h.Codec) // checked by parseHeader
	base := len(dst)
	dst, err = c.Decode(dst, frame[hdr:hdr+payload], int(h.RawLen), h.DType)
	if err != nil {
		return Header{}, dst[:base], 0, fmt.Errorf("codec: frame %q layer %d [%d, %d): %w", h.RequestID, h.Layer, h.Start, h.End, err)
	}
	if sum := crc32.Checksum(dst[base:], castagnoli); sum != h.Checksum {
		return Header{}, dst[:base], 0, fmt.Errorf("codec: frame %q layer %d [%d, %d): CRC-32C %#08x, header says %#08x: %w",
			h.RequestID, h.Layer, h.Start, h.End, sum, h.Checksum, ErrChecksum)
	}
	return h, dst, hdr + payload, nil
}

// PeekHeader parses and checks the header at the start of frame without
// decoding the payload, as DecodeFrame would (same errors, maxRaw likewise),
// and returns it with the frame's total length. A receiver uses it to place
// or refuse a frame before paying for its decoding.
func PeekHeader(frame []byte, maxRaw int) (Header, int, error) {
	h, hdr, payload, err := parseHeader(frame, maxRaw)
	if err != nil {
		return Header{}, 0, err
	}
	return h, hdr + payload, nil
}

func parseHeader(frame []byte, maxRaw int) (h Header, hdr, payload int, err error) {
	if len(frame) < fixedHeader {
		return h, 0, 0, fmt.Errorf("codec: frame: %d bytes, header needs %d: %w", len(frame), fixedHeader, ErrCorrupt)
	}
	if string(frame[:4]) != frameMagic {
		return h, 0, 0, fmt.Errorf("codec: frame: bad magic %q: %w", frame[:4], ErrCorrupt)
	}
	if frame[4] != frameVersion {
		return h, 0, 0, fmt.Errorf("codec: frame: version %d, this build reads %d: %w", frame[4], frameVersion, ErrVersion)
	}
	le := binary.LittleEndian
	h = Header{
		Codec:    ID(frame[5]),
		DType:    engine.DType(frame[6]),
		Layer:    le.Uint32(frame[8:]),
		Start:    le.Uint32(frame[12:]),
		End:      le.Uint32(frame[16:]),
		RawLen:   le.Uint32(frame[20:]),
		Checksum: le.Uint32(frame[24:]),
	}
	hdr = fixedHeader + int(frame[7])
	payload64 := uint64(le.Uint32(frame[28:]))
	if uint64(len(frame)) < uint64(hdr)+payload64 {
		return Header{}, 0, 0, fmt.Errorf("codec: frame: %d bytes, header and payload need %d: %w", len(frame), uint64(hdr)+payload64, ErrCorrupt)
	}
	payload = int(payload64)
	h.RequestID = string(frame[fixedHeader:hdr])
	switch {
	case h.Start > h.End:
		err = fmt.Errorf("token range [%d, %d): %w", h.Start, h.End, ErrCorrupt)
	case !h.DType.Valid():
		err = fmt.Errorf("dtype %v: %w", h.DType, ErrCorrupt)
	default:
		if c, cerr := ByID(h.Codec); cerr != nil {
			err = cerr
		} else if maxRaw < 0 || uint64(h.RawLen) > uint64(maxRaw) {
			err = fmt.Errorf("raw length %d above the limit %d: %w", h.RawLen, maxRaw, ErrTooLarge)
		} else if sum := le.Uint32(frame[hdrCRCOffset:]); sum != headerCRC(frame[:hdr]) {
			err = fmt.Errorf("header CRC-32C mismatch: %w", ErrCorrupt)
		} else {
			err = c.Supports(h.DType)
		}
	}
	if err != nil {
		return Header{}, 0, 0, fmt.Errorf("codec: frame %q layer %d: %w", h.RequestID, h.Layer, err)
	}
	return h, hdr, payload, nil
}
