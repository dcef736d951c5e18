// Package decode is the decode worker (and, with local prefill, the
// colocated worker): it serves pdserve.v1.DecodeService and the KV transfer
// receiver on one gRPC server, reserves KV blocks in a kv.Pool, imports the
// KV a prefill worker streams into the engine as it arrives, and runs a
// continuous batch (pkg/decode/batch) that decodes every running sequence
// each step and mixes local prefill chunks into the same steps under a
// token budget (Sarathi-style).
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
//     the header needs more tokens than reserved, INVALID_ARGUMENT when its
//     layers or bytes per token are not the engine's). Every frame is
//     copied into a staging buffer of the request as it arrives, without
//     waiting for the batch (the receiver never waits for a step,
//     as a GPU's KV arrives by DMA while it computes); the buffer is bounded
//     by the header, itself bounded by the reservation. The commit carries
//     the first token the prefill worker sampled; once every frame is
//     staged the worker acknowledges the transfer: the ack means "received
//     and held here", after which the prefill worker may drop its copy (it
//     keeps it anyway, for Resend, until the coordinator's Release). The
//     batch imports the staged KV into the engine (engine.ImportKV,
//     frame by frame) at the step boundary right before the sequence joins
//     the batch, and frees the staging. An import that fails after the ack
//     ends the Generate call with INTERNAL, like a failed step; the
//     coordinator recovers the request as after any decode failure.
//  3. Generate claims the reservation (or reserves prompt + max_tokens
//     itself when none exists). A reservation shown the prompt
//     (ReserveRequest.prompt) keeps it and says so (prompt_held): the
//     Generate call may then omit prompt_tokens, and one that carries them
//     must carry that prompt (INVALID_ARGUMENT otherwise). With remote KV the sequence joins the batch
//     once the transfer committed; with local_prefill it joins at once and
//     its prompt is prefilled in chunks inside decode steps. A claimed
//     request waits for its KV as long as the call lasts, with no timeout
//     of its own: the prompt may sit in a prefill worker's queue for as
//     long as the coordinator lets it, and the coordinator ends the call
//     (cancelling it) when the request ends or its prefill fails.
//  4. The sequence leaves the batch at max_tokens ("length"), at an
//     end-of-generation token unless ignore_eos (the engine tokenizer's
//     engine.EOGTokens: EOS, and EOT, <|im_end|>… where the model has
//     them), or at a stop token ("stop"); its engine sequence and blocks
//     are freed. Cancel, cancelling the Generate call, a failed transfer or
//     the worker stopping free them too.
//
// # A caller that does not read
//
// The batch never blocks on a Generate call: each call's output waits
// in its outbox until the call's handler sends it. A caller that stops
// reading (its stream window full) would make that output grow without
// bound, so two limits end such a request: its waiting output may not
// exceed Options.MaxOutboxBytes (--max-outbox-bytes, 16 MiB; ended with
// RESOURCE_EXHAUSTED), and one send may not block for longer than
// Options.StreamWriteTimeout (--stream-write-timeout, 30 s; ended with
// DEADLINE_EXCEEDED). Either frees the request's KV blocks, engine
// sequences and waiting output at once, logs "caller stopped reading:
// request cancelled" at warn and counts
// pdserve_decode_stream_stalled_cancels_total{reason="outbox" or
// "write_timeout"}. The send that blocked holds its one message until the
// caller reads or goes away.
//
// # Prefix cache
//
// Options.PrefixCache is on by default (--prefix-cache-tokens -1, auto:
// the whole KV pool, since cached blocks yield to requests; 0 turns it
// off, a positive value caps it). A finished (or
// cancelled) request's sequence is kept as a pkg/prefixcache entry holding its
// prompt's full blocks (forked out when the sequence holds more). A local
// prefill forks the longest cached prefix (not for prompt logprobs) and
// computes the rest. For remote KV, a Reserve carrying the prompt pins the
// longest cached prefix and answers its tokens (prefix_hit_tokens); the
// transfer may then start at that token (StreamHeader.Start) or at 0
// (Resend); any other start is FAILED_PRECONDITION. The import forks the
// pinned prefix, then imports the frames, and releases the pin; Generate
// must carry the reserved prompt (INVALID_ARGUMENT otherwise). Pins are
// the only references: forks are independent of their source, so evicting
// an entry never touches a sequence in use.
//
// A local prefill whose Generate call names a peer (GenerateRequest.peer:
// a worker holding more of the prompt's prefix, in any tier) pulls that
// prefix from it (kvtransfer's Pull, with the dialer of WithDialer) after
// the call claimed its reservation and before the sequence is ready to
// join the batch, under no lock of the worker, when it saves time as
// kvtransfer.PullPricer prices it (Options.PeerLinkGbps until the link
// to that peer was measured, against the worker's prefill throughput
// measured over its local-prefill steps); the pull is given up at the
// time computing would take. The sequence then starts from the pulled
// prefix when it is longer than any tier here holds (LoadPulled), and
// the first event reports it (hit.peer_tokens, hit.peer_load_nanos). A failed
// pull is logged and counted (PeerStats) and the prompt computed, with the
// same tokens.
//
// Pulled KV is tagged with its peer and spot-checked as a prefill
// worker's is (the one pkg/peerpull; --peer-pull-verify-blocks, default
// 1: the pulled chain's last block recomputed here from the blocks
// before it, under the batch's engine lock). A pull that does not match
// is dropped and the prompt computed; its peer is no longer pulled from,
// and the entries cached from it before are dropped (PeerStats.Purged,
// pdserve_decode_peers_untrusted). A verified pull's sequence becomes a
// cache entry tagged with the peer, like a fork or load of such an
// entry; an unchecked one (--peer-pull-verify-blocks 0) serves its own
// request only: never cached, so never exported nor advertised in KV
// events. The same holds for remote KV whose push says it was pulled by
// its sender unverified (KVCommit.provenance PULLED_UNVERIFIED).
//
// Cached KV shares the pool with requests, as vLLM's free block queue
// does: an entry is charged its blocks while it is cached, and a Reserve
// (or a Generate growing its reservation) that finds too few free blocks
// reclaims unpinned entries, least recently used first, before it fails
// with RESOURCE_EXHAUSTED. KVBlocksFree in heartbeats and ReserveResponse
// counts the unpinned entries' blocks as free. The reclaimed engine
// sequences are freed by the batch before anything joins at its next
// step boundary.
//
// # The token stream and the first token
//
// The tokens of all GenerateResponse events of a call, concatenated, are
// the request's output sequence from a fixed position on. With remote KV
// the first token (position 0) is the KV commit's, sampled by the prefill
// worker, whose FirstToken carries it to the coordinator: the worker
// continues the sequence from it but never streams it, so choice 0's
// tokens start at position 1 (its finish still comes, also when the
// first token ends the choice; choices 1..n-1 sample their own first
// token and stream it). With local_prefill the worker samples the first
// token and streams it. A recovery call (generated_tokens set) streams
// only tokens after generated_tokens. The deprecated
// first_token_from_prefill is not read (package wire says why it is
// still sent). The token that ends a sequence with "stop" (an
// end-of-generation or stop token) is included as the last token; a
// client-facing renderer strips it.
//
// Events carry stamps (Unix nanoseconds, worker clock; their kinds are
// the StampKind enum, vocab.Stamp in Go): KV_FIRST_BYTE and KV_DONE
// (remote KV: the first frame arrived, the last frame was staged; the
// worker's own record: the coordinator reads the same instants from the
// push's ack, which the prefill worker relays as kv_done),
// PREFILL_START and PREFILL_END (local prefill), DECODE_JOINED,
// FIRST_TOKEN (the first token this call streams) and LAST_TOKEN (on the
// final event); a finish (the FinishReason enum, and its string in the
// deprecated finish_reason for a coordinator that predates it); and
// batch_size, the number of sequences in the step that produced the
// event's last token.
//
// # Live migration
//
// A running sequence moves to another decode worker with its KV
// (migrate.go): Migrate(id), or MigrateAll as the worker drains (it is
// marked draining and every request the batch runs is exported at the
// same step boundary, batch.Export). The batch snapshots the sequence's
// KV (prompt and output but the last token) and output tokens and ends
// it; the worker holds the snapshot (not its pool blocks) and ends the
// Generate call after its last token with an event saying migrated. The
// coordinator then calls Generate on another worker with local_prefill,
// generated_tokens (the tokens the client has) and migrate_from naming
// this worker: that worker pulls the KV (KVTransferService/PullSequence,
// the call's codec) before the sequence joins its batch, and goes on
// from the next token at the same position, so a seeded draw, the
// penalties (counted over generated_tokens) and the grammar state
// (advanced over them) are those of an unmigrated run. A pull that fails
// (the source gone, a KV of another length) is logged and the worker
// computes the KV instead, as a recovery does. A pull's KV for a request
// that ended meanwhile is dropped. The source drops its snapshot once a
// pull sent it whole, on a Cancel of the request, after
// Options.ReserveTTL, or when it stops; WaitIdle waits for those too.
//
// # Concurrency
//
// The worker is a service and a batch (ollama's runner; etcd raft's
// Ready/Advance). The batch (pkg/decode/batch) is continuous batching
// over the engine, run by one goroutine (Run): it owns every sequence
// (engine sequences, choices, pending prompt, grammar states, progress),
// the prefix cache's engine sequences and the engine's memory, and takes
// no lock. It imports engine, prefixcache, grammar and runner, never grpc
// or api: the service maps its Go types to the wire.
//
// The service (Reserve, Generate, Cancel, the per-caller caps and the
// reservation timers, server.go) holds the reservations, calls and
// outboxes under its one lock, Server.mu. The KV receiver (receiver.go)
// holds the transfers under its one lock, Server.rx.mu. Neither is held
// across a call into the other party: the service hands the receiver
// what a transfer may be (rxState.expect, the claim) after releasing mu,
// and a request's end (rxState.drop) as it releases it (Server.unlock);
// the receiver ends a request in the service (Server.end) after
// releasing rx.mu. Neither touches a sequence of the batch: they talk to
// it by messages (batch.Join when a Generate call claimed its request
// and no peer pull is under way, batch.Arrived when a claimed request's
// KV was received whole, batch.Cancel when a request ends in the
// service, batch.Reclaimed with the engine sequences of reclaimed or
// purged prefix cache entries), posted to its mailbox and taken at each
// step boundary. A request handed to the batch ends only there: a Cancel
// is a message, and the batch reports every end (batch.End, to
// Server.ended, which takes mu from the loop holding no lock of its
// own). Tokens, stamps and prompt logprobs go from the batch to each
// call's outbox, which the call's handler drains.
//
// The other locks are leaves of one object each, never held across a
// call out of it: the batch's mailbox, an outbox, a transfer's staging
// buffer (frames are staged under it, not under rx.mu), the prefix
// cache and the KV pool. So no lock order is left to keep.
//
// Server methods are safe for concurrent use.
package decode
