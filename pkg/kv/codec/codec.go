package codec

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/pdserve/pdserve/pkg/engine"
)

// ID identifies a codec on the wire. Values are fixed forever.
type ID uint8

// Codec ids.
const (
	None ID = 0 // raw bytes
	S2   ID = 1 // S2 block format (klauspost/compress/s2)
	Zstd ID = 2 // zstd frame, fastest level
	BF16 ID = 3 // byte-plane split + Huffman of bf16 or f16 values, lossless; also named "f16" and "planes"
	FP8  ID = 4 // e4m3 with a float32 scale per GroupSize values, lossy
	INT8 ID = 5 // symmetric int8 with a float32 scale per GroupSize values, lossy
)

// String returns the codec's name, or "codec(N)" for an unknown id.
func (id ID) String() string {
	if c, err := ByID(id); err == nil {
		return c.Name()
	}
	return fmt.Sprintf("codec(%d)", uint8(id))
}

// MaxRawLen is the largest raw input a codec or frame accepts, in bytes:
// lengths travel as uint32.
const MaxRawLen = math.MaxUint32

// Errors returned by codecs and frames, wrapped with detail; match with
// errors.Is.
var (
	// ErrCorrupt: encoded bytes or a frame that do not decode.
	ErrCorrupt = errors.New("codec: corrupt input")
	// ErrTooLarge: a raw length above the caller's limit or MaxRawLen.
	ErrTooLarge = errors.New("codec: data too large")
	// ErrChecksum: a frame whose decoded bytes fail its CRC-32C.
	ErrChecksum = errors.New("codec: checksum mismatch")
	// ErrUnknownCodec: a codec name or id this build does not know.
	ErrUnknownCodec = errors.New("codec: unknown codec")
	// ErrVersion: a frame of a format version this build does not read.
	ErrVersion = errors.New("codec: unsupported frame version")
	// ErrBadHeader: AppendFrame was given a header it cannot encode.
	ErrBadHeader = errors.New("codec: invalid frame header")
	// ErrOddLength: a lossy codec was given bytes that are not whole
	// 2-byte values.
	ErrOddLength = errors.New("codec: odd length, not whole 2-byte values")
	// ErrDType: a codec asked to code KV of a dtype it cannot read (a
	// float-aware codec and Q8_0 or an unknown dtype), or a frame that
	// pairs them.
	ErrDType = errors.New("codec: dtype not supported by the codec")
)

// Codec compresses canonical KV bytes of one dtype. Implementations are
// safe for concurrent use and keep no reference to the slices passed in.
//
// none, s2 and zstd treat the bytes as opaque and take any dtype; bf16,
// fp8 and int8 read the values and take the 2-byte float dtypes
// (engine.BF16, engine.F16) only. The dtype travels in the frame header, so
// the decoder is always given the encoder's.
type Codec interface {
	// ID returns the codec's wire id.
	ID() ID
	// Name returns the codec's name: "none", "s2", "zstd", "bf16", "fp8"
	// or "int8".
	Name() string
	// Lossless reports whether Decode(Encode(raw)) == raw for every input.
	// Lossy codecs are exact only on the values they can represent.
	Lossless() bool
	// Supports returns nil when the codec can code KV of dtype dt, else an
	// error wrapping ErrDType. A worker calls it at start with its codec
	// and its engine's KV dtype.
	Supports(dt engine.DType) error
	// Encode appends the encoding of raw, KV of dtype dt, to dst and
	// returns the extended slice. Lossless codecs take raw of any length;
	// lossy ones take whole 2-byte values only. Errors: ErrDType (see
	// Supports), ErrTooLarge beyond MaxRawLen, ErrOddLength (lossy
	// codecs). On error dst is returned unextended.
	Encode(dst, raw []byte, dt engine.DType) ([]byte, error)
	// Decode appends exactly rawLen decoded bytes of dtype dt (the dtype
	// given to Encode) to dst and returns the extended slice. It allocates
	// at most rawLen bytes (growing dst), never an amount chosen by enc.
	// Errors: ErrDType (see Supports); ErrCorrupt, with detail, when enc is
	// not a valid encoding of rawLen bytes. On error dst is returned at its
	// original length; bytes past it may have been written.
	Decode(dst, enc []byte, rawLen int, dt engine.DType) ([]byte, error)
}

