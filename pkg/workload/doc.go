// Package workload builds the requests of a benchmark: prompt and output
// lengths, the prompt content itself, and (for traces) arrival offsets.
//
// Sources: random lengths with vLLM's semantics (input/output length, range
// ratio, shared prefix), length distributions given as parameters, ShareGPT
// JSON (vLLM's shape and filters), the Azure LLM inference trace CSV and
// Mooncake JSONL traces whose hash ids name 512-token blocks that the
// generated prompts really share.
//
// Prompts are synthesised for a token count by a Synth: either text (exact on
// a byte-level tokenizer, one token per byte; an approximation of about one
// token per common English word on BPE tokenizers) or an array of token ids
// (exact on any server that accepts token-id prompts). Everything is
// deterministic in the seed. Parsers report malformed input with its line
// number and never panic on it.
package workload
