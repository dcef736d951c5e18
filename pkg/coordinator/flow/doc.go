// Package flow holds the decisions of one request's life on the workers,
// as a deterministic state machine in the style of etcd's raft: events
// in, actions out. It starts no goroutine, reads no clock and does no
// I/O; the caller (the coordinator's backend, "the shell") performs each
// action (router and gRPC calls, writes to the client) and feeds what
// comes back as events.
//
// # Its own types
//
// The flow speaks only its own Go types and the router's: it links no
// protobuf, gRPC, wire or frontend package (internal/layering checks it).
// The shell converts each worker message to an event (PrefillQueued,
// FirstToken, KVDone, Tokens, ResendDone) and each call's status to a
// CallError: its Code (a class of gRPC codes: broken, unavailable,
// full, invalid, lost, refused) and whether it is a failed KV transfer
// or a grammar that allows no token. A request the flow fails ends with
// a *Failure (Fail.Err): a Kind the client is told of, the worker Part
// it concerns and the Cause for the log; the coordinator maps the Kind
// to HTTP. The flow's part of the request's budget (Budget) is its own
// value: it emits a Record of it whenever it changed, before the next
// action that is not a Log and at the end of a Step, and the shell
// applies it to the request's budget.Trace (Budget.Apply), so the trace
// is current whenever the shell performs an action.
//
// # Protocol
//
// NewMachine, then Step(Start{}). Each Step returns the actions to
// perform, in order; the Machine owns nothing the caller must free, and
// the returned slice and the values in it are the caller's. Three
// actions are synchronous: the caller performs them and steps their
// result (Routed, Reserved, Delivered) before any other event. The
// Machine emits a synchronous action only as the last action of a Step,
// so the caller performs a Step's actions in order and queues the
// result; it never calls Step from inside an action (raft's
// Ready/Advance: the caller drains a queue of events).
//
// Routing is the router's (router.Router.Route makes the whole decision:
// workers, local or remote prefill, the peer to pull from). The Machine
// revises a first placement's remote decision on its decode worker's
// Reserve answer with the pure router.Revise, and tells the router with
// Revised when the prefill moved onto the decode worker.
//
// The other actions start calls (Prefill, Generate, Resend) whose
// messages and ends come back later as events tagged with the attempt
// the action carried; an event of an older attempt is dropped. A
// ClientGone event tells the Machine the client left; the caller steps
// it before the first event it feeds after the client's context ended,
// so the Machine sees the departure exactly where the old code read the
// context.
//
// An event that breaks the protocol (out of order: before Start, while
// placing or delivering, a second answer; for the wrong part: a choice
// the request does not have, log-probabilities that do not match their
// tokens; tokens past a choice's end) ends the request with an internal
// error (testdata/violations.txt).
//
// The request ends with the actions Stop (cancel every call still open
// and wait for each to end, dropping their events), Cancel and Release
// (free the request on the workers that may hold it), and last Finish
// (success: Machine.Finish has each choice's finish reason) or Fail.
// After that the Machine ignores every event.
//
// # Live migration
//
// A decode worker that drains moves a running request out: its stream's
// last message says so (Tokens.Migrated) and the stream ends cleanly.
// That is no failure (no recovery is counted): the Machine routes and
// reserves another decode worker as for a recovery and opens Generate
// there with the tokens the client has and MigrateFrom, the old worker,
// from which the new one pulls the KV (no Resend). Until the new worker
// streams a token, a recovery's worker pulls from the old one too. The
// end cancels the request on the old worker (which drops its copy of
// the KV when no pull took it). Tokens after Migrated break the
// protocol (testdata/migration.txt).
//
// # Time
//
// Nothing in the flow waits on a timer: the unary calls' deadlines are
// the caller's contexts, and a call that never ends ends with the
// client's context. Time enters only as data: Reserved.At (the routed
// boundary of the budget) and the workers' own stamps in their messages.
//
// # Concurrency
//
// A Machine is not safe for concurrent use: one goroutine steps it.
package flow
