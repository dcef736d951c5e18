package batch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/runner"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// seq is one choice of a request in the batch. A request's first choice
// (index 0, the root) holds what came with its Join; the others
// (children) are forked from its prompt KV once that is in the engine
// and hold only their engine sequence. Only roots are in joins and
// waiting; children are in active. Owned by the loop goroutine.
type seq struct {
	key       uint64
	id        string
	index     int
	n         int // choices (root)
	local     bool
	prompt    []int32
	sampling  engine.Sampling
	maxTokens int
	ignoreEOS bool
	stop      map[int32]bool
	generated []int32   // tokens streamed before a recovery
	genChoice [][]int32 // choices 1..n-1's (root)
	top       int       // alternatives per output token; -1: no logprobs
	promptTop int       // alternatives per prompt token (root, local prefill); -1: none
	hashes    []kv.Hash
	out       Outbox

	eseq   engine.SeqID
	hasSeq bool // the engine may hold eseq: Free it at the end
	// pin is the remote KV's cached prefix (Request.Pin), until the
	// import or the end; kv the KV that arrived, until imported.
	pin prefixcache.Hit
	kv  *KV
	// started: the request joined; its footprint need is counted in
	// Batch.liveTokens.
	started bool
	need    int
	// dropped: the request ended here (root).
	dropped bool

	host   prefixcache.HostLoad
	pulled *prefixcache.Pulled
	peer   PeerLoad
	disk   *prefixcache.DiskRead

	// source is the provenance of the prompt KV root q started from: ""
	// computed here (or pushed as computed), else the peer its prefix was
	// pulled from (directly, or through a cache entry of such a pull);
	// unverified is set when that pull, or the push's sender's pull, was
	// not checked: the sequence then serves q only and is never cached.
	source     string
	unverified bool

	parent     *seq
	children   []*seq
	forked     bool // the children were created (root)
	choiceDone bool // this choice finished; its engine sequence is freed

	promptLPs  []engine.TokenLogprob
	filled     int // tokens of pending already prefilled (for prompt logprobs)
	penalties  *engine.Penalties
	constraint engine.GrammarState
	forkStates []engine.GrammarState // choices 1..n-1's (root), until the fork takes them

	queued      bool           // in waiting
	prio        vocab.Priority // the request's (root)
	joined      bool           // in active
	pending     []int32        // tokens still to prefill
	sampleLast  bool           // the last pending chunk samples the first output token
	prefilling  bool           // a prefill chunk ran already
	next        int32          // next decode input, once pending is empty
	emitted     int            // output tokens so far, generated ones included
	tokens      []int32        // choice 0's output tokens so far, generated ones included (root of n 1)
	firstStamps bool           // "first_token" was stamped
}

func (q *seq) root() *seq {
	if q.parent != nil {
		return q.parent
	}
	return q
}

// prioOf returns root q's priority.
func prioOf(q *seq) vocab.Priority { return q.prio }

// over reports whether choice q produces no more tokens.
func (q *seq) over() bool { return q.choiceDone || q.root().dropped }

// policy is the Batch's runner.Policy; its methods run in the loop.
type policy struct{ b *Batch }

var _ runner.Policy[*seq] = policy{}

// Plan takes the messages posted since the last step, admits waiting
// requests while the batch and the engine's memory have room (importing
// their KV), and picks the step's items.
func (p policy) Plan() runner.Batch[*seq] {
	b := p.b
	b.drain()
	b.exportParked()
	b.waitGrammars()
	rb := b.plan()
	b.report()
	return rb
}

// Done hands out a step's tokens, or its failure.
func (p policy) Done(ctx context.Context, rb runner.Batch[*seq], res runner.Result) {
	b := p.b
	b.handOut(ctx, rb, res)
	b.report()
}

// Shutdown ends every request and frees the engine's sequences, the
// prefix cache's included unless HandOver asked for them.
func (p policy) Shutdown() {
	b := p.b
	b.drain()
	if b.cfg.Stop != nil {
		b.cfg.Stop()
	}
	b.drain()
	for _, q := range b.joins {
		b.end(q, End{Kind: Stopped}, false)
	}
	b.exportParked() // each answers ErrNotRunning now
	if b.handTo != nil {
		// The next role's batch frees or keeps them.
		h := b.cfg.Cache.Handover()
		for _, e := range h.Entries {
			b.cachedTokens -= b.cached[e.Seq]
			delete(b.cached, e.Seq)
		}
		b.handTo <- h
	}
	b.freeCached(b.cfg.Cache.Drain())
	b.cacheChanged = true
	b.report()
	// What was posted while the service ended its requests: their KV.
	b.drain()
	for k, x := range b.arrived {
		x.free()
		delete(b.arrived, k)
	}
	b.report()
}

