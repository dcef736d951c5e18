// Package router chooses the workers of a request: a decode worker first
// (most free KV blocks, then least running batch, then lowest id; draining
// workers never), then whether the prompt prefills remotely or on the
// decode worker itself (conditional disaggregation: a prompt whose uncached
// part is shorter than a threshold prefills locally), then the prefill
// worker (fewest queued prefill tokens, less a bonus for prefix-cache
// overlap when enabled; ties by id).
//
// The Router is a deterministic core: it takes the time and the workers'
// heartbeat snapshots as inputs, never reads a clock and does no I/O, so the
// same inputs always give the same choice. Between heartbeats it tracks its
// own assignments: an assignment made after a worker's snapshot was taken
// counts against that worker (KV blocks, running batch, queued prefill
// tokens) until a newer snapshot arrives or the request is Done, so a burst
// arriving between two heartbeats spreads over the workers instead of
// piling onto the one that looked emptiest. Snapshot times come from the
// workers' clocks; on one host, or with synchronised clocks, that is exact
// enough (an error of a few ms only shifts how long an assignment counts).
//
// The router only estimates KV capacity; the decode worker's Reserve is the
// authoritative check. A caller whose Reserve fails routes again with that
// worker excluded.
//
// Router is safe for concurrent use.
package router
