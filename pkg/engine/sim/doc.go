// Package sim is the performance-model engine: an engine.Engine that
// behaves, in time and in KV size, like a named GPU serving a named model
// (a perfmodel.Profile such as "a100-80g/opt-13b/tp1"), so that a machine
// without GPUs can run the whole system at cluster scale.
//
//   - Time: every step (prefill, decode or a mixed colocated step through
//     engine.Stepper) waits out the profile's modeled step time multiplied
//     by Options.TimeScale, through an injectable Clock and Sleep. During
//     prefill each layer's KV is handed out when the modeled GPU would
//     finish that layer, so transfers overlap compute.
//   - Tokens: deterministic functions of the request's tokens, position and
//     sampling seed (never of SeqID or batch), printable bytes of the
//     byte-level tokenizer; identical whether a sequence was prefilled
//     locally or imported from another engine, or forked from another
//     sequence (engine.Forker). The engine computes no logits:
//     Output.Logits and Output.AllLogits are always nil, and
//     Sampling.TopP and Sampling.Penalties are not modelled. A grammar
//     (Sampling.Constraint: structured output, forced tool calls) is
//     followed: the engine masks a hash-drawn stand-in for logits with it
//     and takes the best id allowed, EOS included, so that tool-calling
//     and agent workloads run on the performance model too.
//   - KV: the model's true layer count, KV heads and head dim, so blocks
//     have the true byte size, filled with synthetic bf16 values of
//     realistic statistics (codecs see realistic data). Options.PayloadScale
//     hands out a scaled-down payload whose KVChunk.FullBytes keeps the
//     true size; Pacer paces a stream by that size over a configured link
//     bandwidth.
//   - Memory: KV bytes are regenerated on export, never stored; a sequence
//     costs 8 bytes per token plus any imported KV that the engine could
//     not regenerate.
package sim
