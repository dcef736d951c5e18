// Package kv names a worker's paged KV cache: fixed-size token blocks
// counted by a Pool (which blocks are free or in use, and by how many
// holders; the decode worker's reservations draw on one), and the chained
// block hashes of HashBlocks that identify a prompt prefix across
// processes (the prefix caches of package prefixcache, heartbeats and the
// router key on them).
//
// The KV bytes themselves live in the engine; a Pool only accounts for
// them, so that a worker can never promise more KV memory than it has.
// Pool is safe for concurrent use.
//
// # Prefix hashes
//
// HashBlocks hashes a token sequence one full block at a time as a chain:
// the hash of block i covers its own tokens and the hash of block i-1, so it
// identifies the whole prefix up to the end of block i. Hashes are xxhash64
// over a fixed little-endian encoding, hence stable across processes,
// machines and releases: they travel in heartbeats and routers compare them.
package kv
