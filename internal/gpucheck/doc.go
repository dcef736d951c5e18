// Package gpucheck drives the measuring half of scripts/gpu-check.sh
// (docs/gpu.md): given a coordinator binary, a GGUF model and a directory
// of llama.cpp's libraries, it serves the model standalone
// (`coordinator --standalone --engine llamacpp`) disaggregated and then
// colocated, and measures over loopback HTTP:
//
//   - TTFT of one greedy request per prompt length, on the client and in
//     the request's own `pdserve` budget, with the KV bytes (raw, on the
//     wire) and transfer time that budget reports;
//   - decode tokens/s at each batch size, B concurrent greedy requests of
//     a short prompt and a fixed output length (ignore_eos);
//   - whether the greedy text of each TTFT request is the same in both
//     modes;
//
// then runs `coordinator profile --engine llamacpp` for a short budget.
// It writes one JSON report (Report) and the profile into the output
// directory.
//
// Everything runs against a deadline: a step that would not finish before
// it is skipped and named in the report, so the whole check ends in time.
// The report holds what was measured, never an estimate. The device the
// script runs on has no Go toolchain: cmd/gpucheck is built static into
// the bundle of `make gpu-bundle`.
package gpucheck
