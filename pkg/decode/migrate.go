package decode

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pdserve/pdserve/pkg/decode/batch"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// migHold is a migrated sequence's KV, held for its pull (PullSequence)
// until one sent it whole, a Cancel of the request, or Options.ReserveTTL.
// Owned by Server.mu.
type migHold struct {
	snap    *batch.Snapshot
	ttl     timer
	pulling bool // a PullSequence is sending it
}

// Migrate moves running request id out of this worker (a live
// migration): at the batch's next step boundary its KV (prompt and every
// output token but the last) and output tokens are snapshot, its
// Generate call ends after its last token with an event saying it moved
// (GenerateResponse.migrated), and the worker holds the KV for the
// worker the caller of Generate then names migrate_from to (or until a
// Cancel of id or Options.ReserveTTL). Errors: FAILED_PRECONDITION for a
// request that cannot move now (not decoding here: reserved, waiting for
// its KV, prefilling, ended; several choices; no token yet), which goes
// on here; INTERNAL when the engine could not export its KV (the request
// then ended, as after a failed step); ctx's; UNAVAILABLE when the
// worker stops.
func (s *Server) Migrate(ctx context.Context, id string) error {
	reply, err := s.postExport(id)
	if err != nil {
		return err
	}
	return s.exportResult(ctx, id, reply)
}

// MigrateAll drains the worker by moving its sequences out rather than
// waiting for the longest one: it marks the worker draining (new requests
// go elsewhere; SetDraining) and migrates every request the batch runs
// (Migrate), all at the same step boundary. A request that cannot move
// yet (its KV still on its way or importing, its prompt prefilling
// here, no token yet) moves at the first step boundary after it can
// (batch.ExportWhenReady), and so does each request reserved before the
// drain that reaches the batch later: the drain ends when the last
// prefill delivered, not when the last sequence finished. It returns how
// many of those in the batch at the call moved; it waits for them (each
// moves or ends). Requests that can never move (several choices) finish
// here as before; the caller waits for them and for the moved
// sequences' pulls with WaitIdle. The error is ctx's or UNAVAILABLE when
// the worker stops.
func (s *Server) MigrateAll(ctx context.Context) (int, error) {
	// Draining and the exports in one critical section: whoever sees the
	// worker draining sees them posted.
	s.mu.Lock()
	s.sig.SetDrainingLocked(true)
	s.moveOut = true
	replies := make(map[string]chan batch.Exported)
	for id, q := range s.seqs {
		if q.handed && !q.done && !q.cancelling {
			replies[id] = make(chan batch.Exported, 1)
			s.b.Post(batch.ExportWhenReady(q.key, replies[id]))
		}
	}
	s.mu.Unlock()
	moved := 0
	for id, r := range replies {
		err := s.exportResult(ctx, id, r)
		switch {
		case err == nil:
			moved++
		case ctx.Err() != nil || status.Code(err) == codes.Unavailable:
			return moved, err
		default:
			s.log.Info("request not migrated; it finishes here", zap.String("request_id", id), zap.Error(err))
		}
	}
	s.log.Info("drain: sequences migrated", zap.Int("moved", moved), zap.Int("running", len(replies)))
	return moved, nil
}

// postExport asks the batch to export request id.
func (s *Server) postExport(id string) (chan batch.Exported, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.seqs[id]
	if q == nil || !q.handed || q.done || q.cancelling {
		return nil, status.Errorf(codes.FailedPrecondition, "decode: migrate %s: the request is not decoding here", id)
	}
	reply := make(chan batch.Exported, 1)
	s.b.Post(batch.Export(q.key, reply))
	return reply, nil
}

// exportResult waits for the batch's answer to request id's export.
func (s *Server) exportResult(ctx context.Context, id string, reply chan batch.Exported) error {
	select {
	case x := <-reply:
		switch {
		case x.Err == nil:
			return nil
		case isNotMigratable(x.Err):
			return status.Errorf(codes.FailedPrecondition, "decode: migrate %s: %v", id, x.Err)
		}
		return status.Errorf(codes.Internal, "decode: migrate %s: %v", id, x.Err)
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-s.baseCtx.Done():
		return errStopped
	}
}

func isNotMigratable(err error) bool {
	return errors.Is(err, batch.ErrNotRunning) || errors.Is(err, batch.ErrNotMigratable)
}

