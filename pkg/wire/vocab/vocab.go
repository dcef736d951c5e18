// Package vocab is the Go form of the words and bounds that cross
// processes: the names a worker, the coordinator and a client must agree
// on. It imports nothing, so that every core may use it (the workers'
// batches and the coordinator's flow, which speak no protobuf); pkg/wire
// maps its stamps and finish reasons to the protobuf enums of pdserve.v1
// (StampKind, FinishReason), and the rest of the system names these
// constants instead of repeating their values. internal/vocabcheck fails
// on a copy.
package vocab

// Stamp names a boundary timestamp of a request that a worker takes and
// the coordinator's budget reads (the wire's pdservev1.StampKind).
type Stamp int

// The stamps. The zero Stamp is none.
const (
	// Remote KV: the first frame arrived; the last frame was staged.
	StampKVFirstByte Stamp = iota + 1
	StampKVDone
	// Local prefill: its first chunk started; its last chunk ended.
	StampPrefillStart
	StampPrefillEnd
	// The sequence joined the decode batch.
	StampDecodeJoined
	// The first token a Generate call streams; the last one.
	StampFirstToken
	StampLastToken
)

// Stamps are every stamp, in order.
var Stamps = []Stamp{StampKVFirstByte, StampKVDone, StampPrefillStart, StampPrefillEnd, StampDecodeJoined, StampFirstToken, StampLastToken}

// Finish reasons of a choice: OpenAI's names, which the frontend hands to
// clients as they are (the wire's pdservev1.FinishReason).
const (
	// An end-of-generation token (unless ignore_eos) or a stop token; also
	// a stop string, which the coordinator matches.
	FinishStop = "stop"
	// max_tokens reached.
	FinishLength = "length"
)

// MaxRequestID is the longest request id, in bytes: a KV frame
// (pkg/kv/codec) carries the id with its length in one byte, so the
// workers refuse longer ones before any KV is computed.
const MaxRequestID = 255

// DefaultBlockTokens is the default tokens per KV block of the workers
// (--block-tokens) and the coordinator, whose prompt prefix hashes must
// cover the same blocks as the workers' (pkg/prefixcache, the router).
const DefaultBlockTokens = 16

// Serving modes: how a request was served, in its budget (the pdserve
// object of a response, the request log) and the coordinator's
// --mode; a planner recommends one of the first two.
const (
	// Prefill and decode on separate workers.
	ModeDisaggregated = "disaggregated"
	// Colocated workers prefill and decode.
	ModeColocated = "colocated"
	// A disaggregated request whose decode worker prefilled it itself
	// (conditional disaggregation).
	ModeLocal = "local"
)

// First-token policies: which worker's first token reaches the client,
// in a request's budget, the coordinator's --first-token-policy and the
// planner's model.
const (
	// The prefill worker's first token goes at once, so the KV transfer
	// lands in the first inter-token gap.
	PolicyPrefill = "prefill"
	// The first token waits for the decode worker's first event, so the
	// KV transfer is part of TTFT.
	PolicyDecode = "decode"
)

// Priority is a request's class in the workers' queues (the wire's
// pdservev1.Priority): a worker's batch starts waiting requests first
// come first served, except that an interactive request goes ahead of
// older batch ones, a bounded number of times in a row (pkg/batching's
// Order, in pkg/prefill/batch and pkg/decode/batch). The zero Priority is
// interactive: what a request without an objective, or from a caller
// that predates the field, gets.
type Priority int

// The priorities.
const (
	PriorityInteractive Priority = iota
	PriorityBatch
)
