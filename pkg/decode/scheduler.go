package decode

import (
	"context"
	"errors"
	"fmt"
	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/prefixcache"
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
// methods run in the runner's goroutine, which holds the engine lock
// across each Plan, step and Done and across Shutdown. They take
// Server.rn.mu for the batch and the sequences' sched. They take
// Server.mu in two places only: handOff, at the end of every Plan and
// every Done, and then only when a request ended in the runner or a
// sequence went into the prefix cache since the last hand-off (it
// releases rn.mu first, so the runner never holds rn.mu while it waits
// for Server.mu); and Shutdown, which holds Server.mu throughout and takes
// rn.mu inside it.
type batcher struct{ s *Server }

var _ runner.Policy[*sequence] = batcher{}

// runState is the runner's: the batch, the sequences waiting to join it,
// every sequence's sched, and the hand-offs between the runner and the
// service. mu guards them. It is taken after Server.mu (the service hands
// over a sequence ready to join, readyLocked, reclaimed prefix cache
// entries, and the end of a request, drop, holding mu) and before
// Server.rx.mu; the runner never holds it while it takes Server.mu.
type runState struct {
	mu      sync.Mutex
	waiting []*sequence // ready to join the batch, in order of readiness
	active  []*sequence // in the batch, in order of joining
	nextSeq engine.SeqID
	// reclaimed are the engine sequences of prefix cache entries the
	// service reclaimed (allocateLocked, chargeCacheLocked), which the
	// runner frees before its next step's imports (freeReclaimed).
	reclaimed []engine.SeqID
	// ended are the requests that ended in the runner (finished, failed,
	// or their caller stopped reading): their engine sequences and batch
	// slots are freed, and the service frees the rest at the runner's next
	// hand-off (handOff), within the same hold of the engine lock. kept:
	// a sequence went into the prefix cache since the last hand-off; the
	// service settles the cache's pool charge then.
	ended []ended
	kept  bool
}

// ended is a request the runner ended, for the service to end with reason
// or err; stall is the reason its caller stopped reading ("": it did not).
type ended struct {
	q      *sequence
	reason string
	err    error
	stall  string
}

// Shutdown ends every request.
func (pl batcher) Shutdown() {
	s := pl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for _, q := range s.seqs {
		s.endLocked(q, "", errStopped)
	}
	s.rn.mu.Lock()
	x := append(s.cache.Drain(), s.rn.reclaimed...)
	s.rn.reclaimed = nil
	s.rn.mu.Unlock()
	for _, x := range x {
		s.eng.Free(x)
	}
	s.chargeCacheLocked()
}

// Plan frees the engine sequences of reclaimed prefix cache entries,
// imports the KV of the sequences that join now, admits waiting sequences
// while the batch has room and picks the step's items, then hands the
// requests that ended meanwhile (a failed import, a first token that
// finishes its request) to the service.
func (pl batcher) Plan() runner.Batch[*sequence] {
	pl.freeReclaimed()
	pl.importJoining()
	pl.waitGrammars()
	b := pl.plan()
	pl.handOff()
	return b
}

// handOff hands the requests that ended in the runner since the last
// hand-off to the service, which frees their blocks, caller charge and
// cache pin and ends their calls (endLocked), and settles the prefix
// cache's pool charge after sequences went into the cache, once their
// requests' blocks went back. The caller holds the engine lock (so a
// Cancel of such a request waits for it: end), not rn.mu nor mu.
func (pl batcher) handOff() {
	s := pl.s
	s.rn.mu.Lock()
	es, kept := s.rn.ended, s.rn.kept
	s.rn.ended, s.rn.kept = nil, false
	s.rn.mu.Unlock()
	if len(es) == 0 && !kept {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range es {
		if e.q.done {
			continue
		}
		s.endLocked(e.q, e.reason, e.err)
		if e.stall != "" {
			s.countStalled(e.q, e.stall)
		}
	}
	if kept {
		s.chargeCacheLocked()
	}
}

// endLocked ends q's request in the runner with reason or err: it frees
// its choices' engine sequences (the root's goes into the prefix cache
// when the request finished or was cancelled) and batch slots, and
// queues the rest for the service (handOff). stall is the reason its
// caller stopped reading, or "". Idempotent. The caller holds the engine
// lock and rn.mu.
func (pl batcher) endLocked(q *sequence, reason string, err error, stall string) {
	s := pl.s
	q = q.root()
	if q.dropped {
		return
	}
	if s.dropLocked(q, err == nil || status.Code(err) == codes.Canceled) {
		s.rn.kept = true
	}
	s.rn.ended = append(s.rn.ended, ended{q: q, reason: reason, err: err, stall: stall})
}

// drop is dropLocked for the service, holding mu (and the engine lock
// when q holds an engine sequence), not rn.mu.
func (s *Server) drop(q *sequence, keep bool) (kept bool) {
	s.rn.mu.Lock()
	defer s.rn.mu.Unlock()
	return s.dropLocked(q, keep)
}

// dropIdle drops root q, as drop does, when it holds no engine sequence
// and the runner has not ended it, and reports whether it did: then the
// service may end q without the engine lock. Otherwise q is in the batch,
// its KV is being imported, or its end is being handed over: the service
// takes the engine lock to end it. In one critical section of rn.mu, so
// the runner cannot start q meanwhile.
func (s *Server) dropIdle(q *sequence) bool {
	s.rn.mu.Lock()
	defer s.rn.mu.Unlock()
	if q.dropped || q.holdsEngine() {
		return false
	}
	s.dropLocked(q, false)
	return true
}

// dropLocked frees what the runner holds of root q: each choice's engine
// sequence (with keep, the root's goes into the prefix cache) and batch
// slot, its place in waiting, and the cache pin handed to it. It reports
// whether a sequence went into the cache. Idempotent. The caller holds
// rn.mu, and the engine lock when q holds an engine sequence.
func (s *Server) dropLocked(q *sequence, keep bool) (kept bool) {
	if q.dropped {
		return false
	}
	q.dropped = true
	for _, st := range q.forkStates {
		closeGrammar(st)
	}
	q.forkStates = nil
	for _, c := range append([]*sequence{q}, q.children...) {
		if s.dropChoiceLocked(c, keep) {
			kept = true
		}
	}
	if q.queued {
		s.rn.waiting = slices.DeleteFunc(s.rn.waiting, func(x *sequence) bool { return x == q })
		q.queued = false
	}
	s.cache.Release(q.pin)
	q.pin = prefixcache.Hit{}
	return kept
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

// dropChoiceLocked frees choice c's engine sequence, or, with keep for
// a root whose prompt KV is complete, hands it to the prefix cache, and
// takes it out of the batch. It reports whether the sequence went into
// the cache (the service settles the cache's pool charge). The caller
// holds rn.mu, and the engine lock when c.hasSeq.
func (s *Server) dropChoiceLocked(c *sequence, keep bool) (kept bool) {
	closeGrammar(c.constraint)
	c.constraint, c.sampling.Constraint = nil, nil
	if c.hasSeq {
		if keep && c.parent == nil {
			kept = s.keepLocked(c)
		} else {
			s.eng.Free(c.seq)
		}
		c.hasSeq = false
	}
	if c.joined {
		s.rn.active = slices.DeleteFunc(s.rn.active, func(x *sequence) bool { return x == c })
		c.joined = false
	}
	return kept
}

// keepLocked makes root q's engine sequence a prefix cache entry holding
// its prompt's full blocks, forking them out when the sequence holds more
// (output tokens, a partial block), and frees what the cache lets go of;
// without a cache, or before the prompt's blocks are all computed, it
// frees the sequence. It reports whether it inserted an entry: its pool
// charge is the service's to settle (chargeCacheLocked). The caller holds
// the engine lock and rn.mu.
func (s *Server) keepLocked(q *sequence) bool {
	k := len(q.hashes) * s.o.BlockTokens
	n, err := s.eng.Len(q.seq)
	if s.cache == nil || k == 0 || err != nil || n < k || k > s.o.PrefixCache.MaxTokens || s.cache.Match(q.hashes) == len(q.hashes) {
		// Nothing to keep, or nothing the cache would keep (too large, or
		// an entry holds every block already): no fork to throw away.
		s.eng.Free(q.seq)
		return false
	}
	seq := q.seq
	if n > k {
		s.rn.nextSeq++
		seq = s.rn.nextSeq
		err := s.eng.(engine.Forker).Fork(q.seq, seq, k)
		s.eng.Free(q.seq)
		if err != nil {
			s.log.Warn("prefix cache: fork of a finished prompt failed", zap.String("request_id", q.id), zap.Error(err))
			return false
		}
	}
	s.freeCachedLocked(s.cache.Insert(seq, q.hashes, k))
	return true
}

// freeCachedLocked frees engine sequences the prefix cache let go of,
// those it evicted copied into its host tier first (a failed copy is
// logged). The caller holds the engine lock.
func (s *Server) freeCachedLocked(seqs []engine.SeqID) {
	if err := s.cache.Free(s.eng, seqs); err != nil {
		s.log.Warn("prefix cache: copy to the host tier failed", zap.Error(err))
	}
}

// plan admits waiting sequences while the batch has room (remote ones once
// importJoining imported their KV) and picks the step's items. The caller
// holds the engine lock.
func (pl batcher) plan() runner.Batch[*sequence] {
	s := pl.s
	s.rn.mu.Lock()
	defer s.rn.mu.Unlock()
	now := s.now()
	for len(s.rn.waiting) > 0 && s.slotsLocked()+s.rn.waiting[0].n <= s.o.MaxBatch {
		q := s.rn.waiting[0]
		if s.rx.hasStaged(q) {
			// Its KV is not in the engine yet: importJoining brings it
			// in at the next step boundary.
			s.sig.Wake()
			break
		}
		s.rn.waiting = slices.Delete(s.rn.waiting, 0, 1)
		q.queued = false
		pl.joinLocked(q, now)
	}
	var b runner.Batch[*sequence]
	var pre []*sequence
	var pending []int
	for _, q := range s.rn.active {
		if len(q.pending) == 0 {
			if !grammarReady(q.constraint) {
				continue // it sits this step out (grammargate.go)
			}
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
// choices its requests will fork. The caller holds rn.mu.
func (s *Server) slotsLocked() int {
	n := len(s.rn.active)
	for _, q := range s.rn.active {
		if q.parent == nil && !q.forked {
			n += q.n - 1
		}
	}
	return n
}

// forkLocked starts choices 1..n-1 of root q from its prompt's KV: each
// forks the KV of the prompt but its last token, which it then computes
// itself to sample its own first token (or, after a recovery, to replay
// its generated tokens). The caller holds the engine lock and rn.mu.
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
		if len(q.forkStates) > 0 {
			// Built when the request arrived (Server.constrain).
			c.constraint, c.sampling.Constraint = q.forkStates[0], q.forkStates[0]
			q.forkStates = q.forkStates[1:]
		}
		s.rn.nextSeq++
		if err := f.Fork(q.seq, s.rn.nextSeq, p-1); err != nil {
			closeGrammar(c.constraint)
			return fmt.Errorf("decode: fork choice %d of %s: %w", i, q.id, err)
		}
		c.seq, c.hasSeq = s.rn.nextSeq, true
		c.pending = []int32{q.prompt[p-1]}
		if m := len(gen); m > 0 {
			c.pending = append(c.pending, gen[:m-1]...)
			c.next = gen[m-1]
		}
		c.sampleLast = len(gen) == 0
		c.joined = true
		q.children = append(q.children, c)
		s.rn.active = append(s.rn.active, c)
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
// decode input. The caller holds the engine lock and rn.mu.
func (pl batcher) joinLocked(q *sequence, now time.Time) {
	s := pl.s
	q.joined = true
	s.rn.active = append(s.rn.active, q)
	m := len(q.generated)
	q.emitted = m
	var regen []int32
	var kv arrived // the transfer's, remote KV only
	if m > 1 {
		regen = q.generated[:m-1]
	}
	if q.local {
		s.rn.nextSeq++
		q.seq, q.hasSeq = s.rn.nextSeq, true
		hit := pl.forkCachedLocked(q)
		if hit > 0 && q.out != nil {
			q.out.prefixHit(hit, q.host, q.peer)
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
			pl.endLocked(q, "", status.Error(codes.Internal, err.Error()), "")
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
		pl.emitLocked(q, kv.first, lp, len(s.rn.active), now)
	}
}

// forkCachedLocked starts local-prefill q's new engine sequence from the
// longest cached prefix of its prompt: imported from the prefix pulled
// from a peer (q.pulled) when that is longer than any tier here holds
// now, else forked from the engine tier or loaded from the host tier
// when that holds more; it returns its tokens (0: a miss, a request
// asking for prompt logprobs, which needs every prompt position
// computed, or a failed fork, load or import, logged). The caller holds
// the engine lock and rn.mu.
func (pl batcher) forkCachedLocked(q *sequence) int {
	s := pl.s
	pulled, disk := q.pulled, q.disk
	q.pulled, q.disk = nil, nil // imported or not, their bytes are not needed any more
	if s.cache == nil || q.promptTop >= 0 {
		return 0
	}
	maxHit := s.cache.MaxHitBlocks(len(q.prompt))
	if pulled != nil && min(pulled.Tokens/s.cache.BlockTokens(), maxHit) > s.cache.PeerDepth(q.hashes, maxHit) {
		// What the peer sent is more than any tier here holds now.
		n, took, err := s.cache.LoadPulled(s.eng, q.seq, pulled, maxHit)
		if err != nil {
			s.log.Warn("import of a prefix pulled from a peer failed; prefilling the whole prompt", zap.String("request_id", q.id), zap.Error(err))
			s.eng.Free(q.seq)
			return 0
		}
		q.peer = peerLoad{tokens: n, took: took}
		return n
	}
	if s.cache.HostDeeper(q.hashes, maxHit, disk) {
		ld, err := s.cache.Host().Load(s.eng, q.seq, q.hashes, maxHit, disk)
		if err != nil {
			s.log.Warn("prefix cache host-tier load failed; prefilling the whole prompt", zap.String("request_id", q.id), zap.Error(err))
			s.eng.Free(q.seq)
			return 0
		}
		q.host = ld
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

// observePrefill adds step b, which took d, to the local-prefill
// throughput peer pulls are priced against (kvtransfer.PullPricer): the
// prompt tokens it computed over its whole time, decode tokens and all,
// which is the rate at which this worker computes a prompt beside its
// batch. Only steps that prefill a local prompt count (a choice's fork or
// a recovery's replay alone computes too few tokens to measure).
func (pl batcher) observePrefill(b runner.Batch[*sequence], d time.Duration) {
	computed, local := 0, false
	for i, it := range b.Prefill {
		computed += len(it.Tokens)
		if q := b.PrefillOf[i]; q.local && q.parent == nil {
			local = true
		}
	}
	if local {
		pl.s.peers.ObserveStep(computed, d)
	}
}

// emitLocked streams token t of q, produced in a step of batch sequences,
// and ends q when t finishes it. Otherwise t is q's next decode input. The
// caller holds the engine lock and rn.mu.
func (pl batcher) emitLocked(q *sequence, t int32, lp *pdservev1.TokenLogprob, batch int, now time.Time) {
	s := pl.s
	if q.constraint != nil {
		// t was sampled under the mask, so only a mask that allowed no
		// token at all (the engine then picks token 0) can refuse it:
		// the grammar cannot go on. The request ends with an error, and
		// t is never sent.
		if err := q.constraint.Accept(t); err != nil {
			s.log.Warn("grammar allows no token; ending the request", zap.String("request_id", q.id), zap.Int("choice", q.index), zap.Int32("token", t), zap.Error(err))
			pl.endLocked(q.root(), "", grammarRefused(q.id, q.index, err), "")
			return
		}
	}
	q.emitted++
	q.penalties.Add(t)
	if !q.firstStamps {
		q.firstStamps = true
		q.out.stamp(StampFirstToken, now)
	}
	root := q.root()
	if !root.out.token(q.index, t, lp, batch) {
		pl.endLocked(root, "", status.Errorf(codes.ResourceExhausted,
			"decode: request %s: its caller does not read: over %d bytes of output wait to be sent", root.id, s.o.MaxOutboxBytes), reasonOutbox)
		return
	}
	switch {
	case s.eog[t] && !q.ignoreEOS, q.stop[t]:
		pl.finishChoiceLocked(q, FinishStop)
	case q.emitted >= q.maxTokens:
		pl.finishChoiceLocked(q, FinishLength)
	default:
		q.next = t
	}
}

// grammarRefused is the error of a request whose choice's grammar allows
// no token (cause: its state's refusal of the token sampled anyway):
// FAILED_PRECONDITION marked by wire.GrammarRefusedStatus, which the
// coordinator does not take for a worker's failure, and maps to HTTP 500.
func grammarRefused(id string, choice int, cause error) error {
	return wire.GrammarRefusedStatus("decode: request %s: choice %d: the grammar allows no token here (%v)", id, choice, cause)
}

// finishChoiceLocked ends choice c with reason and, once every choice of
// its request finished, the request. The caller holds the engine lock and
// rn.mu.
func (pl batcher) finishChoiceLocked(c *sequence, reason string) {
	s := pl.s
	root := c.root()
	if root.n <= 1 {
		pl.endLocked(root, reason, nil, "")
		return
	}
	c.choiceDone = true
	if s.dropChoiceLocked(c, true) {
		s.rn.kept = true
	}
	root.out.choiceDone(c.index, reason)
	if !root.forked || !root.choiceDone {
		return
	}
	for _, x := range root.children {
		if !x.choiceDone {
			return
		}
	}
	pl.endLocked(root, reason, nil, "")
}

// Done hands out a step's tokens, or its failure to every sequence in
// it, then hands the requests that ended to the service (handOff). The
// runner holds the engine lock, so the service ends no sequence of b
// during the step.
func (pl batcher) Done(ctx context.Context, b runner.Batch[*sequence], res runner.Result) {
	pl.handOut(ctx, b, res)
	pl.handOff()
}

// handOut is Done's part under rn.mu.
func (pl batcher) handOut(ctx context.Context, b runner.Batch[*sequence], res runner.Result) {
	s := pl.s
	start, end, n := res.Start, res.End, b.Size()
	pOut, dOut, err := res.Prefill, res.Decode, res.Err
	s.rn.mu.Lock()
	defer s.rn.mu.Unlock()
	if err != nil {
		st := errStopped
		if ctx.Err() == nil {
			s.log.Error("decode step failed", zap.Int("prefill_items", len(b.Prefill)), zap.Int("decode_items", len(b.Decode)), zap.Error(err))
			st = status.Errorf(codes.Internal, "decode: step failed: %v", err)
		}
		for _, q := range append(slices.Clone(b.PrefillOf), b.DecodeOf...) {
			pl.endLocked(q, "", st, "")
		}
		return
	}
	pl.observePrefill(b, end.Sub(start))
	for i, q := range b.PrefillOf {
		if q.over() {
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
				pl.endLocked(q, "", status.Error(codes.Internal, err.Error()), "")
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
		if !q.over() {
			pl.emitLocked(q, dOut[i].Token, pl.logprob(q, dOut[i]), n, end)
		}
	}
}
