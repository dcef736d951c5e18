// Package perfmodel predicts how long one engine step takes on a named GPU
// running a named model, and how much KV such a worker holds. It is the
// performance model shared by the performance-model engine (engine/sim) and
// the planner.
//
// A Profile names a GPU, a model shape and a tensor-parallel degree
// ("a100-80g/opt-13b/tp1") and carries one of two step-time forms:
//
//   - FormDistServe, the fitted form published by DistServe (OSDI'24):
//     prefill a + b·Σlᵢ + c·Σlᵢ² and decode a + b·Σnᵢ + c·B, with
//     small- and large-batch decode coefficients;
//   - FormRoofline, a roofline over the GPU's bf16 FLOP/s and HBM bandwidth
//     with efficiency factors calibrated against published measurements,
//     covering weight reads, GEMM compute, attention (quadratic in the
//     prompt for prefill, linear in the context for decode), tensor-parallel
//     all-reduces and per-step overheads.
//
// Both forms cost a mixed batch (prefill chunks and decode tokens in one
// colocated step, see Batch) as one step, so the interference between
// prefill and decode in colocated serving follows from the model; a
// measured DistServe profile adds the interaction its mixed points show
// (DistServe.Mixed).
//
// Profiles are JSON files embedded in the binary (profiles/GPU/MODEL/tpN.json)
// and can also be read from a user's file. Every file records its source and
// the data points it is calibrated or validated against;
// WriteCalibrationReport prints model against source for all of them.
//
// Measured profiles, written by `coordinator profile` (package profiler),
// carry the DistServe form fitted to the measured step times by
// FitDistServe (least squares on relative error, non-negative
// coefficients), every point's rel_err, the total error and the machine
// (Measurement), the KV bytes per token the engine exported (KVBytes) and
// the engine's KV pool (Memory.MaxKVTokens). A profile of device "cpu"
// (HW/MODEL/tN) describes workers of N threads: Units counts a worker's
// threads where a GPU profile counts its TP GPUs, and the planner's budget
// and cost count those units. Marshal and WriteFile write a profile that
// Parse (and so Resolve) reads back equal.
//
// The package is pure and deterministic: it never reads the clock, and
// durations are outputs. Profiles are immutable after loading and safe for
// concurrent use.
package perfmodel
