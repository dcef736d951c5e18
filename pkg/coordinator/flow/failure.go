package flow

import "fmt"

// Code is how a worker call failed, as far as the flow tells failures
// apart. The shell maps the call's gRPC status to it (the mapping is in
// package coordinator's edge).
type Code int

const (
	// CodeBroken: the call broke (gRPC UNKNOWN, INTERNAL, ABORTED,
	// CANCELED, DEADLINE_EXCEEDED, or an error with no status): another
	// worker may do.
	CodeBroken Code = iota
	// CodeUnavailable: the worker could not be reached or is shutting
	// down (UNAVAILABLE).
	CodeUnavailable
	// CodeFull: the worker has no room now (RESOURCE_EXHAUSTED).
	CodeFull
	// CodeInvalid: the worker cannot serve the request as asked
	// (INVALID_ARGUMENT, OUT_OF_RANGE).
	CodeInvalid
	// CodeLost: the worker does not hold what the call needs, such as
	// the request's reservation (FAILED_PRECONDITION).
	CodeLost
	// CodeRefused: any other refusal (NOT_FOUND, PERMISSION_DENIED, ...).
	CodeRefused
)

var codeNames = [...]string{"broken", "unavailable", "full", "invalid", "lost", "refused"}

func (c Code) String() string {
	if c >= 0 && int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("Code(%d)", int(c))
}

// CallError is a failed worker call (an event's Err).
type CallError struct {
	Code Code
	// Transfer: the prefill worker's KV transfer to the decode worker
	// failed (Code is the transfer's), not the prefill worker itself.
	Transfer bool
	// Grammar: the request's grammar allows no token; so on any worker.
	Grammar bool
	Err     error // the worker's error, for the log; never nil
}

func (e *CallError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *CallError) Unwrap() error { return e.Err }

// recoverable reports whether the failure means the worker (or the KV
// transfer to it) failed, so that another worker may finish the request.
func (e *CallError) recoverable() bool { return e.Code == CodeBroken || e.Code == CodeUnavailable }

// recoverableTransfer reports whether a failed KV transfer may succeed to
// another decode worker: the worker was gone or unreachable, lost the
// request (no reservation), or broke off. A transfer the worker refused
// as malformed or too big would fail anywhere.
func (e *CallError) recoverableTransfer() bool { return e.recoverable() || e.Code == CodeLost }

// Kind is what the client is told of a failed request (package
// coordinator maps each to an OpenAI-shaped HTTP error).
type Kind int

const (
	// KindInternal: nothing the client can act on (500).
	KindInternal Kind = iota
	// KindInvalid: Part's worker cannot serve the request as asked.
	KindInvalid
	// KindOverloaded: Part's workers have no room now (queue full).
	KindOverloaded
	// KindUnavailable: Part's worker is unavailable.
	KindUnavailable
	// KindNoKVRoom: no decode worker has free KV cache for the request.
	KindNoKVRoom
	// KindQueuesFull: every prefill worker's queue is full.
	KindQueuesFull
	// KindNoWorkers: no worker serving the request's model can take it.
	KindNoWorkers
	// KindDecodeFailed: the request failed on MaxRecoveries+1 decode
	// workers in turn.
	KindDecodeFailed
	// KindNotRecovered: the decode worker serving the request failed and
	// no other could take it.
	KindNotRecovered
)

var kindNames = [...]string{"internal", "invalid", "overloaded", "unavailable", "no-kv-room", "queues-full", "no-workers", "decode-failed", "not-recovered"}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Failure is a request's failure as the flow classifies it: its Kind,
// the worker Part it concerns ("prefill", "decode", "KV transfer"; ""
// for none) and its Cause (for the log: worker texts and addresses,
// never shown the client).
type Failure struct {
	Kind  Kind
	Part  string
	Cause error
}

func (f *Failure) Error() string { return f.Cause.Error() }

// Unwrap returns Cause.
func (f *Failure) Unwrap() error { return f.Cause }

// callFailure classifies a worker's failed call (the operation op, for
// the log) for the client; part names the worker's part. A refusal the
// client cannot act on is KindInternal.
func callFailure(op, part string, err *CallError) *Failure {
	f := &Failure{Part: part, Cause: fmt.Errorf("coordinator: %s: %w", op, err)}
	switch err.Code {
	case CodeInvalid:
		f.Kind = KindInvalid
	case CodeFull:
		f.Kind = KindOverloaded
	case CodeUnavailable:
		f.Kind = KindUnavailable
	}
	return f
}
