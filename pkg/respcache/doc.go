// Package respcache is an LRU cache of completed responses for identical
// requests (issue 13, part 4): a hit is served without contact with the
// model.
//
// A Cache[V] maps a Key (a SHA-256 digest the caller computes over what
// determines the output: see pkg/frontend) to a value V the caller treats
// as immutable once stored. It is bounded by entries and by bytes (the
// size the caller states for each value), least recently used first out,
// and every entry expires TTL after it was put. Time is an input: every
// method that looks at expiry takes now, and the cache never reads a
// clock, so tests drive it with a fake one.
//
// The cache does no single-flight: concurrent identical misses each run
// and each put; the last put wins. Stats reports occupancy and the
// cumulative evictions (capacity) and expirations (TTL) for metrics.
//
// A Cache is safe for concurrent use.
package respcache