// report hands the ends to the service and publishes the load.
func (b *Batch) report() {
	ld := Load{Running: len(b.active), Waiting: len(b.waiting), EngineTokens: b.liveTokens + b.cachedTokens, EngineSeqs: b.liveSeqs + len(b.cached), Ended: b.endCount}
	for _, q := range b.active {
		ld.QueuedPrefillTokens += len(q.pending)
	}
	for _, q := range b.waiting {
		if q.local {
			ld.QueuedPrefillTokens += len(q.prompt) + max(len(q.generated)-1, 0)
		}
	}
	b.load.Store(&ld)
	b.posted.Add(-b.taken)
	b.taken = 0
	if len(b.ends) == 0 && !b.cacheChanged {
		return
	}
	es, changed := b.ends, b.cacheChanged
	b.ends, b.cacheChanged = nil, false
	if b.cfg.Report != nil {
		b.cfg.Report(es, changed)
	}
}

// drain takes the posted messages.
func (b *Batch) drain() {
	for _, m := range b.box.Take() {
		if m.readies() {
			b.taken++
		}
		switch {
		case m.join != nil:
			b.join(m.join)
		case m.kv != nil:
			if q := b.joins[m.key]; q != nil && !q.dropped && q.kv == nil && !q.local {
				q.kv = m.kv
				b.ready(q)
				continue
			}
			if old := b.arrived[m.key]; old != nil {
				old.free()
			}
			b.arrived[m.key] = m.kv
		case m.cancel:
			if x := b.arrived[m.key]; x != nil {
				x.free()
				delete(b.arrived, m.key)
			}
			if q := b.joins[m.key]; q != nil {
				b.end(q, End{Kind: Cancelled, Err: m.err}, m.keep)
			}
		case m.reclaim != nil:
			b.freeCached(m.reclaim)
		case m.export != nil && m.ready:
			b.park(m.key, m.export)
		case m.export != nil:
			b.export(m.key, m.export)
		case m.adopt != nil:
			b.adopt(*m.adopt)
		case m.handover != nil:
			b.handTo = m.handover
		}
	}
}

// join takes r in: it waits to start, for its KV first when it is remote.
func (b *Batch) join(r *Request) {
	q := &seq{
		key: r.Key, id: r.ID, n: max(r.N, 1), local: r.Local, prompt: r.Prompt, sampling: r.Sampling,
		maxTokens: r.MaxTokens, ignoreEOS: r.IgnoreEOS, stop: r.Stop, generated: r.Generated, genChoice: r.GenChoices,
		top: r.Top, promptTop: r.PromptTop, hashes: r.Hashes, out: r.Out, pin: r.Pin, pulled: r.Pulled, disk: r.Disk,
		constraint: r.Constraint, forkStates: r.ForkStates, prio: r.Priority,
	}
	q.penalties = newPenalties(r.Sampling.Penalties, q.generated)
	if q.n == 1 {
		q.tokens = slices.Clone(r.Generated)
	}
	q.sampling.Penalties = q.penalties
	q.sampling.Constraint = nil
	if q.constraint != nil {
		q.sampling.Constraint = q.constraint
	}
	b.joins[q.key] = q
	if r.KV != nil {
		if q.local {
			r.KV.free()
		} else {
			q.kv = r.KV
		}
	}
	if x := b.arrived[q.key]; x != nil {
		delete(b.arrived, q.key)
		if q.local || q.kv != nil {
			x.free()
		} else {
			q.kv = x
		}
	}
	b.ready(q)
}

// ready queues q to start when it has what it needs.
func (b *Batch) ready(q *seq) {
	if q.queued || q.joined || q.dropped || (!q.local && q.kv == nil) {
		return
	}
	q.queued = true
	b.waiting = append(b.waiting, q)
}

// end ends root q's request with e (unless it ended already): it frees
// its choices' engine sequences (the root's goes into the prefix cache
// with keep) and batch slots, its place in waiting, its pin and KV, and
// queues e for the service.
func (b *Batch) end(q *seq, e End, keep bool) {
	q = q.root()
	if q.dropped {
		return
	}
	b.drop(q, keep)
	e.Key, e.ID = q.key, q.id
	b.ends = append(b.ends, e)
	b.endCount++
}

