package decode

import (
	"context"
	"errors"
	"fmt"
	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"slices"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/wire"
)

// Run runs the continuous-batching scheduler until ctx ends or Stop is
// called, then ends every request with UNAVAILABLE and frees its engine
// sequence and blocks. It returns nil after a stop, or an error when Run
// was called twice.
func (s *Server) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return errors.New("decode: Run called twice")
	}
	s.ran = true
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.baseCtx, cancel)
	defer stop()
	defer s.shutdown()
	for {
		s.engMu.Lock()
		s.freeReclaimed()
		s.importJoining()
		b := s.plan()
		if b.size() == 0 {
			s.engMu.Unlock()
			select {
			case <-s.sig.Woken():
				continue
			case <-ctx.Done():
				return nil
			}
		}
		if ctx.Err() != nil {
			s.engMu.Unlock()
			return nil
		}
		s.step(ctx, b)
		s.engMu.Unlock()
	}
}

// Stop ends Run; it does not wait.
func (s *Server) Stop() { s.stop() }

// shutdown ends every request.
func (s *Server) shutdown() {
	s.engMu.Lock()
	defer s.engMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for _, q := range s.seqs {
		s.endLocked(q, "", errStopped)
	}
	for _, x := range append(s.cache.Drain(), s.reclaimed...) {
		s.eng.Free(x)
	}
	s.reclaimed = nil
	s.chargeCacheLocked()
}

// stepPlan is one planned step: prefill chunks and decode tokens, with the
// sequence of each item.
type stepPlan struct {
	prefill []engine.PrefillItem
	pq      []*sequence
	decode  []engine.DecodeItem
	dq      []*sequence
}

func (b stepPlan) size() int { return len(b.prefill) + len(b.decode) }

// chunkSizes splits a step's token budget: every running decode takes one
// token, then each sequence still prefilling, in order, gets at most chunk
// of its pending tokens from what is left. It returns the chunk size per
// pending entry (0 when the budget ran out).
func chunkSizes(decodes int, pending []int, budget, chunk int) []int {
	left := budget - decodes
	out := make([]int, len(pending))
	for i, p := range pending {
		n := max(0, min(p, chunk, left))
		out[i] = n
		left -= n
	}
	return out
}

// plan admits waiting sequences while the batch has room (remote ones once
// importJoining imported their KV) and picks the step's items. The caller
// holds engMu.
func (s *Server) plan() stepPlan {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for len(s.waiting) > 0 && s.slotsLocked()+s.waiting[0].n <= s.o.MaxBatch {
		q := s.waiting[0]
		if q.staged != nil {
			// Its KV is not in the engine yet: importJoining brings it
			// in at the next step boundary.
			s.sig.Wake()
			break
		}
		s.waiting = slices.Delete(s.waiting, 0, 1)
		q.queued = false
		s.joinLocked(q, now)
	}
	var b stepPlan
	var pre []*sequence
	var pending []int
	for _, q := range s.active {
		if len(q.pending) == 0 {
			b.decode = append(b.decode, engine.DecodeItem{Seq: q.seq, Token: q.next, Sampling: q.sampling})
			b.dq = append(b.dq, q)
			continue
		}
		pre = append(pre, q)
		pending = append(pending, len(q.pending))
	}
	for i, n := range chunkSizes(len(b.decode), pending, s.o.MaxBatchTokens, s.o.ChunkTokens) {
		if n == 0 {
			continue
		}
		q := pre[i]
		b.prefill = append(b.prefill, engine.PrefillItem{
			Seq:       q.seq,
			Tokens:    q.pending[:n],
			Sampling:  q.sampling,
			Last:      q.sampleLast && n == len(q.pending),
			AllLogits: q.promptTop >= 0,
		})
		b.pq = append(b.pq, q)
	}
	return b
}

// slotsLocked is the batch's occupancy: the sequences in it and the
// choices its requests will fork. The caller holds mu.
func (s *Server) slotsLocked() int {
	n := len(s.active)
	for _, q := range s.active {
		if q.parent == nil && !q.forked {
			n += q.n - 1
		}
	}
	return n
}

