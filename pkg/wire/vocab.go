package wire

import (
	"fmt"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// stampKinds maps each vocab.Stamp to its wire kind.
var stampKinds = map[vocab.Stamp]pdservev1.StampKind{
	vocab.StampKVFirstByte:  pdservev1.StampKind_STAMP_KIND_KV_FIRST_BYTE,
	vocab.StampKVDone:       pdservev1.StampKind_STAMP_KIND_KV_DONE,
	vocab.StampPrefillStart: pdservev1.StampKind_STAMP_KIND_PREFILL_START,
	vocab.StampPrefillEnd:   pdservev1.StampKind_STAMP_KIND_PREFILL_END,
	vocab.StampDecodeJoined: pdservev1.StampKind_STAMP_KIND_DECODE_JOINED,
	vocab.StampFirstToken:   pdservev1.StampKind_STAMP_KIND_FIRST_TOKEN,
	vocab.StampLastToken:    pdservev1.StampKind_STAMP_KIND_LAST_TOKEN,
}

// StampKind returns the wire kind of s (STAMP_KIND_UNSPECIFIED for none).
func StampKind(s vocab.Stamp) pdservev1.StampKind { return stampKinds[s] }

// FromStampKind returns the stamp of wire kind k, or 0 for an unspecified
// or unknown kind (one of a newer worker: the reader skips it).
func FromStampKind(k pdservev1.StampKind) vocab.Stamp {
	for s, sk := range stampKinds {
		if sk == k && k != pdservev1.StampKind_STAMP_KIND_UNSPECIFIED {
			return s
		}
	}
	return 0
}

// FinishReason returns the wire form of finish reason r (vocab.FinishStop,
// vocab.FinishLength), or FINISH_REASON_UNSPECIFIED for "" (not finished)
// and any other string.
func FinishReason(r string) pdservev1.FinishReason {
	switch r {
	case vocab.FinishStop:
		return pdservev1.FinishReason_FINISH_REASON_STOP
	case vocab.FinishLength:
		return pdservev1.FinishReason_FINISH_REASON_LENGTH
	}
	return pdservev1.FinishReason_FINISH_REASON_UNSPECIFIED
}

// FromFinishReason returns the finish reason of f (vocab.FinishStop,
// vocab.FinishLength), or "" when f is unspecified (not finished) or
// unknown.
func FromFinishReason(f pdservev1.FinishReason) string {
	switch f {
	case pdservev1.FinishReason_FINISH_REASON_STOP:
		return vocab.FinishStop
	case pdservev1.FinishReason_FINISH_REASON_LENGTH:
		return vocab.FinishLength
	}
	return ""
}

// Finish returns the finish reason of a Generate event: its finish, or
// for a worker that predates it, its finish_reason string when that is a
// finish reason this package knows; "" when the event finishes nothing.
func Finish(resp *pdservev1.GenerateResponse) string {
	if f := FromFinishReason(resp.GetFinish()); f != "" {
		return f
	}
	legacy := resp.GetFinishReason() //nolint:staticcheck // read only from workers that predate finish
	return FromFinishReason(FinishReason(legacy))
}

// SetFinish sets resp's finish to reason r, and its deprecated
// finish_reason string for a coordinator that predates finish.
func SetFinish(resp *pdservev1.GenerateResponse, r string) {
	resp.Finish = FinishReason(r)
	if resp.Finish != pdservev1.FinishReason_FINISH_REASON_UNSPECIFIED {
		resp.FinishReason = r //nolint:staticcheck // written for coordinators that predate finish
	}
}

// Priority returns the wire form of priority p (PRIORITY_INTERACTIVE for
// vocab.PriorityInteractive and any value vocab does not name).
func Priority(p vocab.Priority) pdservev1.Priority {
	if p == vocab.PriorityBatch {
		return pdservev1.Priority_PRIORITY_BATCH
	}
	return pdservev1.Priority_PRIORITY_INTERACTIVE
}

// FromPriority returns the priority of wire value p: unspecified (a
// caller that predates the field) is interactive; a value this build
// does not know is an error, which a worker answers with
// INVALID_ARGUMENT.
func FromPriority(p pdservev1.Priority) (vocab.Priority, error) {
	switch p {
	case pdservev1.Priority_PRIORITY_UNSPECIFIED, pdservev1.Priority_PRIORITY_INTERACTIVE:
		return vocab.PriorityInteractive, nil
	case pdservev1.Priority_PRIORITY_BATCH:
		return vocab.PriorityBatch, nil
	}
	return 0, fmt.Errorf("wire: unknown priority %d", int32(p))
}
