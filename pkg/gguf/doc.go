// Package gguf reads and writes GGUF files, llama.cpp's model format, in
// pure Go, and generates random-weight models of real architectures over
// real tokenizers for testing and benchmarking the llama.cpp engine where
// no pretrained weights can be downloaded.
//
// # Format
//
// ReadFile and Read parse a GGUF v2 or v3 header: the ordered metadata
// (every value type, arrays and arrays of arrays included; see KV for the
// Go types), the tensor infos and the alignment (general.alignment or 32
// bytes). Tensor data stays in the file: File.TensorData reads it raw,
// File.TensorFloat32 decoded. Headers of files with any ggml tensor type
// are read; only F32, F16 and Q8_0 data is encoded and decoded.
//
// Writer, Write and WriteFile write GGUF v3, little endian. The writer
// streams: tensors are encoded from float32 as their values arrive (a
// Tensor's Fill is called a chunk of rows at a time), so a model need never
// be in memory whole. Q8_0 is ggml's reference quantisation: per block of
// 32 values a half scale d = max|x|/127 and 32 int8 round(x/d); Q8Bound
// gives the error bound.
//
// # Random models
//
// RandomModel and WriteRandom build a model of a llama.cpp architecture
// (Archs: llama, qwen2) from RandomOptions, copying every tokenizer.* key
// of a vocab GGUF (llama.cpp's third_party/llama/vocab/ggml-vocab-*.gguf,
// found by VocabDir) so the tokenizer is the real one, and drawing weights
// from uniform distributions of standard deviation 1/√fan-in (divided by
// √(2·layers) for the projections into the residual stream; norm weights
// 1, input embeddings σ 1). The same options and seed give the same file,
// byte for byte, and a model is generated a chunk at a time (a
// Qwen2.5-0.5B-shaped one in a few seconds and tens of MB). The weights
// are random: llama.cpp loads and runs the model at the real shape and
// speed, with greedy output that varies with the prompt, but the text it
// generates is gibberish. Shapes lists presets (tiny-llama, tiny-qwen2,
// qwen2.5-0.5b); the tiny ones generate in well under a second (tiny-qwen2,
// over the 151936-token vocab: about 0.2 s, 0.5 s under -race), for tests
// in other packages:
//
//	o, _ := gguf.Shape("tiny-qwen2")
//	o.Seed = 1
//	path := filepath.Join(t.TempDir(), "m.gguf")
//	if err := gguf.WriteRandom(path, o); err != nil { ... }
//
// On an x86 host with AMX, a llama.cpp CPU build that repacks Q8_0 weights
// for AMX (the default) crashed on batches of more than one token of any
// Q8_0 model in this project's sandbox (SIGSEGV/SIGILL in
// ggml_backend_amx_mul_mat); F16 models, or llama.cpp's --no-repack, avoid
// that path.
//
// The functions keep no shared state and may run concurrently; a Writer
// belongs to one goroutine.
package gguf