var codecs = [...]Codec{
	None: noneCodec{},
	S2:   s2Codec{},
	Zstd: zstdCodec{},
	BF16: bf16Codec{},
	FP8:  fp8Codec{},
	INT8: int8Codec{},
}

// aliases are further names ByName accepts. The byte-plane codec is called
// "bf16" on the wire and in metrics; "f16" is the name an f16 deployment
// looks for, "planes" the one that names neither dtype.
var aliases = map[string]ID{"f16": BF16, "planes": BF16}

// ByName returns the codec called name: a name of Names or an alias of
// Aliases. Errors: ErrUnknownCodec.
func ByName(name string) (Codec, error) {
	for _, c := range codecs {
		if c.Name() == name {
			return c, nil
		}
	}
	if id, ok := aliases[name]; ok {
		return codecs[id], nil
	}
	return nil, fmt.Errorf("codec: %q: %w", name, ErrUnknownCodec)
}

// Aliases returns the further names ByName accepts, each mapped to the
// codec's own name ("f16" and "planes" to "bf16"). Names lists none of
// them, and a peer is told the codec's own name (Codec.Name). The caller
// owns the map.
func Aliases() map[string]string {
	out := make(map[string]string, len(aliases))
	for a, id := range aliases {
		out[a] = codecs[id].Name()
	}
	return out
}

// ByID returns the codec with wire id id. Errors: ErrUnknownCodec.
func ByID(id ID) (Codec, error) {
	if int(id) < len(codecs) {
		return codecs[id], nil
	}
	return nil, fmt.Errorf("codec: id %d: %w", uint8(id), ErrUnknownCodec)
}

// All returns every codec, lossless ones first. The caller owns the slice.
func All() []Codec {
	out := LosslessCodecs()
	for _, c := range codecs {
		if !c.Lossless() {
			out = append(out, c)
		}
	}
	return out
}

// LosslessCodecs returns the lossless codecs. The caller owns the slice.
func LosslessCodecs() []Codec {
	var out []Codec
	for _, c := range codecs {
		if c.Lossless() {
			out = append(out, c)
		}
	}
	return out
}

// Names returns the names of All, in order, for flag help and validation.
// ByName also accepts the Aliases.
func Names() []string {
	var names []string
	for _, c := range All() {
		names = append(names, c.Name())
	}
	return names
}

// grow returns dst with room for n more bytes past len(dst).
func grow(dst []byte, n int) []byte { return slices.Grow(dst, n) }

// anyDType is the Supports of the codecs that treat bytes as opaque.
type anyDType struct{}

func (anyDType) Supports(engine.DType) error { return nil }

// checkFloat is the Supports of the codecs that read values: it refuses a
// dtype that is not a 2-byte float.
func checkFloat(name string, dt engine.DType) error {
	if !dt.Float() {
		return fmt.Errorf("codec: %s: dtype %v, want bf16 or f16: %w", name, dt, ErrDType)
	}
	return nil
}

// checkRaw rejects inputs whose length does not fit a frame.
func checkRaw(name string, raw []byte) error {
	if uint64(len(raw)) > MaxRawLen {
		return fmt.Errorf("codec: %s: encode %d bytes: %w", name, len(raw), ErrTooLarge)
	}
	return nil
}

// checkRawLen rejects a negative or oversized rawLen passed to Decode.
func checkRawLen(name string, rawLen int) error {
	if rawLen < 0 || uint64(rawLen) > MaxRawLen {
		return fmt.Errorf("codec: %s: decode to %d bytes: %w", name, rawLen, ErrCorrupt)
	}
	return nil
}

// noneCodec stores raw bytes.
type noneCodec struct{ anyDType }

func (noneCodec) ID() ID         { return None }
func (noneCodec) Name() string   { return "none" }
func (noneCodec) Lossless() bool { return true }

func (noneCodec) Encode(dst, raw []byte, _ engine.DType) ([]byte, error) {
	if err := checkRaw("none", raw); err != nil {
		return dst, err
	}
	return append(dst, raw...), nil
}

func (noneCodec) Decode(dst, enc []byte, rawLen int, _ engine.DType) ([]byte, error) {
	if len(enc) != rawLen {
		return dst, fmt.Errorf("codec: none: %d encoded bytes for %d raw: %w", len(enc), rawLen, ErrCorrupt)
	}
	return append(dst, enc...), nil
}
