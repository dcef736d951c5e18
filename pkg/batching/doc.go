// Package batching holds the step budget the two workers' batch loops
// share, and its flags, defined once: --chunk-tokens (the most prompt
// tokens one sequence contributes to one step: chunked prefill, on the
// prefill worker and for local prefills on decode workers) and
// --max-batch-tokens (the tokens of one step, summed over the batch).
// Each worker adds the bound its loop needs between them and its own
// settings (see prefill.Options and decode.Options).
package batching
