// Package prefixcache is a worker's prompt-prefix cache: an index of engine
// sequences kept after their request ended, keyed by the chained hashes of
// their prompt's full blocks (kv.HashBlocks), so that a later prompt sharing
// k full blocks starts with an engine.Forker Fork of k × BlockTokens tokens
// from a cached sequence and computes only the rest.
//
// # Contract
//
//   - The cache never calls the engine. Insert, Evict and Trim return the
//     engine sequences the caller must Free; the caller holds its engine
//     lock (the worker's scheduler) around the call and the Frees.
//   - An entry is one engine sequence. It is bounded twice: Options.MaxTokens
//     (the KV tokens its sequences hold, Len of each) and Options.MaxEntries
//     (engine sequences, which count against an engine's sequence slots).
//     Eviction is least recently used first.
//   - Acquire pins the entry it returns: a pinned entry is never evicted, so
//     its sequence stays valid for the Fork the pin was taken for. Release
//     unpins. A Fork is independent of its source (ref and sim copy the KV,
//     llamacpp shares cells by reference), so evicting an entry after a fork
//     never touches a sequence in use: pins only span the time between a
//     lookup and its Fork (a step on the prefill worker; Reserve to the KV
//     import on the decode worker).
//   - Hits are whole blocks and leave at least one prompt token to compute
//     (the engine must run the last prompt token to sample the first output
//     token): Acquire is given that cap.
//
// # Digest
//
// Digest returns the cached block hashes for heartbeats of a worker that
// publishes no KV events (see Observer): entries most
// recently used first, each from its first block on (the router matches a
// prompt's leading hashes), deduplicated, at most n hashes. It is as stale
// as the heartbeat that carries it (one heartbeat interval).
//
// # Observer
//
// SetObserver attaches an Observer that is told, in order, of every block
// hash the cache starts holding (Stored) and stops holding (Removed), on
// every path that changes it: Insert, eviction for the bounds, Trim,
// Shrink, Reclaim and Drain. Replaying the reports on an empty set gives
// AppendBlocks' list; AppendBlocks' mark callback runs under the same lock
// as the reports, so an observer can tell where its report stream stands
// relative to that list (the worker's KV events and snapshots, package
// control). Without an observer the cache does no extra work.
//
// # Concurrency
//
// A Cache is safe for concurrent use; its lock is a leaf (it never takes
// another lock while holding its own).
package prefixcache
