// Package profiler is `coordinator profile`: it runs one engine alone
// (llama.cpp on a GGUF model, the ref engine, or the sim engine, built as
// package enginecfg builds a worker's) and measures the step times the
// performance model of package perfmodel needs, then fits that model and
// writes a profile file the planner, the sim engine and the online
// planner read.
//
// # Measurement
//
// Measure times, on random prompt tokens of a fixed seed:
//
//   - prefill steps of k prompts of l tokens (the time against the
//     batch's Σl, Σl² and, for k > 1, the cells of the other prompts);
//   - decode steps of b sequences (1, 2, 3, then powers of two) at context
//     n (the time against b and the total context Σn), the sequences
//     prefilled untimed beforehand and a warm-up step run at each batch
//     shape;
//   - mixed steps: one prompt chunk of l tokens (16 to 384, within one
//     llama.cpp ubatch) and b decoding sequences (2 to 16) at context n
//     (32 and 512) in one step (engine.RunStep), the interference
//     colocated serving sees; l, b and n vary apart, for the fit's
//     mixed-step interaction terms;
//   - the KV bytes per token: a sequence's KV exported layer by layer
//     (engine.ExportKV) over its tokens.
//
// Each point is the median of Settings.Repeats timed steps. The grid grows
// in levels (level k: up to 32·2ᵏ tokens, batches up to 2·2ᵏ); level 0
// always runs, and before each later level the profile fitted so far
// predicts its time: the points that do not fit the budget left are left
// out (named in the profile's grid record), and a level still running at
// the deadline stops there. Limits: --max-tokens, --max-batch, the
// engine's sequence length and, for llama.cpp, its KV cells and sequence
// slots.
//
// # Fit and file
//
// Build fits perfmodel's DistServe form by perfmodel.FitDistServe (least
// squares on relative error, non-negative coefficients, a mixed-step
// interaction fitted on the mixed points, a cross-prompt prefill term,
// one decode regime or two where an F test finds them) and writes every
// point's rel_err ((model − measured) / measured), the total error, the
// engine and the hardware (CPU model and
// threads, logical CPUs, memory; an NVIDIA GPU when llama.cpp's library
// directory holds a CUDA backend). A CPU run gives a profile of device
// "cpu" named cpu/MODEL/tN for N threads: the planner counts its workers'
// threads as cores where it counts a GPU profile's GPUs. A sim engine run
// keeps the modeled GPU's device, hardware and memory and divides the
// times by --time-scale. Refit (`coordinator profile --refit FILE`) fits
// a written profile's points again, so that a profile measured by an
// earlier version gains this one's terms without measuring.
//
// Measuring reads the wall clock; everything else is deterministic. Not
// safe for concurrent use with other work on the same engine.
package profiler