// drop frees what the batch holds of root q. Idempotent.
func (b *Batch) drop(q *seq, keep bool) {
	if q.dropped {
		return
	}
	q.dropped = true
	for _, st := range q.forkStates {
		closeGrammar(st)
	}
	q.forkStates = nil
	for _, c := range append([]*seq{q}, q.children...) {
		b.dropChoice(c, keep)
	}
	if q.queued {
		b.waiting = slices.DeleteFunc(b.waiting, func(x *seq) bool { return x == q })
		q.queued = false
	}
	b.cfg.Cache.Release(q.pin)
	q.pin = prefixcache.Hit{}
	q.kv.free()
	q.kv, q.pulled, q.disk = nil, nil, nil
	if q.started {
		b.liveTokens -= q.need
		b.liveSeqs -= q.n
		q.started = false
	}
	delete(b.joins, q.key)
}

// dropChoice frees choice c's engine sequence, or, with keep for a root,
// hands it to the prefix cache, and takes it out of the batch.
func (b *Batch) dropChoice(c *seq, keep bool) {
	closeGrammar(c.constraint)
	c.constraint, c.sampling.Constraint = nil, nil
	if c.hasSeq {
		if keep && c.parent == nil {
			b.keep(c)
		} else {
			b.cfg.Engine.Free(c.eseq)
		}
		c.hasSeq = false
	}
	if c.joined {
		b.active = slices.DeleteFunc(b.active, func(x *seq) bool { return x == c })
		c.joined = false
	}
}

// keep makes root q's engine sequence a prefix cache entry holding its
// prompt's full blocks, forking them out when the sequence holds more;
// without a cache, before the prompt's blocks are all computed, or when
// the fork would not fit in the engine's memory beside what it holds
// now, it frees the sequence.
func (b *Batch) keep(q *seq) {
	c := b.cfg.Cache
	if q.unverified {
		// Pulled KV nobody checked: it served q only.
		c.NoteUnverified()
		b.cfg.Engine.Free(q.eseq)
		return
	}
	k := len(q.hashes) * c.BlockTokens()
	n, err := b.cfg.Engine.Len(q.eseq)
	if c == nil || k == 0 || err != nil || n < k || k > b.cfg.CacheMaxTokens || c.Match(q.hashes) == len(q.hashes) {
		b.cfg.Engine.Free(q.eseq)
		return
	}
	s := q.eseq
	if n > k {
		if !b.fits(k, 1) {
			b.cfg.Engine.Free(q.eseq)
			return
		}
		b.nextSeq++
		s = b.nextSeq
		err := b.cfg.Engine.(engine.Forker).Fork(q.eseq, s, k)
		b.cfg.Engine.Free(q.eseq)
		if err != nil {
			b.cfg.Log.Warn("prefix cache: fork of a finished prompt failed", zap.String("request_id", q.id), zap.Error(err))
			return
		}
	}
	b.cached[s] = k
	b.cachedTokens += k
	b.cacheChanged = true
	b.freeCached(c.InsertFrom(s, q.hashes, k, q.source))
}

// adopt takes h into the prefix cache and evicts from it what the
// engine's memory does not hold beside the live requests.
func (b *Batch) adopt(h prefixcache.Handover) {
	b.nextSeq = max(b.nextSeq, h.MaxSeq())
	for _, e := range h.Entries {
		b.cached[e.Seq] = e.Tokens
		b.cachedTokens += e.Tokens
	}
	b.freeCached(b.cfg.Cache.Adopt(h))
	b.room(0, 0)
	b.cacheChanged = true
	b.cfg.Log.Info("prefix cache handed over", zap.Int("entries", len(h.Entries)), zap.Int("kept", len(b.cached)))
}

// freeCached frees engine sequences the prefix cache let go of (those it
// evicted copied into its host tier first; a failed copy is logged).
func (b *Batch) freeCached(seqs []engine.SeqID) {
	for _, s := range seqs {
		if k, ok := b.cached[s]; ok {
			b.cachedTokens -= k
			delete(b.cached, s)
		}
	}
	if len(seqs) == 0 {
		return
	}
	if err := b.cfg.Cache.Free(b.cfg.Engine, seqs); err != nil {
		b.cfg.Log.Warn("prefix cache: copy to the host tier failed", zap.Error(err))
	}
}

// fits reports whether tokens and seqs more fit in the engine's memory
// beside the live requests and the cache's sequences now.
func (b *Batch) fits(tokens, seqs int) bool {
	t, s := b.cfg.MemTokens, b.cfg.MemSeqs
	return (t <= 0 || b.liveTokens+b.cachedTokens+tokens <= t) && (s <= 0 || b.liveSeqs+len(b.cached)+seqs <= s)
}

