// Package flow holds the decisions of one request's life on the workers,
// as a deterministic state machine in the style of etcd's raft: events
// in, actions out. It starts no goroutine, reads no clock and does no
// I/O; the caller (the coordinator's backend, "the shell") performs each
// action (router and gRPC calls, writes to the client) and feeds what
// comes back as events.
//
// # Protocol
//
// NewMachine, then Step(Start{}). Each Step returns the actions to
// perform, in order; the Machine owns nothing the caller must free, and
// the returned slice and the values in it are the caller's. Three
// actions are synchronous: the caller performs them at once and steps
// their result before anything else (their result events are Routed,
// Reserved and Delivered). The Machine emits a synchronous action only
// as the last action of a Step, so the caller can perform a Step's
// actions in order, stepping a synchronous result (and performing what
// it returns) as it goes.
//
// The other actions start calls (Prefill, Generate, Resend) whose
// messages and ends come back later as events tagged with the attempt
// the action carried; an event of an older attempt is dropped. A
// ClientGone event tells the Machine the client left; the caller steps
// it before the first event it feeds after the client's context ended,
// so the Machine sees the departure exactly where the old code read the
// context.
//
// The request ends with the actions Stop (cancel every call still open
// and wait for each to end, dropping their events), Cancel and Release
// (free the request on the workers that may hold it), and last Finish
// (success: Machine.Finish has each choice's finish reason) or Fail.
// After that the Machine ignores every event, except Delivered's
// ErrStopped for a choice (a stop string the client's writer matched),
// which still marks that choice "stop".
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
