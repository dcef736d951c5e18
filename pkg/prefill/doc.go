// Package prefill is the prefill worker: it serves pdserve.v1.PrefillService,
// runs a first-come-first-served batch (pkg/prefill/batch) that packs
// queued prompts into chunked prefill steps under a token budget, and streams each request's KV
// to the decode worker that reserved blocks for it while the prompt is still
// being computed.
//
// # Request life
//
// Prefill validates the request, puts it at the tail of a bounded queue
// and sends a PrefillQueued event. The queue is full, and Prefill fails at
// once with RESOURCE_EXHAUSTED (the coordinator's 429), when
// Options.MaxLivePrefills requests are live or when the prompt's KV would take
// the live requests' KV beyond Options.MaxLiveKVBytes (see Retention): a
// request is refused up front rather than left to wait in a queue that
// cannot drain in time. Every step of the batch takes requests in the order
// of their priority (PrefillRequest.priority: arrival order, but an
// interactive request goes ahead of older batch ones, at most
// batching.DefaultOvertakes times in a row) and gives each at most Options.ChunkTokens of its remaining prompt until
// Options.MaxBatchTokens tokens are used; the engine runs the step as one
// batch. The engine hands out every layer's KV of every chunk through its
// KVFunc; the batch hands it to the request, which copies it once into the request's KV buffer and
// queues a reference to it for the request's sender goroutine, which encodes
// and sends it over a kvtransfer stream. The engine therefore never waits on
// the network: the queue holds only (layer, token range) references into the
// buffer, whose bytes are bounded by the prompt's KV and must be kept anyway
// for Resend. After the last chunk the handler sends FirstToken, the sender
// commits the transfer with that token, and the handler sends KVDone once the
// decode worker acknowledged it; then the stream ends.
//
// # Retention
//
// A request's KV stays in memory after its stream ended until Release, so
// that Resend can send it to another decode worker when the first one failed.
// Options.RetainBytes bounds the KV held for requests being prefilled, being
// sent and retained; finished requests are evicted least recently used first
// to make room, and a new request waits in the queue while the in-flight ones
// fill the bound (one request alone is always admitted, even if its KV exceeds
// the bound). KV of a request whose transfer failed after its prefill
// completed is retained too, so it can be re-sent. KV sizes are those the
// engine hands out: learnt from its chunks, and before the first one the
// engine's KVTokenBytes() when it has that method (an engine shipping a
// scaled-down payload), else the model's.
//
// # Prefix cache
//
// Options.PrefixCache is on by default (--prefix-cache-tokens -1, auto:
// sized by the engine's KV memory, i.e. llama.cpp's context cells and
// sequence slots, the sim profile's GPU memory beside the weights, or for
// the ref engine --retain-bytes of the model's KV; 0 turns it off, a
// positive value caps it). A prompt's engine sequence is kept as a
// pkg/prefixcache entry when its last chunk ran, instead of freed. The
// cache lives in the memory live sequences do not use. Engine memory is
// one decision, taken when a request starts: it starts only when its
// whole footprint (its prompt, which a fork, a host- or disk-tier load or
// a peer pull fills in part) fits beside the live requests' prompts and
// the pinned cache entries (the fork's source, which stays beside the
// fork while it is copied, and entries a peer's export holds); then the
// least recently used unpinned entries are evicted until the live
// sequences, the new prompt and the cache fit the engine's memory and a
// sequence slot is free. A fork whose source does not fit waits for the
// live requests, or, with none live, is not made (the prompt is
// computed). A new request whose prompt shares k full blocks
// (16 tokens) with an entry starts with a Fork of those k × 16 tokens (at
// most all but one prompt token) and prefills only the rest; the forked
// prefix's KV is exported into the request's KV buffer first, so the
// buffer, Resend and the stream hold the whole prompt's KV, bit-exact with
// an uncached prefill. FirstToken.hit.tokens reports k × 16.
// PrefillRequest.skip_tokens (the decode worker's own hit) makes the
// stream start at that token (StreamHeader.Start): earlier frames are not
// sent, a frame across it is cut. Forks are independent of their source,
// so evicting an entry never touches a request's sequence; an entry is
// pinned between its lookup and its fork, inside one call of the batch, or
// by a peer's export, which pins it under the engine lock.
//
// # Adaptive codec
//
// A request (or the worker's --codec default) may name CodecAuto ("auto")
// or CodecAutoLossy ("auto-lossy") instead of a codec: then, when the
// transfer opens (at its first frame), the worker picks the codec that
// delivers the request's KV soonest with pkg/kvtransfer/codecpick, from
//   - its own encode speed per core and each codec's ratio, from a codec
//     self-benchmark (codec.SelfBench on the engine's KV dtype; at New
//     when the default is auto, else at the first auto transfer);
//   - the link throughput its transfers to that decode address achieved
//     (kvtransfer.LinkStats: wire bytes over the time spent waiting for
//     the network, i.e. from the first frame to the ack less the waits
//     for the engine and the encoding; none measured yet: codecpick's
//     default link);
//   - the receiver's decode speed per core and its cores (SetReceivers;
//     workerrun feeds it from the decode workers' heartbeats).
//
// A transfer codes on one goroutine at each end, so it gets one core at
// most, less when more transfers than cores are being sent from here or
// to one receiver. auto chooses among the lossless codecs; auto-lossy
// also among fp8 and int8, for a policy that accepts their error. KVDone
// carries the codec chosen and the reason (codec_reason), and so does the
// worker's "kv sent" log line (debug level).
//
// # Transfer failures
//
// When the KV transfer to the decode worker fails, the Prefill (or Resend)
// call ends with a status marked with an errdetails.ErrorInfo
// (wire.IsKVTransferFailed), so that the coordinator can tell a decode-side
// failure, which it recovers from on another decode worker, from a failure
// of this worker.
//
// # Cancellation
//
// Cancelling a Prefill call removes a queued request, or frees its engine
// sequence at the next step boundary, aborts its transfer and drops its KV.
//
// # Concurrency
//
// The worker is a service and a batch (ollama's runner; etcd raft's
// Ready/Advance). The batch (pkg/prefill/batch) is chunked prefill by priority
// over the engine, run by one goroutine (Run): it owns every request's
// prefill state (engine sequence, progress, prefix hits, grammar state),
// the prefix cache's engine sequences and the engine's memory, and takes
// no lock. It imports engine, prefixcache, kv and runner, never grpc or
// api: the service maps its Go types to the wire.
//
// The service (the PrefillService handlers, the retained KV, the sender
// goroutines, the expiry ticker) holds the live requests, the retention
// store and each request's KV buffer and transfer under its one lock,
// Server.mu. It talks to the batch only by messages posted to its
// mailbox, a leaf (batch.Join when a Prefill call is queued, batch.Cancel
// when a request the batch holds ends in the service: cancelled, its
// transfer failed, the worker stopping; batch.Purge when a peer failed a
// spot check), taken at each step boundary. The batch answers through
// each request, its batch.Outbox (outbox.go: Start charges the retention
// bound and starts the sender, Prefix and KV copy KV into the buffer and
// push it to the transfer, End hands over the first token or the
// failure); those take mu from the loop, holding no lock of the batch,
// and never wait for it. A transfer has a leaf lock of its own. No lock
// is held across a call into another party, so there is no lock order to
// keep. Peers' exports of cached prefixes and spot checks of pulled KV
// read the engine between steps (batch.LockEngine).
//
// Server methods are safe for concurrent use.
package prefill
