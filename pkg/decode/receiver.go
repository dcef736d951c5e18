package decode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// receiver is the Server's kvtransfer.Receiver.
type receiver struct{ s *Server }

var _ kvtransfer.Receiver = receiver{}

// Begin accepts a transfer for a reserved request: FAILED_PRECONDITION
// without a reservation, for a request that prefills locally, or when KV
// was already received or is being received; RESOURCE_EXHAUSTED when the
// header's tokens exceed the reservation; INVALID_ARGUMENT when its layer
// count is not the model's.
func (r receiver) Begin(_ context.Context, h kvtransfer.StreamHeader) (kvtransfer.Sink, error) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.seqs[h.RequestID]
	switch {
	case q == nil || q.done:
		return nil, status.Errorf(codes.FailedPrecondition, "decode: no reservation for request %s", h.RequestID)
	case h.Tokens > q.resTokens:
		return nil, status.Errorf(codes.ResourceExhausted, "decode: transfer of %s has %d tokens, %d reserved", h.RequestID, h.Tokens, q.resTokens)
	case h.Layers != s.spec.Layers:
		return nil, status.Errorf(codes.InvalidArgument, "decode: transfer of %s has %d layers, the model %d", h.RequestID, h.Layers, s.spec.Layers)
	case q.attached && q.local:
		return nil, status.Errorf(codes.FailedPrecondition, "decode: request %s prefills locally", h.RequestID)
	case q.committed:
		return nil, status.Errorf(codes.FailedPrecondition, "decode: kv of request %s was received already", h.RequestID)
	case q.sink != nil:
		return nil, status.Errorf(codes.FailedPrecondition, "decode: kv of request %s is being received", h.RequestID)
	case q.attached && len(q.prompt) != h.Tokens:
		return nil, status.Errorf(codes.InvalidArgument, "decode: transfer of %s has %d tokens, the prompt %d", h.RequestID, h.Tokens, len(q.prompt))
	}
	s.nextSeq++
	q.seq, q.hasSeq = s.nextSeq, true
	q.firstByte = time.Time{}
	q.xferErr = nil
	k := &sink{s: s, q: q, h: h}
	q.sink = k
	return k, nil
}

// sink imports one transfer's KV into the engine.
type sink struct {
	s *Server
	q *sequence
	h kvtransfer.StreamHeader
}

// errGone fails writes to a request that ended while its KV arrived.
func (k *sink) errGone() error {
	return status.Errorf(codes.Aborted, "decode: request %s ended during its kv transfer", k.q.id)
}

// Write imports the frame between scheduler steps. raw is not kept.
func (k *sink) Write(layer, start, end int, raw []byte) error {
	s, q := k.s, k.q
	s.engMu.Lock()
	defer s.engMu.Unlock()
	s.mu.Lock()
	gone := q.done || q.sink != k
	if !gone && q.firstByte.IsZero() {
		q.firstByte = s.now()
	}
	s.mu.Unlock()
	if gone {
		return k.errGone()
	}
	if err := s.eng.ImportKV(q.seq, layer, start, raw); err != nil {
		code := codes.Internal
		if errors.Is(err, engine.ErrRange) || errors.Is(err, engine.ErrSeqTooLong) {
			code = codes.InvalidArgument
		}
		return status.Errorf(code, "decode: import kv of %s layer %d [%d, %d): %v", q.id, layer, start, end, err)
	}
	return nil
}

// Commit makes the sequence ready to join the batch.
func (k *sink) Commit(c kvtransfer.Commit) error {
	s, q := k.s, k.q
	s.engMu.Lock()
	defer s.engMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if q.done || q.sink != k {
		return k.errGone()
	}
	if n, err := s.eng.Len(q.seq); err != nil || n != k.h.Tokens {
		return status.Errorf(codes.Internal, "decode: kv of %s holds %d tokens after the transfer, want %d (%v)", q.id, n, k.h.Tokens, err)
	}
	if c.FirstToken < 0 || int(c.FirstToken) >= s.spec.Vocab {
		return status.Errorf(codes.InvalidArgument, "decode: first token %d of %s outside the vocabulary", c.FirstToken, q.id)
	}
	q.sink = nil
	// An unclaimed reservation keeps its TTL: received KV does not keep it
	// alive when no Generate call comes for it.
	q.committed = true
	q.kvTokens = k.h.Tokens
	q.first = c.FirstToken
	q.kvDone = s.now()
	s.readyLocked(q)
	return nil
}

// Abort frees the KV received so far. A Generate call waiting for it ends
// with ABORTED, and so does one that comes later, unless a new transfer
// began in between; the reservation stays until Cancel or its TTL.
func (k *sink) Abort(err error) {
	s, q := k.s, k.q
	s.engMu.Lock()
	defer s.engMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if q.done || q.sink != k {
		return
	}
	q.sink = nil
	q.xferErr = err
	if err == nil {
		q.xferErr = errors.New("aborted")
	}
	s.eng.Free(q.seq)
	q.hasSeq = false
	if q.attached {
		s.endLocked(q, "", status.Errorf(codes.Aborted, "decode: kv transfer of %s failed: %v", q.id, fmt.Sprint(err)))
	}
}
