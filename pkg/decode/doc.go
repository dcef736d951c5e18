// Package decode is the decode worker (and, with local prefill, the
// colocated worker): it serves pdserve.v1.DecodeService and the KV transfer
// receiver on one gRPC server, reserves KV blocks in a kv.Pool, imports the
// KV a prefill worker streams into the engine as it arrives, and runs a
// continuous-batching scheduler that decodes every running sequence each
// step and mixes local prefill chunks into the same steps under a token
// budget (Sarathi-style).
//
// # Request life
//
//  1. Reserve(request_id, tokens) takes BlocksFor(tokens) blocks from the
//     pool (RESOURCE_EXHAUSTED when they are not free). A reservation that
//     no Generate claims within Options.ReserveTTL is released, unless KV
//     is arriving for it at that moment (then it gets another TTL: a slow,
//     paced or big transfer is not a dead peer).
//  2. The prefill worker opens a KV transfer for the id; Begin checks the
//     reservation (FAILED_PRECONDITION without one, RESOURCE_EXHAUSTED when
//     the header needs more tokens than reserved). Every frame is imported
//     into the engine (engine.ImportKV) as it arrives, between scheduler
//     steps. The commit carries the first token the prefill worker sampled.
//  3. Generate claims the reservation (or reserves prompt + max_tokens
//     itself when none exists). With remote KV the sequence joins the batch
//     once the transfer committed; with local_prefill it joins at once and
//     its prompt is prefilled in chunks inside decode steps. A claimed
//     request waits for its KV as long as the call lasts, with no timeout
//     of its own: the prompt may sit in a prefill worker's queue for as
//     long as the coordinator lets it, and the coordinator ends the call
//     (cancelling it) when the request ends or its prefill fails.
//  4. The sequence leaves the batch at max_tokens ("length"), at EOS unless
//     ignore_eos, or at a stop token ("stop"); its engine sequence and blocks
//     are freed. Cancel, cancelling the Generate call, a failed transfer or
//     the worker stopping free them too.
//
// # The token stream and the first token
//
// The tokens of all GenerateResponse events of a call, concatenated, are the
// request's output sequence from its first token on: the decode worker
// always streams the first token itself, as the first token of its first
// event, also when the prefill worker sampled it (remote prefill) and
// already reported it in its FirstToken event. Under the coordinator's
// first-token policy "prefill" the coordinator has sent that token to the
// client already and drops the first token of this stream; under policy
// "decode" it forwards it. The token that ends a sequence with "stop" (EOS
// or a stop token) is included as the last token; a client-facing renderer
// strips it. A recovery call (generated_tokens set) streams only tokens
// after generated_tokens.
//
// Events carry stamps (Unix nanoseconds, worker clock): "kv_first_byte" and
// "kv_done" (remote KV), "prefill_start" and "prefill_end" (local prefill),
// "decode_joined", "first_token" (the first token this call streams) and
// "last_token" (on the final event), and batch_size, the number of sequences
// in the step that produced the event's last token.
//
// # Concurrency
//
// The scheduler goroutine (Run) owns the engine; engMu guards it so that KV
// imports of transfer streams run between steps. mu guards the request
// state. Lock order: engMu before mu. Server methods are safe for concurrent
// use.
package decode
