// Package control is pdserve's control plane on NATS: workers publish
// heartbeats, the coordinator keeps a membership view from them, and
// commands (drain, cancel, resend) go to one worker by request/reply. Bulk
// data (KV) never goes over NATS; see package kvtransfer.
//
// # Subjects and payloads
//
// Every payload is JSON (UTF-8, field names in lower snake case, times in
// RFC 3339 with nanoseconds), so any NATS client can read and write them:
//
//	pdserve.hb.<role>.<id>   Heartbeat, published by a worker every interval
//	pdserve.cmd.<id>         Command, request/reply; the reply is a CommandReply
//	pdserve.plan             planner decisions (payload defined by the planner)
//
// Worker ids and roles must be valid single NATS subject tokens: not empty,
// no '.', '*', '>' or white space (ValidToken).
//
// # Membership
//
// Membership is a deterministic core: it never reads the clock; callers
// pass the time of every observation and expiry. A member whose last
// heartbeat was observed more than the TTL ago is removed by Expire. Members
// lists live members of a role, draining ones excluded; Models lists the
// models they serve, each with the smallest context length (MaxSeqLen) its
// workers report. Watch wires a Membership to NATS and expires on a ticker.
//
// # Embedded server
//
// StartEmbedded runs a nats-server in the process (no logging, no signal
// handlers), for a coordinator started without a NATS URL and for tests.
package control
