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
	"github.com/pdserve/pdserve/pkg/runner"
	"github.com/pdserve/pdserve/pkg/wire"
)

// Run runs the continuous-batching scheduler (the runner under the
// batcher policy) until ctx ends or Stop is called, then ends every
// request with UNAVAILABLE and frees its engine sequence and blocks. It
// returns nil after a stop, or an error when Run was called twice.
func (s *Server) Run(ctx context.Context) error { return s.run.Run(ctx) }

// Stop ends Run; it does not wait.
func (s *Server) Stop() { s.stop() }

// batcher is the decode worker's runner.Policy, continuous batching:
// sequences join the batch at each step boundary while it has room (those
// whose KV arrived are imported then), every running sequence decodes one
// token a step, and local prefills take chunks of what is left. Its
// methods run in the runner's loop, which holds the engine lock; they
// take Server.mu for the requests' state.
type batcher struct{ s *Server }

var _ runner.Policy[*sequence] = batcher{}

// Shutdown ends every request.
func (pl batcher) Shutdown() {
	s := pl.s
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

// Plan frees the engine sequences of reclaimed prefix cache entries,
// imports the KV of the sequences that join now, admits waiting sequences
// while the batch has room and picks the step's items.
func (pl batcher) Plan() runner.Batch[*sequence] {
	pl.freeReclaimed()
	pl.importJoining()
	return pl.plan()
}

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
// holds the engine lock.
func (pl batcher) plan() runner.Batch[*sequence] {
	s := pl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for len(s.waiting) > 0 && s.slotsLocked()+s.waiting[0].n <= s.o.MaxBatch {
		q := s.waiting[0]
		if s.rx.hasStaged(q) {
			// Its KV is not in the engine yet: importJoining brings it
			// in at the next step boundary.
			s.sig.Wake()
			break
		}
		s.waiting = slices.Delete(s.waiting, 0, 1)
		q.queued = false
		pl.joinLocked(q, now)
	}
	var b runner.Batch[*sequence]
	var pre []*sequence
	var pending []int
	for _, q := range s.active {
		if len(q.pending) == 0 {
			b.Decode = append(b.Decode, engine.DecodeItem{Seq: q.seq, Token: q.next, Sampling: q.sampling})
			b.DecodeOf = append(b.DecodeOf, q)
			continue
		}
		pre = append(pre, q)
		pending = append(pending, len(q.pending))
	}
	for i, n := range chunkSizes(len(b.Decode), pending, s.o.MaxBatchTokens, s.o.ChunkTokens) {
		if n == 0 {
			continue
		}
		q := pre[i]
		b.Prefill = append(b.Prefill, engine.PrefillItem{
			Seq:       q.seq,
			Tokens:    q.pending[:n],
			Sampling:  q.sampling,
			Last:      q.sampleLast && n == len(q.pending),
			AllLogits: q.promptTop >= 0,
		})
		b.PrefillOf = append(b.PrefillOf, q)
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
// its generated tokens). The caller holds the engine lock and mu.
func (pl batcher) forkLocked(q *sequence) error {
	s := pl.s
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
			reservation: reservation{id: q.id},
			call: call{
				index: i, local: true, attached: true,
				prompt: q.prompt, maxTokens: q.maxTokens, ignoreEOS: q.ignoreEOS, stop: q.stop,
				out: q.out, top: q.top, promptTop: -1, generated: gen, sampling: q.sampling,
			},
			sched: sched{parent: q, emitted: len(gen), firstStamps: true},
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
func (pl batcher) logprob(q *sequence, o engine.Output) *pdservev1.TokenLogprob {
	s := pl.s
	if q.top < 0 {
		return nil
	}
	return wire.TokenLogprob(wire.OutputLogprob(o.Logits, o.Token, len(q.prompt)+q.emitted, q.top, s.spec.Vocab))
}

// addPromptLogprobs appends the log-probabilities of the prompt tokens
// that follow the n chunk tokens q just prefilled, from the chunk's rows
// of logits (nil: the engine computes none; stand-ins then).
func (pl batcher) addPromptLogprobs(q *sequence, rows []float32, n int) {
	s := pl.s
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
func (pl batcher) joinLocked(q *sequence, now time.Time) {
	s := pl.s
	q.joined = true
	s.active = append(s.active, q)
	m := len(q.generated)
	q.emitted = m
	var regen []int32
	var kv arrived // the transfer's, remote KV only
	if m > 1 {
		regen = q.generated[:m-1]
	}
	if q.local {
		s.nextSeq++
		q.seq, q.hasSeq = s.nextSeq, true
		hit := pl.forkCachedLocked(q)
		if hit > 0 && q.out != nil {
			q.out.prefixHit(hit, q.hostHit, q.hostLoad)
		}
		q.pending = append(slices.Clone(q.prompt[hit:]), regen...)
		q.sampleLast = m == 0
	} else {
		kv = s.rx.arrival(q)
		q.pending = slices.Clone(regen)
		q.out.stamp(StampKVFirstByte, kv.firstByte)
		q.out.stamp(StampKVDone, kv.kvDone)
		if m > 0 && q.generated[0] != kv.first {
			s.log.Warn("recovered request's first token differs from the prefill worker's",
				zap.String("request_id", q.id), zap.Int32("generated", q.generated[0]), zap.Int32("prefill", kv.first))
		}
	}
	q.out.stamp(StampJoined, now)
	if !q.local {
		// The prompt's KV is in the engine: the other choices start.
		if err := pl.forkLocked(q); err != nil {
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
			lp = kv.firstLP
			if lp == nil {
				lp = &pdservev1.TokenLogprob{Token: kv.first}
			}
		}
		pl.emitLocked(q, kv.first, lp, len(s.active), now)
	}
}

// forkCachedLocked starts local-prefill q's new engine sequence from the
// longest cached prefix of its prompt, forked from the engine tier or
// loaded from the host tier when that holds more, and returns its tokens
// (0: a miss, a request asking for prompt logprobs, which needs every
// prompt position computed, or a failed fork or load, logged). The caller
// holds the engine lock and mu.
func (pl batcher) forkCachedLocked(q *sequence) int {
	s := pl.s
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
func (pl batcher) emitLocked(q *sequence, t int32, lp *pdservev1.TokenLogprob, batch int, now time.Time) {
	s := pl.s
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

// Done hands out a step's tokens, or its failure to every sequence in
// it. The runner holds the engine lock, so no sequence of b ends during
// the step.
func (pl batcher) Done(ctx context.Context, b runner.Batch[*sequence], res runner.Result) {
	s := pl.s
	start, end, n := res.Start, res.End, b.Size()
	pOut, dOut, err := res.Prefill, res.Decode, res.Err
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		st := errStopped
		if ctx.Err() == nil {
			s.log.Error("decode step failed", zap.Int("prefill_items", len(b.Prefill)), zap.Int("decode_items", len(b.Decode)), zap.Error(err))
			st = status.Errorf(codes.Internal, "decode: step failed: %v", err)
		}
		for _, q := range append(slices.Clone(b.PrefillOf), b.DecodeOf...) {
			s.endLocked(q, "", st)
		}
		return
	}
	for i, q := range b.PrefillOf {
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
		k := len(b.Prefill[i].Tokens)
		if b.Prefill[i].AllLogits {
			pl.addPromptLogprobs(q, pOut[i].AllLogits, k)
		}
		q.filled += k
		q.pending = q.pending[k:]
		if len(q.pending) > 0 {
			continue
		}
		if q.local && root {
			q.out.stamp(StampPrefillEnd, end)
			if err := pl.forkLocked(q); err != nil {
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
			pl.emitLocked(q, pOut[i].Token, pl.logprob(q, pOut[i]), n, end)
		}
	}
	for i, q := range b.DecodeOf {
		if !q.done && !q.choiceDone {
			pl.emitLocked(q, dOut[i].Token, pl.logprob(q, dOut[i]), n, end)
		}
	}
}