// migratedLocked ends q, which the batch exported (batch.Migrated): its
// KV is held for the pull, then its stream ends saying it moved. The
// caller holds mu.
func (s *Server) migratedLocked(q *sequence, snap *batch.Snapshot) {
	if snap != nil {
		s.dropHoldLocked(q.id)
		h := &migHold{snap: snap}
		id := q.id
		h.ttl = s.afterFunc(s.o.ReserveTTL, func() { s.expireHold(id, h) })
		s.holds[id] = h
	}
	if q.out != nil {
		q.out.migrate()
	}
	s.endLocked(q, "", nil)
}

// expireHold drops hold h of request id when nobody pulled it in time.
func (s *Server) expireHold(id string, h *migHold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holds[id] == h {
		s.log.Info("migrated sequence not pulled in time; its kv dropped", zap.String("request_id", id), zap.Duration("ttl", s.o.ReserveTTL))
		s.dropHoldLocked(id)
	}
}

// dropHoldLocked drops the hold of request id and reports whether there
// was one (a pull in progress still sends what it took). The caller
// holds mu.
func (s *Server) dropHoldLocked(id string) bool {
	h := s.holds[id]
	if h == nil {
		return false
	}
	h.ttl.Stop()
	delete(s.holds, id)
	s.sig.EndedLocked()
	return true
}

// TakeSequence implements kvtransfer.SequenceSource: the KV of migrated
// request id, for one pull at a time; dropped once sent whole.
func (s *Server) TakeSequence(_ context.Context, id string) (kvtransfer.SequenceKV, func(bool), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.holds[id]
	switch {
	case h == nil:
		return kvtransfer.SequenceKV{}, nil, status.Errorf(codes.NotFound, "decode: no migrated sequence %s held here", id)
	case h.pulling:
		return kvtransfer.SequenceKV{}, nil, status.Errorf(codes.Aborted, "decode: migrated sequence %s is being pulled", id)
	}
	h.pulling = true
	x := kvtransfer.SequenceKV{Tokens: h.snap.KV.Tokens, Layers: h.snap.KV.Layers}
	return x, func(sent bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		h.pulling = false
		if sent && s.holds[id] == h {
			s.dropHoldLocked(id)
		}
	}, nil
}

// pullMigrated pulls the KV of migrated call p from p.migrate: nil when
// it failed (logged; the sequence's KV is then computed here, as a
// recovery's). No lock is held: it is network I/O.
func (s *Server) pullMigrated(ctx context.Context, p genParams) *batch.KV {
	peer := p.migrate
	want := len(p.prompt) + len(p.generated) - 1
	if s.dialer == nil {
		s.log.Info("no dialer for a migration pull; computing the sequence's kv", zap.String("request_id", p.id))
		s.m.migrationPull(migrationComputed)
		return nil
	}
	t0 := s.now()
	got, err := s.dialer.PullSequence(grpcauth.CredentialContext(ctx, peer.GetCredential()), kvtransfer.SequencePull{
		RequestID: p.id, Addr: peer.GetAddr(), ID: peer.GetId(), Role: peer.GetRole(),
		MaxTokens: len(p.prompt) + p.maxTokens, Codec: p.migrateCodec, Spec: s.spec, TokenBytes: s.tokenBytes,
	})
	if err == nil && got.Tokens != want {
		err = fmt.Errorf("the sequence's kv holds %d tokens, want %d (the prompt and the generated tokens but the last)", got.Tokens, want)
	}
	if err != nil {
		s.log.Info("migration pull failed; computing the sequence's kv", zap.String("request_id", p.id), zap.String("peer", peer.GetId()), zap.Error(err))
		s.m.migrationPull(migrationComputed)
		return nil
	}
	s.m.migrationPull(migrationPulled)
	ends := make([][]int, len(got.Layers))
	for l := range ends {
		ends[l] = []int{got.Tokens}
	}
	s.log.Debug("migration pulled", zap.String("request_id", p.id), zap.String("peer", peer.GetId()),
		zap.Int("tokens", got.Tokens), zap.Int64("bytes_wire", got.BytesWire), zap.Duration("took", got.Took))
	return &batch.KV{Tokens: got.Tokens, Layers: got.Layers, Ends: ends, First: p.generated[0], FirstByte: t0.Add(got.FirstByte), Done: s.now()}
}

// migrateDone ends q's migration pull with x (nil: none; the sequence
// computes its KV) and hands q to the batch. A request that ended
// meanwhile (its call cancelled, the client gone) drops x.
func (s *Server) migrateDone(q *sequence, x *batch.KV) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q.pulling = false
	if q.done || q.join == nil {
		return
	}
	if x != nil {
		q.join.Local, q.join.KV = false, x
	}
	s.handLocked(q)
}
