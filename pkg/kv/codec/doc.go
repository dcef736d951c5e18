// Package codec turns canonical KV bytes (little-endian bfloat16, see package
// engine) into wire bytes and back, and wraps them in self-describing frames.
//
// Codecs: none; s2 and zstd (general-purpose, klauspost/compress); bf16, a
// lossless codec for bfloat16 that splits each value into an exponent byte
// and a sign+mantissa byte and Huffman-codes the planes that compress; and
// the lossy fp8 (e4m3) and int8 codecs with a float32 scale per group of
// GroupSize values. Lossless bf16 data compresses to at most ≈1.5×: the
// mantissa is close to random.
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