// forkLocked starts choices 1..n-1 of root q from its prompt's KV: each
// forks the KV of the prompt but its last token, which it then computes
// itself to sample its own first token (or, after a recovery, to replay
// its generated tokens). The caller holds engMu and mu.
func (s *Server) forkLocked(q *sequence) error {
	q.forked = true
	if q.n <= 1 {
		return nil
	}
	f, ok := s.eng.(engine.Forker)
	if !ok {
		return errors.New("decode: the engine cannot fork sequences")
	}
	p := len(q.prompt)
	for i := 1; i < q.n; i++ {
		var gen []int32
		if len(q.genChoices) > 0 {
			gen = q.genChoices[i-1]
		}
		c := &sequence{
			id: q.id, index: i, parent: q, local: true, attached: true,
			prompt: q.prompt, maxTokens: q.maxTokens, ignoreEOS: q.ignoreEOS, stop: q.stop,
			out: q.out, top: q.top, promptTop: -1, generated: gen,
			sampling: q.sampling, emitted: len(gen), firstStamps: true,
		}
		c.sampling.Seed = q.sampling.Seed + uint64(i)
		c.penalties = newPenalties(q.sampling.Penalties, gen)
		c.sampling.Penalties = c.penalties
		c.constraint, c.sampling.Constraint = nil, nil
		if mask, err := s.constrain(q.sampling.Grammar, gen); err != nil {
			return fmt.Errorf("decode: grammar of choice %d of %s: %w", i, q.id, err)
		} else if mask != nil {
			c.constraint, c.sampling.Constraint = mask, mask
		}
		s.nextSeq++
		if err := f.Fork(q.seq, s.nextSeq, p-1); err != nil {
			closeGrammar(c.constraint)
			return fmt.Errorf("decode: fork choice %d of %s: %w", i, q.id, err)
		}
		c.seq, c.hasSeq = s.nextSeq, true
		c.pending = []int32{q.prompt[p-1]}
		if m := len(gen); m > 0 {
			c.pending = append(c.pending, gen[:m-1]...)
			c.next = gen[m-1]
		}
		c.sampleLast = len(gen) == 0
		c.joined = true
		q.children = append(q.children, c)
		s.active = append(s.active, c)
	}
	return nil
}

// logprob returns the log-probability message of token t that o sampled
// for q, or nil when q asks for none.
func (s *Server) logprob(q *sequence, o engine.Output) *pdservev1.TokenLogprob {
	if q.top < 0 {
		return nil
	}
	return wire.TokenLogprob(wire.OutputLogprob(o.Logits, o.Token, len(q.prompt)+q.emitted, q.top, s.spec.Vocab))
}

// addPromptLogprobs appends the log-probabilities of the prompt tokens
// that follow the n chunk tokens q just prefilled, from the chunk's rows
// of logits (nil: the engine computes none; stand-ins then).
func (s *Server) addPromptLogprobs(q *sequence, rows []float32, n int) {
	v := s.spec.Vocab
	for j := range n {
		pos := q.filled + j + 1 // the prompt token row j predicts
		if pos >= len(q.prompt) {
			break
		}
		var row []float32
		if len(rows) >= (j+1)*v {
			row = rows[j*v : (j+1)*v]
		}
		q.promptLPs = append(q.promptLPs, wire.TokenLogprob(wire.OutputLogprob(row, q.prompt[pos], pos, q.promptTop, v)))
	}
}

// joinLocked puts q in the batch: a local prefill gets its engine sequence
// and pending prompt; remote KV streams its first token now; a recovery
// re-prefills the tokens generated before, but the last, which is the next
// decode input.
func (s *Server) joinLocked(q *sequence, now time.Time) {
	q.joined = true
	s.active = append(s.active, q)
	m := len(q.generated)
	q.emitted = m
	var regen []int32
	if m > 1 {
		regen = q.generated[:m-1]
	}
	if q.local {
		s.nextSeq++
		q.seq, q.hasSeq = s.nextSeq, true
		hit := s.forkCachedLocked(q)
		if hit > 0 && q.out != nil {
			q.out.prefixHit(hit)
		}
		q.pending = append(slices.Clone(q.prompt[hit:]), regen...)
		q.sampleLast = m == 0
	} else {
		q.pending = slices.Clone(regen)
		q.out.stamp(StampKVFirstByte, q.firstByte)
		q.out.stamp(StampKVDone, q.kvDone)
		if m > 0 && q.generated[0] != q.first {
			s.log.Warn("recovered request's first token differs from the prefill worker's",
				zap.String("request_id", q.id), zap.Int32("generated", q.generated[0]), zap.Int32("prefill", q.first))
		}
	}
	q.out.stamp(StampJoined, now)
	if !q.local {
		// The prompt's KV is in the engine: the other choices start.
		if err := s.forkLocked(q); err != nil {
			s.log.Error("fork choices", zap.String("request_id", q.id), zap.Error(err))
			s.endLocked(q, "", status.Error(codes.Internal, err.Error()))
			return
		}
	}
	switch {
	case m > 0:
		q.next = q.generated[m-1]
	case !q.local:
		var lp *pdservev1.TokenLogprob
		if q.top >= 0 {
			// The prefill worker sampled it and sent its log-probability
			// with the commit.
			lp = q.firstLP
			if lp == nil {
				lp = &pdservev1.TokenLogprob{Token: q.first}
			}
		}
		s.emitLocked(q, q.first, lp, len(s.active), now)
	}
}

