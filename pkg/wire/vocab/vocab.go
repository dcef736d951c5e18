// Package vocab is the Go form of the words and bounds that cross
// processes: the names a worker, the coordinator and a client must agree
// on. It imports nothing, so that every core may use it (the workers'
// batches and the coordinator's flow, which speak no protobuf); pkg/wire
// maps its stamps and finish reasons to the protobuf enums of pdserve.v1
// (StampKind, FinishReason), and the rest of the system names these
// constants instead of repeating their values.
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
