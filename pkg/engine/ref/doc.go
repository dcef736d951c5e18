// Package ref is the reference CPU engine: a Llama-architecture decoder in
// pure Go and pdserve's correctness oracle. Disaggregated output (prefill
// here, KV over the wire, decode there) must equal single-process output
// bit for bit, and this engine is what makes that checkable.
//
// # Model
//
// Token embedding; per layer RMSNorm → grouped-query causal attention with
// RoPE (consecutive-pair rotation, θ from the spec) over the sequence's
// cached KV → residual → RMSNorm → SwiGLU MLP → residual; final RMSNorm and
// an untied LM head. Math is float32. Weights are synthetic, drawn from a
// seed (see Presets): "tiny" (≈0.13 M parameters, for tests) and "small"
// (≈28.5 M, hidden 512, 10 layers, GQA 8:2, for benchmarks and demos), both
// with the byte-level vocabulary of package tokenizer. Loading real weights
// (GGUF) is not implemented.
//
// # Determinism
//
// K and V are stored as bfloat16 (round to nearest even) in the canonical
// layout of package engine, and attention reads only those rounded values,
// so an engine that imported a sequence's KV computes exactly what the
// exporting engine would. Every output element is computed by one worker
// in a fixed order, so logits do not depend on the batch a sequence is in,
// on how its prompt was chunked, or on the number of threads; an
// AllLogits row equals the Last logits of the prefix it ends, and a Fork
// (a copy of the prefix's KV) decodes exactly as a fresh prefill would. They do
// depend on the build: the portable kernels and the SIMD kernels (AVX2 and
// AVX-512, which agree with each other bit for bit) round differently (the
// SIMD ones fuse multiply-adds and sum some reductions in another order),
// so workers that exchange KV must be built alike (both with or both
// without GOEXPERIMENT=simd). The difference is bounded: every build's
// logits lie within 1e-3 of the same model computed in float64 (with bf16
// KV), so the two builds' logits within 2e-3 of each other, on the tiny
// preset whose logits are of order 3 (TestLogitsWithinBound asserts it
// for each kernel set of the build it runs in).
//
// # Performance
//
// Weights are packed in panels for a register-blocked matmul that reads
// them once per step for the whole batch; matrix, attention and row work
// is spread over a persistent pool of goroutines (Options.Threads); the
// hot path allocates nothing once scratch buffers and KV capacities have
// grown (a step allocates only its returned []Output). Attention is matrix
// work too: a unit packs one KV head's keys and values into panels and
// runs the same matmul kernel for the scores (queries × keys) and for the
// output (probabilities × values) of a few query rows together (see
// attention.go). Built with GOEXPERIMENT=simd on amd64, the kernels use
// AVX2 and FMA (and AVX-512 for the matmul) through simd/archsimd when the
// CPU has them; the portable Go kernels are the default and are several
// times slower. The SIMD kernels clear the upper halves of the vector
// registers before any scalar float code runs, which Go compiles to legacy
// SSE instructions that are slow while the halves are dirty.
//
// The benchmarks (BenchmarkPrefill, BenchmarkDecode) report GFLOP/s of a
// whole step counted as 2 FLOPs per weight for every row a matrix
// multiplies (the engine skips the rows of the last layer whose logits are
// not wanted) plus, for attention, 4·HeadDim FLOPs per (query head, key)
// pair attended: 2·HeadDim for the score, 2·HeadDim for the weighted value.
// Norms, RoPE, softmax, SwiGLU and the packing are not counted. The
// kernel benchmarks (BenchmarkMatmul, BenchmarkAttention, BenchmarkSoftmax,
// BenchmarkSwiGLU) have the same names in both builds, so that the two
// compare benchmark by benchmark.
//
// An Engine is not safe for concurrent use (see engine.Engine); Close stops
// its goroutines.
package ref
