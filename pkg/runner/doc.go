// Package runner is a worker's batch loop, apart from its gRPC service and
// its KV transfers (ollama's runner, with the policy as an input). A
// Runner owns the engine while it runs: it repeats plan → step → hand out
// until stopped, and the Policy it is given decides everything about
// requests: which join the batch at each step boundary (admission, the
// import of KV that arrived meanwhile), in what order, and how many tokens
// of each prompt (chunked prefill), then what each step's outputs mean.
//
// The two workers' policies:
//
//   - the prefill worker's FCFS prefill: requests in arrival order, each a
//     chunk of its prompt, a request starting only when the engine and the
//     retention bound hold its KV (pkg/prefill);
//   - the decode worker's continuous batching: every running sequence
//     decodes one token a step, local prefills take chunks of what is
//     left, and sequences whose KV arrived join at the next step boundary,
//     imported then (pkg/decode).
//
// The Runner defines once what the two loops shared: Run called once, the
// loop ending at Stop or when its context ends, the wait for a wake-up
// (batching.Signals) when nothing is planned, the engine lock held for a
// whole step, the step's timing (its metrics and the StepHistory of
// Stats), the engine call, the check of the engine's output counts, and
// the Policy's Shutdown once the loop ends.
package runner