// forkCachedLocked starts local-prefill q's new engine sequence from the
// longest cached prefix of its prompt, forked from the engine tier or
// loaded from the host tier when that holds more, and returns its tokens
// (0: a miss, a request asking for prompt logprobs, which needs every
// prompt position computed, or a failed fork or load, logged). The caller
// holds engMu and mu.
func (s *Server) forkCachedLocked(q *sequence) int {
	if s.cache == nil || q.promptTop >= 0 {
		return 0
	}
	maxHit := s.cache.MaxHitBlocks(len(q.prompt))
	if s.cache.HostDeeper(q.hashes, maxHit) {
		ld, err := s.cache.Host().Load(s.eng, q.seq, q.hashes, maxHit)
		if err != nil {
			s.log.Warn("prefix cache host-tier load failed; prefilling the whole prompt", zap.String("request_id", q.id), zap.Error(err))
			s.eng.Free(q.seq)
			return 0
		}
		q.hostHit, q.hostLoad = ld.Tokens, ld.Took
		return ld.Tokens
	}
	hit := s.cache.Acquire(q.hashes, maxHit)
	defer s.cache.Release(hit)
	if hit.Tokens == 0 {
		return 0
	}
	if err := s.eng.(engine.Forker).Fork(hit.Seq, q.seq, hit.Tokens); err != nil {
		s.log.Warn("prefix cache fork failed; prefilling the whole prompt", zap.String("request_id", q.id), zap.Error(err))
		s.eng.Free(q.seq)
		return 0
	}
	return hit.Tokens
}

// emitLocked streams token t of q, produced in a step of batch sequences,
// and ends q when t finishes it. Otherwise t is q's next decode input.
func (s *Server) emitLocked(q *sequence, t int32, lp *pdservev1.TokenLogprob, batch int, now time.Time) {
	q.emitted++
	q.penalties.Add(t)
	if q.constraint != nil {
		// t was sampled under the mask, so only a mask that allowed no
		// token at all (then t is 0) can refuse it.
		if err := q.constraint.Accept(t); err != nil {
			s.log.Warn("grammar refused the sampled token", zap.String("request_id", q.id), zap.Int32("token", t), zap.Error(err))
		}
	}
	if !q.firstStamps {
		q.firstStamps = true
		q.out.stamp(StampFirstToken, now)
	}
	root := q
	if q.parent != nil {
		root = q.parent
	}
	if !root.out.token(q.index, t, lp, batch) {
		s.stalledLocked(root, reasonOutbox, status.Errorf(codes.ResourceExhausted,
			"decode: request %s: its caller does not read: over %d bytes of output wait to be sent", root.id, s.o.MaxOutboxBytes))
		return
	}
	switch {
	case s.eog[t] && !q.ignoreEOS, q.stop[t]:
		s.finishChoiceLocked(q, FinishStop)
	case q.emitted >= q.maxTokens:
		s.finishChoiceLocked(q, FinishLength)
	default:
		q.next = t
	}
}

// step runs b on the engine and hands out its tokens. The caller holds
// engMu, so no sequence of b ends during the step.
func (s *Server) step(ctx context.Context, b stepPlan) {
	start := s.now()
	pOut, dOut, err := engine.RunStep(ctx, s.eng, b.prefill, b.decode, nil)
	end := s.now()
	n := b.size()
	s.m.observeStep(end.Sub(start), n)
	if err == nil && (len(pOut) != len(b.prefill) || len(dOut) != len(b.decode)) {
		err = fmt.Errorf("decode: engine returned %d+%d outputs for %d+%d items", len(pOut), len(dOut), len(b.prefill), len(b.decode))
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps.Record(end.Sub(start), n)
	if err != nil {
		st := errStopped
		if ctx.Err() == nil {
			s.log.Error("decode step failed", zap.Int("prefill_items", len(b.prefill)), zap.Int("decode_items", len(b.decode)), zap.Error(err))
			st = status.Errorf(codes.Internal, "decode: step failed: %v", err)
		}
		for _, q := range append(slices.Clone(b.pq), b.dq...) {
			s.endLocked(q, "", st)
		}
		return
	}
	for i, q := range b.pq {
		if q.done || q.choiceDone {
			continue
		}
		root := q.parent == nil
		if !q.prefilling {
			q.prefilling = true
			if q.local && root {
				q.out.stamp(StampPrefillStart, start)
			}
		}
		k := len(b.prefill[i].Tokens)
		if b.prefill[i].AllLogits {
			s.addPromptLogprobs(q, pOut[i].AllLogits, k)
		}
		q.filled += k
		q.pending = q.pending[k:]
		if len(q.pending) > 0 {
			continue
		}
		if q.local && root {
			q.out.stamp(StampPrefillEnd, end)
			if err := s.forkLocked(q); err != nil {
				s.log.Error("fork choices", zap.String("request_id", q.id), zap.Error(err))
				s.endLocked(q, "", status.Error(codes.Internal, err.Error()))
				continue
			}
		}
		if q.promptLPs != nil {
			q.out.promptLogprobs(q.promptLPs)
			q.promptLPs = nil
		}
		if q.sampleLast {
			s.emitLocked(q, pOut[i].Token, s.logprob(q, pOut[i]), n, end)
		}
	}
	for i, q := range b.dq {
		if !q.done && !q.choiceDone {
			s.emitLocked(q, dOut[i].Token, s.logprob(q, dOut[i]), n, end)
		}
	}
}
