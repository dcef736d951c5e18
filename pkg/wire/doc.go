// Package wire converts between the Go types of the system (pkg/engine,
// pkg/wire/vocab) and the pdserve.v1 protobuf messages that carry them
// between the coordinator and the workers: sampling settings and
// log-probabilities; stamps and finish reasons (vocab.Stamp and the
// vocab.Finish… names to the StampKind and FinishReason enums, and back;
// vocab.Priority to the Priority enum, and back, refusing an unknown one;
// Finish also reads the finish_reason string of a decode worker that
// predates the enum); and it reads and writes the status details of the
// API's errors: the mark of a failed KV transfer (KVTransferFailedStatus,
// IsKVTransferFailed) and of a grammar that allows no token
// (GrammarRefusedStatus, IsGrammarRefused).
// It holds no state; every function is safe for concurrent use.
//
// # One vocabulary
//
// A word or bound that crosses processes is written once: in an enum of
// api/pdserve/v1 (StampKind, FinishReason) or a message used by every
// carrier (PrefixHit, which FirstToken and GenerateResponse both carry),
// and in Go in pkg/wire/vocab, which imports nothing so that the batches
// and the coordinator's flow (which speak no protobuf) may use it:
// stamps, finish reasons, serving modes, first-token policies, the
// longest request id (a KV frame's one-byte length) and the default block
// size of the prefix hashes. internal/vocabcheck fails on a copy.
//
// # What each message carries, and why
//
// Each party gets the first token (the token sampled after the prompt)
// from one carrier, which the serving mode decides; nothing is
// reconciled at run time.
//
//   - PrefillResponse (prefill worker → coordinator): queued (the queue
//     time, for the budget); first_token (the first token, its
//     log-probability, prefill span, batch and PrefixHit): with remote
//     prefill the one carrier of the client's position 0, because it
//     comes before the KV has moved (under the "prefill" first-token
//     policy it goes out at once, so that the transfer lands in the
//     first inter-token gap; under "decode" the coordinator holds it
//     until the decode stream's first tokens); kv_done (the transfer's
//     bytes, codec and reason, and its first byte and end on the decode
//     worker's clock, from its PushResponse): the one report of the KV's
//     arrival that the coordinator reads, for the budget's kv_transfer
//     term and the request log (ResendResponse.kv_done for a re-send).
//   - PushRequest (prefill → decode worker): a header bounding the frames,
//     the frames, and a KVCommit with the first token and its
//     log-probability: the decode worker's one carrier of it, which it
//     needs as its sequence's first input.
//   - GenerateResponse (decode worker → coordinator): tokens per choice
//     from a fixed position, the finish, stamps (prefill_start/end and a
//     PrefixHit when it prefilled locally, decode_joined, first_token,
//     last_token; kv_first_byte and kv_done are its own record of
//     received KV, which the coordinator does not read). With remote KV
//     choice 0's tokens start at position 1, always: the worker never
//     streams the commit's token, which the client has from FirstToken.
//     With local prefill (colocated, a short prompt, prompt
//     log-probabilities) there is no prefill stream, and the decode
//     stream carries position 0. A recovery streams after the tokens the
//     client has (generated_tokens; with remote KV and none, from
//     position 1 as above).
//
// GenerateRequest.first_token_from_prefill is deprecated: no worker
// reads it, and the coordinator still sets it with remote KV so that a
// decode worker of the previous release (which streamed position 0
// unless asked) behaves the same while the coordinator is rolled out
// first; GenerateResponse.first_token_omitted, that release's mark, is
// reserved.
package wire