// footprint is the engine memory root q takes at most: each choice's
// sequence holds the prompt (forked, loaded, imported or computed) and
// its output.
func footprint(q *seq) int { return q.n * (len(q.prompt) + q.maxTokens) }

// makeRoom reports whether root q may start now: its footprint fits in
// the engine's memory beside the live requests and the prefix cache's
// sequences, once unpinned cache entries are evicted (least recently used
// first) as needed; or the engine holds nothing else (then the engine
// refuses what it cannot hold).
func (b *Batch) makeRoom(q *seq) bool { return b.room(footprint(q), q.n) }

// room is makeRoom for need tokens in n sequences.
func (b *Batch) room(need, n int) bool {
	for !b.fits(need, n) {
		var st, ss int
		if t := b.cfg.MemTokens; t > 0 {
			st = max(0, b.liveTokens+b.cachedTokens+need-t)
		}
		if s := b.cfg.MemSeqs; s > 0 {
			ss = max(0, b.liveSeqs+len(b.cached)+n-s)
		}
		x := b.cfg.Cache.Shrink(st, ss)
		if len(x) == 0 {
			// What is left is live, pinned (an import or a Reserve's
			// pin), or reclaimed by the service and not yet handed here
			// (Reclaimed wakes the loop): wait, unless the engine holds
			// nothing else.
			return b.liveSeqs == 0 && len(b.cached) == 0
		}
		b.cacheChanged = true
		b.freeCached(x)
	}
	return true
}

