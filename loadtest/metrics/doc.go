// Package metrics turns per-request outcomes into a benchmark summary with
// vLLM's definitions (vllm bench serve):
//
//   - TTFT: send → first token-carrying event (reasoning or answer).
//   - TTFO: send → first answer token; reported when a stream carried
//     reasoning tokens.
//   - TPOT per request: (E2EL − TTFT) / (output tokens − 1), only for
//     requests with more than one output token; for goodput a request with
//     one token has TPOT 0.
//   - ITL: every gap between consecutive token-carrying events, over all
//     requests.
//   - E2EL: send → last token-carrying event.
//   - Goodput: completed requests that meet every SLO given (a metric ≤ its
//     SLO), per second of benchmark duration. SLO attainment: those good
//     requests over all requests sent (failures count against it).
//
// Statistics are in milliseconds: mean, median, population standard
// deviation and percentiles by linear interpolation (numpy's default), 0
// for an empty set (as vLLM). Only completed requests enter them. The
// server-side budget ("pdserve" objects) is aggregated alongside. The
// functions are pure and safe for concurrent use.
package metrics
