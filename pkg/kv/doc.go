// Package kv does the bookkeeping of a worker's paged KV cache: which
// fixed-size token blocks are free or in use and by how many holders
// (Pool), which blocks hold the KV of which request (Reservations), and
// which blocks hold an already computed prompt prefix (PrefixCache, keyed by
// the chained block hashes of HashBlocks).
//
// The KV bytes themselves live in the engine; this package only accounts
// for them, so that a worker can never promise more KV memory than it has.
// Every type here is safe for concurrent use.
//
// # Prefix hashes
//
// HashBlocks hashes a token sequence one full block at a time as a chain:
// the hash of block i covers its own tokens and the hash of block i-1, so it
// identifies the whole prefix up to the end of block i. Hashes are xxhash64
// over a fixed little-endian encoding, hence stable across processes,
// machines and releases: they travel in heartbeats and routers compare them.
package kv
