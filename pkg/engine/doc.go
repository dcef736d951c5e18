// Package engine defines the contract between pdserve's workers and the model
// engines that run on them: a model spec, batched (chunked) prefill that hands
// out KV per layer and token chunk as soon as it is computed, batched decode
// steps over sequences of different lengths, deterministic sampling, and KV
// export/import in one canonical layout.
//
// Implementations live in sub-packages (engine/ref: the reference CPU
// transformer; engine/sim: the performance-model engine; engine/llamacpp:
// GGUF models on llama.cpp). The conformance
// suite every implementation must pass lives in engine/enginetest.
//
// # Canonical KV layout
//
// The KV of one layer for a token range [start, end) is a byte slice of
// KVChunkBytes(end-start) bytes: first K, then V, each laid out as
// [token][kv head][head dim] of the spec's KVDType: little-endian bfloat16
// (ref, sim), float16 or Q8_0 rows of KVHeads×HeadDim values (llamacpp, as
// llama.cpp's KV cache holds them). Export → import of this layout is
// bit-exact.
package engine
