// Package budget records where the time of one request goes: a timestamp at
// every boundary of its path through pdserve, and the latency terms derived
// from them. A Trace is filled while the request runs; Terms, Summary and
// Fields turn it into the `pdserve` object returned to the client, the one
// zap request log line, and (through pkg/metrics) Prometheus observations.
//
// # Boundaries
//
// Arrival (request parsed by the coordinator), Routed (workers chosen and
// KV reserved), PrefillQueued, PrefillStart, PrefillEnd (on the worker that
// prefilled), KVFirstByte and KVDone (on the decode worker receiving KV),
// DecodeJoined (the sequence joined the decode batch), FirstToken and
// LastToken (handed to the client connection by the coordinator), and
// FirstOutput (the first output handed to the client that is not
// reasoning: answer text or a tool call; chat replies of reasoning models
// start with <think>…</think>, which pkg/frontend sends as
// reasoning_content).
//
// Worker timestamps come from the workers' clocks, not the coordinator's.
// On one host (tests, standalone mode) they agree; across hosts the terms
// mixing both clocks (queue, prefill, kv_transfer) are only as good as the
// clock synchronisation (NTP: usually well under a millisecond). A term
// whose boundaries are missing is 0; a term that comes out negative through
// clock skew is clamped to 0.
//
// # Terms
//
//	ttft        = FirstToken − Arrival
//	ttfo        = FirstOutput − Arrival    (time to first output token, AIPerf's TTFO; ttft without reasoning)
//	e2e         = LastToken − Arrival; Ended − Arrival for a reply that
//	              delivered no token (its first token was its end: no ttft)
//	tpot        = (e2e − ttft) / (output_tokens − 1), 0 for one output token (vLLM's definition)
//	queue       = PrefillStart − Arrival   (admission, routing and the prefill queue)
//	prefill     = PrefillEnd − PrefillStart
//	kv_transfer = KVDone − PrefillEnd      (the part of the transfer not hidden behind prefill compute)
//	kv_stream   = KVDone − KVFirstByte     (the whole transfer, overlapped or not)
//	decode      = LastToken − FirstToken
//	host_load   = the worker's own measure of loading the prompt's prefix
//	              from its prefix cache's host-memory tier (a term of ttft
//	              with no boundary of its own: inside prefill on the
//	              performance-model engine, which waits out the modeled
//	              PCIe time in its next step, inside queue on the others);
//	              absent without a host-tier hit
//
//	client_rtt  = the client's round trip to the coordinator, measured
//	              on its TCP connection (Linux TCP_INFO); outside ttft,
//	              which the coordinator's clock bounds: the client sees
//	              about ttft + client_rtt. Absent where not measurable.
//
// The TTFT budget of a request (Objective.TTFTBudget) covers what the
// client sees: BudgetLeft is what remains of it for the terms still
// ahead, the budget less client_rtt and the time since Arrival. Placing
// a request in another region spends that remainder less the round trip
// to the region (package region).
//
// prefix_hit_tokens counts the prompt tokens the prefilling worker did not
// compute; host_prefix_hit_tokens the part of them loaded from its host
// tier (the rest were in engine memory).
//
// With first-token policy "prefill" the first token leaves before the KV
// transfer ends, so kv_transfer lands in the first inter-token gap; with
// "decode" it is part of ttft. Every report names the policy.
//
// # Cost
//
// With a Pricing set on the Trace (the coordinator sets the policy's),
// Summary and Fields carry cost_usd, cost_usd_per_1k_tokens and, under
// GPU-time pricing, gpu_seconds: the request's share of the prefill step
// (prefill span / prefill batch) and of the decode steps (decode span /
// decode batch size), each × the GPUs of the worker; see Trace.Cost.
// Without a Pricing no cost is reported: there is no default price.
//
// # Warnings
//
// Warnings (Trace.Warn) are carried verbatim to the `pdserve` object and
// the log line, e.g. that the sim engine fell behind its performance
// model, so the times of the request are not those of the modeled GPU.
//
// A Trace is not safe for concurrent use: one goroutine (the request's)
// owns it.
package budget
