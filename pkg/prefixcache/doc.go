// Package prefixcache is a worker's prompt-prefix cache: an index of engine
// sequences kept after their request ended, keyed by the chained hashes of
// their prompt's full blocks (kv.HashBlocks), so that a later prompt sharing
// k full blocks starts with an engine.Forker Fork of k × BlockTokens tokens
// from a cached sequence and computes only the rest.
//
// # Contract
//
//   - The index never calls the engine. Insert, Evict and Trim return the
//     engine sequences the caller must free (Cache.Free, which copies the
//     evicted ones into the host tier first); the caller holds its engine
//     lock (the worker's scheduler) around the call and the frees. The
//     host tier's Spill and Load call the engine they are given, under
//     that lock.
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
//     import on the decode worker), or a peer's Export, which takes its
//     pin under the worker's engine lock (so that a scheduler holding it
//     sees every pin it must count: Pinned, Source).
//   - Hits are whole blocks and leave at least one prompt token to compute
//     (the engine must run the last prompt token to sample the first output
//     token): Acquire is given that cap.
//
// # Host tier
//
// With Options.HostBytes (--host-cache-bytes; default Auto: a quarter of
// the free memory at start, FreeMemory and HostAutoDivisor: MemAvailable,
// or a container's memory limit less its usage when that is less; 0:
// off) the cache has a second,
// host-memory tier (Host): Cache.Free copies the full blocks of every
// entry evicted from the engine (for the bounds, or to give a live
// sequence its memory: Trim, Shrink, Reclaim; not superseded or drained
// ones) out of the engine with ExportKV over all layers, then frees the
// sequence. The tier is LRU under its byte budget (the model's true KV
// size, ModelSpec.KVBytesPerToken per token) and drops an entry whose
// blocks a newer one holds. A prompt for which HostDeeper reports a
// longer prefix there than in the engine tier is loaded back (Host.Load:
// ImportKV into its new engine sequence) instead of forked, and its
// prefill continues after it. The load's time is the engine's modeled
// host-link time on an engine that models one (engine.HostLinked: the
// performance-model engine prices it at the profile's PCIe bandwidth and
// waits it out in its next step), the imports' wall time otherwise (ref
// copies, llama.cpp stages the sequence's state for its next step). The
// load does not overlap with other work: the worker's scheduler runs it
// between steps.
//
// # Disk tier
//
// With Options.DiskBytes (--disk-cache-bytes, 0: off) and DiskDir
// (--disk-cache-dir, a local disk: the cache makes a directory of its own
// in it) the host tier writes the entries it evicts for its budget to
// files there (Disk), under a budget of their own, LRU. The engine lock
// is never held across file I/O: a worker reads a prompt's prefix from
// the disk tier before the request reaches its engine loop (ReadDisk,
// when the disk tier holds more of it than the engine and host tiers;
// given up after DiskReadTimeout), and Host.Load imports that read
// (HostDeeper counts it beside the host tier). The tier does not trust
// its files: each starts with a header naming its entry (tokens, layers,
// blocks, the last block's chain hash) and a CRC-32C of the header, the
// entry's block hashes and the KV; a file is opened without following a
// symbolic link and without blocking, and must be a regular file of the
// entry's size (fstat after the open). A file that fails any check drops
// its entry, is removed and counted (Stats.Disk.BadEntries, the
// bad_entries_total metric), and the prefix is computed. The checksum
// detects, it does not authenticate; a MAC under a per-deployment secret
// would take its place in a format of its own magic. Loads from disk
// count in Stats.Disk, and in the workers' host_tokens of PrefixHit (loaded, not
// in engine memory). Drain
// empties the tier and removes its directory. Its blocks are observed and
// listed as the host tier's (Disk.SetObserver, Disk.AppendBlocks): the
// worker publishes them as KV events of their own, which the router
// charges at a disk read each.
//
// # Peer pulls
//
// A worker may start a prompt from a prefix a peer worker's cache holds
// (Export on the peer; Pulled, LoadPulled and PeerDepth here; counted in
// PeerStats). kvtransfer.PullPricer, which both worker roles use, decides
// whether a pull is worth it: the prefix's true KV size over the link to the peer
// (measured over past pulls from it, or the assumed --peer-link-gbps)
// against the worker's prefill throughput measured over its steps, and
// for how long to wait for it; CostRatio is the same comparison for one
// token, for heartbeats.
//
// Provenance: an entry is tagged with where its KV came from (InsertFrom:
// "" computed here, else the peer a spot-checked pull came from, which a
// fork, Hit.Source, or a host-tier load, HostLoad.Source, carries on).
// The host tier keeps the tag; the disk tier, whose files hold none,
// takes only untagged entries (a tagged one the host tier evicts is
// dropped). DropSource removes a peer's entries from both tiers when it
// fails a later spot check (Stats.Peer.Purged). Pulled KV that was not
// verified is never inserted: the worker's KV events, digest and exports
// come from what the cache holds.
//
// # Handover
//
// An elastic worker that changes role keeps its model and its prefix
// cache: the old role's batch, stopping, takes the engine tier out of its
// cache (Handover: the unpinned entries' engine sequences, hashes,
// recency and provenance tags, not the KV, which stays in the engine),
// and the new role's batch takes it into its own (Adopt), under the new
// cache's bounds and its engine memory. The tags go along, and since
// unverified pulled KV is never inserted, none is handed over. A cache of
// another block size or hash key adopts nothing (the hashes would not
// match): the sequences are freed. The host and disk tiers go along
// (same block size and key only): the host tier's entries join the new
// cache's host tier without their KV being copied, the disk tier's index
// its disk tier, each file renamed into the new tier's directory (the
// same DiskDir); a new cache without a host tier (a decode role's
// default) drops them, files included.
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