// plan admits waiting requests in priority order (batching.Next: in
// order of readiness, but for interactive ones going ahead of older
// batch ones at most Config.Overtakes times in a row) while the batch and
// the engine's memory have room: when the next one does not fit, every
// one waits. Then it picks the step's items.
func (b *Batch) plan() runner.Batch[*seq] {
	now := b.cfg.Now()
	for len(b.waiting) > 0 {
		i := batching.Next(&b.order, b.waiting, prioOf)
		q := b.waiting[i]
		if b.slots()+q.n > b.cfg.MaxBatch || !b.makeRoom(q) {
			break
		}
		batching.Started(&b.order, b.waiting, i, prioOf)
		b.waiting = slices.Delete(b.waiting, i, i+1)
		q.queued = false
		q.started, q.need = true, footprint(q)
		b.liveTokens += q.need
		b.liveSeqs += q.n
		b.start(q, now)
	}
	var rb runner.Batch[*seq]
	var pre []*seq
	var pending []int
	for _, q := range b.active {
		if len(q.pending) == 0 {
			if !grammarReady(q.constraint) {
				continue // it sits this step out (grammargate.go)
			}
			rb.Decode = append(rb.Decode, engine.DecodeItem{Seq: q.eseq, Token: q.next, Sampling: q.sampling})
			rb.DecodeOf = append(rb.DecodeOf, q)
			continue
		}
		pre = append(pre, q)
		pending = append(pending, len(q.pending))
	}
	for i, n := range chunkSizes(len(rb.Decode), pending, b.cfg.MaxBatchTokens, b.cfg.ChunkTokens) {
		if n == 0 {
			continue
		}
		q := pre[i]
		rb.Prefill = append(rb.Prefill, engine.PrefillItem{
			Seq:       q.eseq,
			Tokens:    q.pending[:n],
			Sampling:  q.sampling,
			Last:      q.sampleLast && n == len(q.pending),
			AllLogits: q.promptTop >= 0,
		})
		rb.PrefillOf = append(rb.PrefillOf, q)
	}
	return rb
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

// slots is the batch's occupancy: the sequences in it and the choices its
// requests will fork.
func (b *Batch) slots() int {
	n := len(b.active)
	for _, q := range b.active {
		if q.parent == nil && !q.forked {
			n += q.n - 1
		}
	}
	return n
}

// start puts root q in the batch: a local prefill gets its engine
// sequence (from the longest cached prefix) and pending prompt; remote KV
// is imported and its first token streamed now; a recovery re-prefills
// the tokens generated before, but the last, which is the next decode
// input.
func (b *Batch) start(q *seq, now time.Time) {
	m := len(q.generated)
	q.emitted = m
	var regen []int32
	if m > 1 {
		regen = q.generated[:m-1]
	}
	b.nextSeq++
	q.eseq, q.hasSeq = b.nextSeq, true
	var x *KV
	if q.local {
		hit := b.forkCached(q)
		if hit > 0 && q.out != nil {
			q.out.PrefixHit(hit, q.host, q.peer)
		}
		q.pending = append(slices.Clone(q.prompt[hit:]), regen...)
		q.sampleLast = m == 0
	} else {
		x = q.kv
		q.kv = nil
		// The KV holds the prompt and, after a migration, generated
		// tokens but the last: only the rest is computed.
		extra := x.Tokens - len(q.prompt)
		var err error
		if extra < 0 || extra > len(regen) {
			err = fmt.Errorf("decode: kv of %s holds %d tokens, want %d to %d (prompt and generated tokens but the last)", q.id, x.Tokens, len(q.prompt), len(q.prompt)+len(regen))
		} else {
			regen = regen[extra:]
			err = b.importKV(q, x)
		}
		x.free()
		b.cfg.Cache.Release(q.pin)
		q.pin = prefixcache.Hit{}
		if err != nil {
			b.cfg.Log.Error("import staged kv", zap.String("request_id", q.id), zap.Error(err))
			b.end(q, End{Kind: Failed, Err: err}, false)
			return
		}
		q.pending = slices.Clone(regen)
		q.out.Stamp(StampKVFirstByte, x.FirstByte)
		q.out.Stamp(StampKVDone, x.Done)
		if m > 0 && q.generated[0] != x.First {
			b.cfg.Log.Warn("recovered request's first token differs from the prefill worker's",
				zap.String("request_id", q.id), zap.Int32("generated", q.generated[0]), zap.Int32("prefill", x.First))
		}
	}
	q.joined = true
	b.active = append(b.active, q)
	q.out.Stamp(StampJoined, now)
	if !q.local {
		// The prompt's KV is in the engine: the other choices start.
		if err := b.fork(q); err != nil {
			b.cfg.Log.Error("fork choices", zap.String("request_id", q.id), zap.Error(err))
			b.end(q, End{Kind: Failed, Err: err}, false)
			return
		}
	}
	switch {
	case m > 0:
		q.next = q.generated[m-1]
	case !q.local:
		var lp *engine.TokenLogprob
		if q.top >= 0 {
			// The prefill worker sampled it and sent its log-probability
			// with the commit.
			lp = x.FirstLP
			if lp == nil {
				lp = &engine.TokenLogprob{Token: x.First}
			}
		}
		b.emit(q, x.First, lp, len(b.active), now)
	}
}

// importKV imports x into q's new engine sequence, frame by frame, after
// forking the x.Start tokens before it from q's pinned prefix.
func (b *Batch) importKV(q *seq, x *KV) error {
	eng := b.cfg.Engine
	q.unverified = x.Unverified
	if x.Start > 0 {
		q.source = q.pin.Source
		if q.pin.Tokens < x.Start {
			return fmt.Errorf("decode: kv of %s starts at token %d, the cached prefix holds %d", q.id, x.Start, q.pin.Tokens)
		}
		if err := eng.(engine.Forker).Fork(q.pin.Seq, q.eseq, x.Start); err != nil {
			return fmt.Errorf("decode: fork the cached prefix of %s: %w", q.id, err)
		}
	}
	tb := b.cfg.TokenBytes
	for l, data := range x.Layers {
		start, off := x.Start, x.Start
		for _, end := range x.Ends[l] {
			if err := eng.ImportKV(q.eseq, l, start, data[(start-off)*tb:(end-off)*tb]); err != nil {
				return fmt.Errorf("decode: import kv of %s layer %d [%d, %d): %w", q.id, l, start, end, err)
			}
			start = end
		}
	}
	if n, err := eng.Len(q.eseq); err != nil || n != x.Tokens {
		return fmt.Errorf("decode: kv of %s holds %d tokens after the import, want %d (%v)", q.id, n, x.Tokens, err)
	}
	return nil
}

// forkCached starts local-prefill q's new engine sequence from the
// longest cached prefix of its prompt: imported from the prefix pulled
// from a peer (q.pulled) when that is longer than any tier here holds
// now, else forked from the engine tier or loaded from the host tier
// when that holds more; it returns its tokens (0: a miss, a request
// asking for prompt logprobs, which needs every prompt position
// computed, or a failed fork, load or import, logged).
func (b *Batch) forkCached(q *seq) int {
	c, eng := b.cfg.Cache, b.cfg.Engine
	pulled, disk := q.pulled, q.disk
	q.pulled, q.disk = nil, nil // imported or not, their bytes are not needed any more
	if c == nil || q.promptTop >= 0 {
		return 0
	}
	maxHit := c.MaxHitBlocks(len(q.prompt))
	if pulled != nil && min(pulled.Tokens/c.BlockTokens(), maxHit) > c.PeerDepth(q.hashes, maxHit) {
		// What the peer sent is more than any tier here holds now.
		n, took, err := c.LoadPulled(eng, q.eseq, pulled, maxHit)
		if err != nil {
			b.cfg.Log.Warn("import of a prefix pulled from a peer failed; prefilling the whole prompt", zap.String("request_id", q.id), zap.Error(err))
			eng.Free(q.eseq)
			return 0
		}
		q.peer = PeerLoad{Tokens: n, Took: took}
		q.source, q.unverified = pulled.Source, !pulled.Verified
		return n
	}
	if c.HostDeeper(q.hashes, maxHit, disk) {
		ld, err := c.Host().Load(eng, q.eseq, q.hashes, maxHit, disk)
		if err != nil {
			b.cfg.Log.Warn("prefix cache host-tier load failed; prefilling the whole prompt", zap.String("request_id", q.id), zap.Error(err))
			eng.Free(q.eseq)
			return 0
		}
		q.host = ld
		q.source = ld.Source
		return ld.Tokens
	}
	hit := c.Acquire(q.hashes, maxHit)
	defer c.Release(hit)
	if hit.Tokens == 0 {
		return 0
	}
	if err := eng.(engine.Forker).Fork(hit.Seq, q.eseq, hit.Tokens); err != nil {
		b.cfg.Log.Warn("prefix cache fork failed; prefilling the whole prompt", zap.String("request_id", q.id), zap.Error(err))
		eng.Free(q.eseq)
		return 0
	}
	q.source = hit.Source
	return hit.Tokens
}

// fork starts choices 1..n-1 of root q from its prompt's KV: each forks
// the KV of the prompt but its last token, which it then computes itself
// to sample its own first token (or, after a recovery, to replay its
// generated tokens).
func (b *Batch) fork(q *seq) error {
	q.forked = true
	if q.n <= 1 {
		return nil
	}
	f, ok := b.cfg.Engine.(engine.Forker)
	if !ok {
		return errors.New("decode: the engine cannot fork sequences")
	}
	p := len(q.prompt)
	for i := 1; i < q.n; i++ {
		var gen []int32
		if len(q.genChoice) > 0 {
			gen = q.genChoice[i-1]
		}
		c := &seq{
			key: q.key, id: q.id, index: i, local: true,
			prompt: q.prompt, maxTokens: q.maxTokens, ignoreEOS: q.ignoreEOS, stop: q.stop,
			out: q.out, top: q.top, promptTop: -1, generated: gen, sampling: q.sampling,
			parent: q, emitted: len(gen), firstStamps: true,
		}
		c.sampling.Seed = q.sampling.Seed + uint64(i)
		c.penalties = newPenalties(q.sampling.Penalties, gen)
		c.sampling.Penalties = c.penalties
		c.constraint, c.sampling.Constraint = nil, nil
		if len(q.forkStates) > 0 {
			c.constraint, c.sampling.Constraint = q.forkStates[0], q.forkStates[0]
			q.forkStates = q.forkStates[1:]
		}
		b.nextSeq++
		if err := f.Fork(q.eseq, b.nextSeq, p-1); err != nil {
			closeGrammar(c.constraint)
			return fmt.Errorf("decode: fork choice %d of %s: %w", i, q.id, err)
		}
		c.eseq, c.hasSeq = b.nextSeq, true
		c.pending = []int32{q.prompt[p-1]}
		if m := len(gen); m > 0 {
			c.pending = append(c.pending, gen[:m-1]...)
			c.next = gen[m-1]
		}
		c.sampleLast = len(gen) == 0
		c.joined = true
		q.children = append(q.children, c)
		b.active = append(b.active, c)
	}
	return nil
}

// logprob returns the log-probability of token t that o sampled for q,
// or nil when q asks for none.
func (b *Batch) logprob(q *seq, o engine.Output) *engine.TokenLogprob {
	if q.top < 0 {
		return nil
	}
	lp := outputLogprob(o.Logits, o.Token, len(q.prompt)+q.emitted, q.top, b.cfg.Engine.Spec().Vocab)
	return &lp
}

// outputLogprob is engine.Logprob of the raw logits, or
// engine.StandInLogprob when the engine computes none (sim).
func outputLogprob(logits []float32, token int32, pos, top, vocab int) engine.TokenLogprob {
	if logits == nil {
		return engine.StandInLogprob(token, pos, top, vocab)
	}
	return engine.Logprob(logits, token, top)
}

// addPromptLogprobs appends the log-probabilities of the prompt tokens
// that follow the n chunk tokens q just prefilled, from the chunk's rows
// of logits (nil: the engine computes none; stand-ins then).
func (b *Batch) addPromptLogprobs(q *seq, rows []float32, n int) {
	v := b.cfg.Engine.Spec().Vocab
	for j := range n {
		pos := q.filled + j + 1 // the prompt token row j predicts
		if pos >= len(q.prompt) {
			break
		}
		var row []float32
		if len(rows) >= (j+1)*v {
			row = rows[j*v : (j+1)*v]
		}
		q.promptLPs = append(q.promptLPs, outputLogprob(row, q.prompt[pos], pos, q.promptTop, v))
	}
}

// emit streams token t of q, produced in a step of batch sequences, and
// ends q when t finishes it. Otherwise t is q's next decode input.
func (b *Batch) emit(q *seq, t int32, lp *engine.TokenLogprob, batch int, now time.Time) {
	if q.constraint != nil {
		// t was sampled under the mask, so only a mask that allowed no
		// token at all (the engine then picks token 0) can refuse it:
		// the grammar cannot go on. The request ends with an error, and
		// t is never sent.
		if err := q.constraint.Accept(t); err != nil {
			b.cfg.Log.Warn("grammar allows no token; ending the request", zap.String("request_id", q.id), zap.Int("choice", q.index), zap.Int32("token", t), zap.Error(err))
			b.end(q, End{Kind: Refused, Err: err, Choice: q.index}, false)
			return
		}
	}
	q.emitted++
	q.penalties.Add(t)
	if q.parent == nil && q.n == 1 {
		q.tokens = append(q.tokens, t)
	}
	if !q.firstStamps {
		q.firstStamps = true
		q.out.Stamp(StampFirstToken, now)
	}
	if !q.out.Token(q.index, t, lp, batch) {
		b.end(q, End{Kind: Stalled}, false)
		return
	}
	switch {
	case b.cfg.EOG[t] && !q.ignoreEOS, q.stop[t]:
		b.finishChoice(q, FinishStop)
	case q.emitted >= q.maxTokens:
		b.finishChoice(q, FinishLength)
	default:
		q.next = t
	}
}

// finishChoice ends choice c with reason and, once every choice of its
// request finished, the request.
func (b *Batch) finishChoice(c *seq, reason string) {
	root := c.root()
	if root.n <= 1 {
		b.end(root, End{Kind: Finished, Reason: reason}, true)
		return
	}
	c.choiceDone = true
	b.dropChoice(c, true)
	root.out.ChoiceDone(c.index, reason)
	if !root.forked || !root.choiceDone {
		return
	}
	for _, x := range root.children {
		if !x.choiceDone {
			return
		}
	}
	b.end(root, End{Kind: Finished, Reason: reason}, true)
}

// handOut hands out a step's tokens, or its failure to every sequence in
// it.
func (b *Batch) handOut(ctx context.Context, rb runner.Batch[*seq], res runner.Result) {
	start, end, n := res.Start, res.End, rb.Size()
	pOut, dOut, err := res.Prefill, res.Decode, res.Err
	if err != nil {
		e := End{Kind: Stopped}
		if ctx.Err() == nil {
			b.cfg.Log.Error("decode step failed", zap.Int("prefill_items", len(rb.Prefill)), zap.Int("decode_items", len(rb.Decode)), zap.Error(err))
			e = End{Kind: Failed, Err: fmt.Errorf("decode: step failed: %w", err)}
		}
		for _, q := range append(slices.Clone(rb.PrefillOf), rb.DecodeOf...) {
			b.end(q, e, false)
		}
		return
	}
	b.observePrefill(rb, end.Sub(start))
	for i, q := range rb.PrefillOf {
		if q.over() {
			continue
		}
		root := q.parent == nil
		if !q.prefilling {
			q.prefilling = true
			if q.local && root {
				q.out.Stamp(StampPrefillStart, start)
			}
		}
		k := len(rb.Prefill[i].Tokens)
		if rb.Prefill[i].AllLogits {
			b.addPromptLogprobs(q, pOut[i].AllLogits, k)
		}
		q.filled += k
		q.pending = q.pending[k:]
		if len(q.pending) > 0 {
			continue
		}
		if q.local && root {
			q.out.Stamp(StampPrefillEnd, end)
			if err := b.fork(q); err != nil {
				b.cfg.Log.Error("fork choices", zap.String("request_id", q.id), zap.Error(err))
				b.end(q, End{Kind: Failed, Err: err}, false)
				continue
			}
		}
		if q.promptLPs != nil {
			q.out.PromptLogprobs(q.promptLPs)
			q.promptLPs = nil
		}
		if q.sampleLast {
			b.emit(q, pOut[i].Token, b.logprob(q, pOut[i]), n, end)
		}
	}
	for i, q := range rb.DecodeOf {
		if !q.over() {
			b.emit(q, dOut[i].Token, b.logprob(q, dOut[i]), n, end)
		}
	}
}

// observePrefill reports step rb, which took d, to Config.ObservePrefill
// when it prefilled a local prompt: the prompt tokens it computed over
// its whole time, which is the rate at which the worker computes a
// prompt beside its batch.
func (b *Batch) observePrefill(rb runner.Batch[*seq], d time.Duration) {
	if b.cfg.ObservePrefill == nil {
		return
	}
	computed, local := 0, false
	for i, it := range rb.Prefill {
		computed += len(it.Tokens)
		if q := rb.PrefillOf[i]; q.local && q.parent == nil {
			local = true
		}
	}
	if local {
		b.cfg.ObservePrefill(computed, d)
	}
}

// closeGrammar closes c when it is not nil.
func closeGrammar(c engine.GrammarState) {
	if c != nil {
		c.Close()
	}
}

// newPenalties returns penalty counts with the weights of w (nil: none)
// holding generated.
func newPenalties(w *engine.Penalties, generated []int32) *engine.Penalties {
	if w == nil {
		return nil
	}
	p := &engine.Penalties{Presence: w.Presence, Frequency: w.Frequency}
	p.Add(generated...)
	return p
}

// export answers Export for request key: its snapshot, then its end as
// Migrated; or why not.
func (b *Batch) export(key uint64, reply chan<- Exported) {
	q := b.joins[key]
	switch {
	case q == nil || q.dropped || !q.joined || len(q.pending) > 0:
		reply <- Exported{Err: fmt.Errorf("%w (request key %d)", ErrNotRunning, key)}
		return
	case q.n > 1 || q.emitted == 0 || len(q.tokens) != q.emitted:
		reply <- Exported{Err: fmt.Errorf("%w: %s has %d choices and %d tokens (want 1 choice, ≥ 1 token)", ErrNotMigratable, q.id, q.n, q.emitted)}
		return
	}
	x, err := b.exportKV(q)
	if err != nil {
		b.cfg.Log.Error("export kv for a migration", zap.String("request_id", q.id), zap.Error(err))
		b.end(q, End{Kind: Failed, Err: err}, false)
		reply <- Exported{Err: err}
		return
	}
	snap := &Snapshot{ID: q.id, Prompt: q.prompt, Tokens: slices.Clone(q.tokens), KV: x}
	reply <- Exported{Snap: snap}
	b.end(q, End{Kind: Migrated, Snap: snap}, true)
}

// movable reports whether root q can be exported now.
func movable(q *seq) bool {
	return q.joined && len(q.pending) == 0 && q.n == 1 && q.emitted > 0 && len(q.tokens) == q.emitted
}

// park answers ExportWhenReady for request key: at once when it is not
// in the batch, can never move (several choices) or can move now; else
// at the step boundary after it can (exportParked).
func (b *Batch) park(key uint64, reply chan<- Exported) {
	q := b.joins[key]
	if q == nil || q.dropped || q.n > 1 || movable(q) {
		b.export(key, reply)
		return
	}
	if old := b.parked[key]; old != nil {
		old <- Exported{Err: fmt.Errorf("%w (request key %d): asked again", ErrNotRunning, key)}
	}
	b.parked[key] = reply
}

// exportParked exports each parked request that can move now and
// answers ErrNotRunning for those that ended; the rest stay parked.
func (b *Batch) exportParked() {
	for key, reply := range b.parked {
		if q := b.joins[key]; q == nil || q.dropped || movable(q) {
			delete(b.parked, key)
			b.export(key, reply)
		}
	}
}

// exportKV copies root q's KV (its prompt and output tokens but the
// last), one frame per layer.
func (b *Batch) exportKV(q *seq) (*KV, error) {
	eng := b.cfg.Engine
	n, err := eng.Len(q.eseq)
	if err != nil {
		return nil, fmt.Errorf("decode: export kv of %s: %w", q.id, err)
	}
	if want := len(q.prompt) + q.emitted - 1; n != want {
		return nil, fmt.Errorf("decode: export kv of %s: the engine holds %d tokens, want %d", q.id, n, want)
	}
	layers := eng.Spec().Layers
	x := &KV{Tokens: n, Layers: make([][]byte, layers), Ends: make([][]int, layers), First: q.tokens[0]}
	for l := range layers {
		if x.Layers[l], err = eng.ExportKV(q.eseq, l, 0, n, nil); err != nil {
			return nil, fmt.Errorf("decode: export kv of %s layer %d: %w", q.id, l, err)
		}
		x.Ends[l] = []int{n}
	}
	return x, nil
}
