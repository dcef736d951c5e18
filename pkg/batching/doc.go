// Package batching holds what the two workers' batch loops share, defined
// once (the loop itself is pkg/runner):
//
//   - the step budget and its flags: --chunk-tokens (the most prompt
//     tokens one sequence contributes to one step: chunked prefill, on the
//     prefill worker and for local prefills on decode workers) and
//     --max-batch-tokens (the tokens of one step, summed over the batch).
//     Each worker adds the bound its loop needs between them and its own
//     settings (see prefill.Options and decode.Options);
//   - Signals, between a worker's request handlers and its loop: the
//     wake-up, the draining flag and WaitIdle. It owns no lock: the
//     draining flag is read under the worker's mutex together with the
//     rest of the worker's state;
//   - StepMetrics, the loop's step time and batch size histograms
//     (pdserve_<role>_step_seconds, pdserve_<role>_step_batch_size), and
//     Register, which registers a worker's collectors with one error
//     wrapping;
//   - StepHistory, the recent step times and last batch size a worker's
//     Stats report (guarded, like Signals' flag, by the worker's mutex).
//   - Order, Next and Started: the priority order in which both batches
//     start waiting requests (FCFS, but an interactive request goes ahead
//     of older batch ones, at most DefaultOvertakes times in a row).
package batching
