// Package adversarial holds no code, only tests: the abuse a client or a
// peer can try against a whole pdserve deployment (a standalone server
// with API keys, its decode worker over gRPC), each written as a Go test
// that asserts the outcome and, where memory is the target, a bound on
// the heap. They keep the findings of the "Trust II" review fixed:
//
//   - token-id bodies and prompt batches bounded before they are decoded,
//     four concurrent 16 MiB bodies within the documented bound;
//   - max_tokens of 2⁶³−1 refused naming it, nothing taken from a key's
//     tokens a minute;
//   - trickled bodies cut at the body deadline, their slots given back;
//   - a client that stops reading a stream, and a gRPC caller that stops
//     reading Generate, cancelled with everything freed and counted;
//   - every refusal (HTTP and gRPC) and request line logged, none sampled;
//   - the response cache partitioned by API key; n over the workers'
//     batch refused naming n; a request over a key's whole TPM refused
//     without Retry-After; an emptied key file revoking every key and a
//     deleted one keeping the last good keys, counted.
//
// And those of "Trust III" on the control plane (control_test.go): a
// 34-byte KV snapshot part announcing 2^24 parts refused without
// allocating; heartbeats and KV events under forged ids (a role's shared
// credential) bounded by the ids awaiting admission and never indexed; a
// worker flooding its KV subject not costing another worker an event;
// a heartbeat naming an address outside --worker-networks refused, never
// dialed. And on KV provenance (decodepull_test.go): a fake peer's
// random KV pulled by a decode worker caught by its spot check, nothing
// of it cached; a push its sender marks pulled-unverified not cached.
//
// The heap is sampled with runtime/metrics every millisecond; the bounds
// are generous (several times what the code needs) yet an order of
// magnitude under what the unfixed code took.
package adversarial
