// Package llamacpp is pdserve's engine for real models: GGUF files of any
// architecture llama.cpp loads, run through llama.cpp's C API, which is
// loaded at run time with purego (no cgo; the binary needs the system's C
// library and dynamic loader). This package owns every call into C; the
// rest of pdserve sees engine.Engine, engine.Tokenizer and Go types only.
//
// # Parts
//
//   - lib.go: finding and opening libllama/libggml (Options.LibDir,
//     $PDSERVE_LLAMA_LIB, third_party/llama/lib), binding the entry points
//     of the pinned release, routing llama.cpp's log to zap.
//   - model.go: Model (weights, or the vocabulary alone for a coordinator)
//     and Tokenizer (llama_tokenize as llama-server calls it, token pieces,
//     end-of-generation ids, the GGUF's chat template).
//   - engine.go, step.go: Engine, one llama_context with a unified KV cache
//     holding every sequence; Step puts prefill chunks and decode tokens of
//     many sequences in one llama_decode call (AllLogits chunks ask for
//     every token's logits); Fork shares a prefix's cells with a new
//     sequence (llama_memory_seq_cp); every llama_decode runs on one locked
//     OS thread (cthread.go).
//   - state.go: a sequence's KV leaves and enters through
//     llama_state_seq_get_data / set_data; this file reads and writes that
//     blob, converting to and from the canonical layout of package engine
//     (per layer, K rows then V rows of the cache's type, f16 or q8_0).
//   - reference.go: llama.cpp's own single-sequence generation, the oracle
//     the tests compare the engine with.
//   - grammar.go: structured output through llama.cpp's grammar
//     sampler, one per sequence (Model.NewGrammar, Engine.NewGrammar):
//     it masks the logits pdserve's sampler chooses from; each token is
//     checked with a one-candidate llama_sampler_apply before
//     llama_sampler_accept, which would abort the process on a refused
//     one.
//   - metrics.go: the KV cells and sequences the engine holds, for
//     Prometheus.
//
// # Ownership
//
// LoadModel's Model is closed with Close after every engine on it; New
// owns its model and Close frees both; NewOnModel shares one. Logits and
// KV chunks handed out are engine memory, valid until the next call, as
// package engine specifies. An Engine is not safe for concurrent use; a
// Tokenizer is.
//
// # Transfer granularity
//
// llama.cpp computes all layers of a batch in one llama_decode call, so
// during a chunked prefill the KV of each chunk is handed out, every layer
// at once, as soon as the call that computed it returns. A decode worker
// stages what it receives and sets the whole sequence in llama.cpp with one
// call before the sequence's first step. Models whose cache the canonical
// layout cannot carry (sliding-window or recurrent caches, per-cell M-RoPE
// positions) run, but only colocated: see Engine.Transferable.
//
// Flash attention is always on (see Engine). Errors wrap the engine
// package's sentinels where they apply, and ErrNoLibrary, ErrNoSlot,
// ErrNoKVSpace, ErrNoTransfer and ErrNoChatTemplate otherwise.
package llamacpp
