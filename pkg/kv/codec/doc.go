// Package codec turns canonical KV bytes (see package engine: little-endian
// bfloat16 or IEEE half values, or llama.cpp's q8_0 blocks) into wire bytes
// and back, and wraps them in self-describing frames.
//
// # Codecs and dtypes
//
// Every codec is told the dtype of the bytes it codes (Codec.Encode and
// Decode take an engine.DType); a frame carries the dtype, so a receiver
// decodes with the sender's.
//
//	id name  dtypes         what
//	0  none  any            raw bytes
//	1  s2    any            S2 block (klauspost/compress), fastest
//	2  zstd  any            one zstd frame, fastest level
//	3  bf16  bf16, f16      byte-plane split + Huffman, lossless
//	4  fp8   bf16, f16      e4m3 with a float32 scale per GroupSize values, lossy
//	5  int8  bf16, f16      int8 with a float32 scale per GroupSize values, lossy
//
// none, s2 and zstd treat the bytes as opaque, so they also carry q8_0
// (already quantized: use them, or none). bf16, fp8 and int8 read the
// values and refuse any other dtype with ErrDType: Codec.Supports tells a
// worker at start whether its codec fits its engine's KV dtype, and
// AppendFrame, DecodeFrame and PeekHeader refuse a frame that pairs them.
//
// The lossless plane codec keeps id 3 and its name "bf16" for both float
// dtypes (ids and the names peers exchange are fixed on the wire): the
// frame's dtype says how a value splits. For bf16 that is an exponent byte
// and a sign+mantissa byte, encoded exactly as before f16 existed; for f16
// the value's high byte (sign, 5 exponent bits, 2 mantissa bits) and its
// low byte. The planes that compress (the exponent or high-byte plane on
// dense KV) are Huffman-coded. ByName also knows it as "f16", the name an
// f16 deployment looks for, and "planes" (Aliases); Codec.Name, and so
// every peer and metric, says "bf16". Lossless coding tops out near 1.5× on
// bf16 and lower on f16, which has three more mantissa bits of noise.
//
// The lossy codecs read bf16 or f16 and decode to the same dtype; their
// payload format is the same for both. Their error bounds, per value, are
// on fp8Codec and int8Codec.
//
// # Frames
//
// A frame carries one layer × token range of one request: a fixed header
// (magic, version, codec, dtype, layer, range, raw length, CRC-32C of the
// raw bytes, payload length, header checksum), the request id and the
// payload. DecodeFrame checks everything a peer could get wrong or an
// attacker could forge, and never allocates more than the raw length it
// allows.
//
// Every codec, and the frame functions, are safe for concurrent use.
package codec
