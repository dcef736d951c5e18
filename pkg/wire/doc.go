// Package wire converts between the Go types of the system (pkg/engine,
// pkg/wire/vocab) and the pdserve.v1 protobuf messages that carry them
// between the coordinator and the workers: sampling settings and
// log-probabilities; stamps and finish reasons (vocab.Stamp and the
// vocab.Finish… names to the StampKind and FinishReason enums, and back;
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
//   - PrefillResponse (prefill worker → coordinator): queued (the queue
//     time, for the budget); first_token (the token sampled after the
//     prompt, its prefill span, batch and PrefixHit: under the "prefill"
//     first-token policy the client's position 0 comes from here, before
//     the KV has moved, so that the transfer lands in the first
//     inter-token gap); kv_done (the transfer's bytes, codec and its
//     first byte and end on the decode worker's clock, from its
//     PushResponse: the decode worker holds the whole KV, and the stream
//     ends).
//   - PushRequest (prefill → decode worker): a header bounding the frames,
//     the frames, and a KVCommit with the first token, which the decode
//     worker needs as its sequence's first input whichever policy holds.
//   - GenerateResponse (decode worker → coordinator): tokens per choice,
//     the finish, stamps (kv_first_byte and kv_done when KV came remote,
//     the worker's own record, which the coordinator does not read:
//     PrefillResponse.kv_done is its one report of the KV's arrival;
//     prefill_start/end and a PrefixHit when it prefilled locally,
//     decode_joined, first_token, last_token). With
//     first_token_from_prefill its choice 0 starts at position 1
//     (first_token_omitted); otherwise position 0 is the KV commit's
//     token, streamed again.
//
// So today the first token has up to three carriers (FirstToken, the
// KVCommit, position 0 of the decode stream), which the coordinator's
// flow reconciles (pkg/coordinator/doc.go says how); the KV's
// completion reaches the flow once, from PrefillResponse.kv_done. Each carrier exists for a reason
// above: FirstToken because it precedes the transfer, the commit because
// the decode worker decodes from the token, the decode stream for local
// prefill and recoveries, where no prefill stream exists.
package wire
