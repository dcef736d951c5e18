package batch

import (
	"context"
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/runner"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// policy is the Batch's runner.Policy: its methods run on the loop
// goroutine, which holds the engine.
type policy struct{ b *Batch }

var _ runner.Policy[*seq] = policy{}

// take applies the messages posted since the last step boundary.
func (b *Batch) take() {
	for _, m := range b.box.Take() {
		switch {
		case m.join != nil:
			q := &seq{r: m.join}
			b.queue = append(b.queue, q)
			b.byKey[m.key] = q
			b.takenReqs++
			b.takenTokens += int64(len(m.join.Prompt))
		case m.cancel:
			if q := b.byKey[m.key]; q != nil {
				b.drop(q)
			}
		case m.purge != "":
			seqs := b.cfg.Cache.DropSource(m.purge)
			b.freeSeqs(seqs)
			b.cfg.Log.Warn("peer untrusted: dropped the prefix cache entries pulled from it", zap.String("peer", m.purge), zap.Int("engine_entries", len(seqs)))
		case m.adopt != nil:
			b.adopt(*m.adopt)
		case m.handover != nil:
			b.handTo = m.handover
		}
	}
}

// prioOf returns q's priority.
func prioOf(q *seq) vocab.Priority { return q.r.Priority }

// adopt takes h into the prefix cache and evicts from it what the
// engine's memory does not hold beside the started requests.
func (b *Batch) adopt(h prefixcache.Handover) {
	b.nextSeq = max(b.nextSeq, h.MaxSeq())
	b.freeSeqs(b.cfg.Cache.Adopt(h))
	b.makeRoom(nil)
	b.cfg.Log.Info("prefix cache handed over", zap.Int("entries", len(h.Entries)), zap.Int("kept", b.cfg.Cache.Stats().Entries))
}

// drop takes q out of the batch: its engine sequence freed, its grammar
// state closed.
func (b *Batch) drop(q *seq) {
	if q.started {
		b.cfg.Engine.Free(q.id)
		q.started = false
	}
	closeGrammar(q.r)
	b.remove(q)
}

// remove takes q out of the queue.
func (b *Batch) remove(q *seq) {
	if i := slices.Index(b.queue, q); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
	}
	delete(b.byKey, q.r.Key)
}

// closeGrammar closes r's grammar state (idempotent).
func closeGrammar(r *Request) {
	if r.Grammar != nil {
		r.Grammar.Close()
		r.Grammar, r.Sampling.Constraint = nil, nil
	}
}

// publish stores the Load of the queue and settles the posted counts
// with the Joins taken since the last publish.
func (b *Batch) publish() {
	var ld Load
	ld.Queued = len(b.queue)
	for _, q := range b.queue {
		ld.QueuedPrefillTokens += len(q.r.Prompt) - q.done
		if q.started {
			ld.EngineTokens += len(q.r.Prompt)
			ld.EngineSeqs++
		}
	}
	b.load.Store(&ld)
	b.postedReqs.Add(-b.takenReqs)
	b.postedTokens.Add(-b.takenTokens)
	b.takenReqs, b.takenTokens = 0, 0
}

// Plan takes the messages and picks the next step: the started requests
// in the order they started, then waiting ones in priority order
// (batching.Next: FCFS, but for interactive ones going ahead of older
// batch ones at most Config.Overtakes times in a row), each at most
// ChunkTokens of its remaining prompt, until MaxBatchTokens are used. A request gets its engine sequence when it is first
// scheduled, if the engine's memory and the service have room for it;
// otherwise it and every other waiting request wait.
func (p policy) Plan() runner.Batch[*seq] {
	b := p.b
	b.take()
	var rb runner.Batch[*seq]
	budget := b.cfg.MaxBatchTokens
	add := func(q *seq) {
		n := min(len(q.r.Prompt)-q.done, b.cfg.ChunkTokens, budget)
		rb.Prefill = append(rb.Prefill, engine.PrefillItem{
			Seq:      q.id,
			Tokens:   q.r.Prompt[q.done : q.done+n],
			Sampling: q.r.Sampling,
			Last:     q.done+n == len(q.r.Prompt),
		})
		rb.PrefillOf = append(rb.PrefillOf, q)
		budget -= n
	}
	// The queue holds the started requests first, in the order they
	// started, then the waiting ones in the order they joined.
	i := 0
	for ; i < len(b.queue) && b.queue[i].started && budget > 0; i++ {
		add(b.queue[i])
	}
	for budget > 0 {
		waiting := b.queue[i:]
		j := batching.Next(&b.order, waiting, prioOf)
		if j < 0 {
			break
		}
		q := waiting[j]
		a := b.start(q)
		if a == Wait {
			break
		}
		if a == Gone {
			b.drop(q)
			continue
		}
		batching.Started(&b.order, waiting, j, prioOf)
		copy(waiting[1:j+1], waiting[:j])
		waiting[0] = q
		add(q)
		i++
	}
	b.publish()
	if len(rb.Prefill) > 0 {
		rb.OnKV = b.onKV(rb)
	}
	return rb
}

// onKV returns the step's KV callback: each chunk goes to its request's
// Outbox.
func (b *Batch) onKV(rb runner.Batch[*seq]) engine.KVFunc {
	bySeq := make(map[engine.SeqID]*seq, len(rb.PrefillOf))
	for _, q := range rb.PrefillOf {
		bySeq[q.id] = q
	}
	b.kvErr = nil
	return func(c engine.KVChunk) error {
		q := bySeq[c.Seq]
		if q == nil {
			return fmt.Errorf("prefill: kv chunk of unknown sequence %d", c.Seq)
		}
		if err := q.r.Out.KV(c); err != nil {
			b.kvErr = err
			return err
		}
		return nil
	}
}

// Where fork takes a prompt's cached prefix from.
const (
	fromEngine = iota // the engine tier's hit
	fromHost          // the host tier (or the disk tier behind it)
	fromPeer          // what a peer worker sent (Request.Pulled)
)

// start decides whether q starts now (the engine's memory, then the
// service, Outbox.Start) and, if so, gives it an engine sequence,
// started from the longest prefix any tier holds. It returns Wait when q
// waits, Gone when the service ended it.
func (b *Batch) start(q *seq) Admit {
	r, c := q.r, b.cfg.Cache
	tokens, seqs := b.withLive(q)
	if !b.fits(tokens, seqs) && (seqs > 1 || b.pinned()) {
		// Pinned entries go when their export ends (the export wakes the
		// loop then). A request alone, with nothing pinned, always
		// starts: the engine then refuses only a prompt larger than its
		// whole memory.
		return Wait
	}
	maxHit := c.MaxHitBlocks(len(r.Prompt))
	from, fork := fromEngine, false
	switch {
	case r.Pulled != nil && min(r.Pulled.Tokens/c.BlockTokens(), maxHit) > c.PeerDepth(r.Hashes, maxHit):
		// What the peer sent is more than any tier here holds now.
		from = fromPeer
	case c.HostDeeper(r.Hashes, maxHit, r.Disk):
		from = fromHost
	default:
		// The entry q forks from stays in the engine, pinned, while the
		// fork copies it: it is part of q's footprint.
		src, pinned := c.Source(r.Hashes, maxHit)
		fork = true // a miss too: Acquire counts the lookup
		if src > 0 && !pinned && !b.fits(tokens+src, seqs+1) {
			if seqs > 1 {
				return Wait // the live requests free memory as they finish
			}
			fork = false // it never fits: q computes its whole prompt
		}
	}
	if a := r.Out.Start(); a != Go {
		return a
	}
	var hit prefixcache.Hit
	if fork {
		hit = c.Acquire(r.Hashes, maxHit)
	}
	b.nextSeq++
	q.id = b.nextSeq
	q.started = true
	b.makeRoom(q)
	b.fork(q, hit, from)
	r.Pulled, r.Disk = nil, nil // imported or not, their bytes are not needed any more
	c.Release(hit)
	// The hit's entry, pinned while q forked from it, may go now if the
	// engine's memory needs it.
	b.makeRoom(q)
	return Go
}

// fits reports whether the engine's KV memory holds tokens and seqs (the
// live requests' whole prompts and sequences, a starting request's
// included: withLive) beside the prefix cache entries that are pinned
// now; makeRoom evicts the others as needed.
func (b *Batch) fits(tokens, seqs int) bool {
	if b.cfg.MemTokens <= 0 && b.cfg.MemSeqs <= 0 {
		return true
	}
	pinnedTokens, pinned := b.cfg.Cache.Pinned()
	return (b.cfg.MemTokens <= 0 || tokens+pinnedTokens <= b.cfg.MemTokens) && (b.cfg.MemSeqs <= 0 || seqs+pinned <= b.cfg.MemSeqs)
}

// pinned reports whether some prefix cache entry is pinned now.
func (b *Batch) pinned() bool {
	_, n := b.cfg.Cache.Pinned()
	return n > 0
}

// withLive returns the engine memory q's whole prompt and the started
// requests (q counted once, started or not; nil: none) take: tokens and
// sequences.
func (b *Batch) withLive(q *seq) (tokens, seqs int) {
	if q != nil {
		tokens, seqs = len(q.r.Prompt), 1
	}
	for _, o := range b.queue {
		if o.started && o != q {
			tokens += len(o.r.Prompt)
			seqs++
		}
	}
	return tokens, seqs
}

// makeRoom evicts prefix cache entries, least recently used first
// (pinned ones stay), until the engine's KV memory holds the started
// requests' whole prompts, q's included (nil: none), and what the cache keeps: the
// cache lives in the memory live sequences do not use.
func (b *Batch) makeRoom(q *seq) {
	c := b.cfg.Cache
	if c == nil || (b.cfg.MemTokens <= 0 && b.cfg.MemSeqs <= 0) {
		return
	}
	tokens, seqs := b.withLive(q)
	st := c.Stats()
	var overTokens, overSeqs int
	if b.cfg.MemTokens > 0 {
		overTokens = tokens + st.Tokens - b.cfg.MemTokens
	}
	if b.cfg.MemSeqs > 0 {
		overSeqs = seqs + st.Entries - b.cfg.MemSeqs
	}
	if overTokens > 0 || overSeqs > 0 {
		b.freeSeqs(c.Shrink(overTokens, overSeqs))
	}
}

// fork starts q's engine sequence from hit, the longest cached prefix of
// its prompt (whole blocks, at least one token left to compute), or from
// the host tier's longer one (fromHost, loaded into it; or the disk
// tier's, read before q joined: Request.Disk), or from the prefix a peer
// sent (fromPeer, imported), and hands that prefix's KV to the Outbox
// (the decode worker needs the whole prompt's). On a miss it does
// nothing; when the fork, load, export or Outbox.Prefix fails (logged),
// q's sequence is freed and q computes its whole prompt. The caller
// holds the pin of hit.
func (b *Batch) fork(q *seq, hit prefixcache.Hit, from int) {
	r, c, eng := q.r, b.cfg.Cache, b.cfg.Engine
	n := hit.Tokens
	fail := func(err error) {
		b.cfg.Log.Warn("prefix cache fork failed; prefilling the whole prompt", zap.String("request_id", r.ID), zap.Int("prefix_tokens", n),
			zap.Bool("host_tier", from == fromHost), zap.Bool("peer", from == fromPeer), zap.Error(err))
		eng.Free(q.id)
		q.hits, q.source, q.unverified, q.done = Hits{}, "", false, 0
	}
	switch from {
	case fromHost:
		ld, err := c.Host().Load(eng, q.id, r.Hashes, c.MaxHitBlocks(len(r.Prompt)), r.Disk)
		if err != nil {
			fail(err)
			return
		}
		n, q.hits.Host, q.hits.HostLoad, q.source = ld.Tokens, ld.Tokens, ld.Took, ld.Source
		if ld.Disk {
			q.hits.Disk = ld.Tokens
		}
	case fromPeer:
		m, took, err := c.LoadPulled(eng, q.id, r.Pulled, c.MaxHitBlocks(len(r.Prompt)))
		if err != nil {
			fail(err)
			return
		}
		n, q.hits.Peer, q.hits.PeerLoad = m, m, took
		q.source, q.unverified = r.Pulled.Source, !r.Pulled.Verified
	}
	if n == 0 {
		return
	}
	if from == fromEngine {
		if err := eng.(engine.Forker).Fork(hit.Seq, q.id, n); err != nil {
			fail(err)
			return
		}
		q.source = hit.Source
	}
	chunks := make([]engine.KVChunk, 0, b.spec.Layers)
	for l := range b.spec.Layers {
		data, err := eng.ExportKV(q.id, l, 0, n, nil)
		if err != nil {
			fail(err)
			return
		}
		ch := engine.KVChunk{Seq: q.id, Layer: l, Start: 0, End: n, Data: data}
		if len(data) != b.spec.KVChunkBytes(n) {
			// A scaled-down payload (sim): say what it stands for.
			ch.FullBytes = b.spec.KVChunkBytes(n)
		}
		chunks = append(chunks, ch)
	}
	if err := r.Out.Prefix(chunks); err != nil {
		fail(err)
		return
	}
	q.done, q.hits.Prefix = n, n
}

// freeSeqs frees engine sequences the prefix cache let go of, those it
// evicted copied into its host tier first (a failed copy is logged).
func (b *Batch) freeSeqs(seqs []engine.SeqID) {
	if err := b.cfg.Cache.Free(b.cfg.Engine, seqs); err != nil {
		b.cfg.Log.Warn("prefix cache: copy to the host tier failed", zap.Error(err))
	}
}

// Done hands out a step's results: the first token of each request whose
// prompt is all prefilled, or the step's failure to every request in it.
func (p policy) Done(ctx context.Context, rb runner.Batch[*seq], res runner.Result) {
	b := p.b
	if err := res.Err; err != nil {
		kind := Failed
		if ctx.Err() != nil {
			kind = Stopped
		} else {
			b.cfg.Log.Error("prefill step failed", zap.Int("batch", len(rb.Prefill)), zap.Error(err), zap.NamedError("kv_error", b.kvErr))
		}
		for _, q := range rb.PrefillOf {
			b.drop(q)
			q.r.Out.End(End{Kind: kind, Err: err})
		}
		return
	}
	computed := 0
	for _, it := range rb.Prefill {
		computed += len(it.Tokens)
	}
	if b.cfg.ObservePrefill != nil {
		b.cfg.ObservePrefill(computed, res.End.Sub(res.Start))
	}
	for i, q := range rb.PrefillOf {
		it, out := rb.Prefill[i], res.Prefill[i]
		if q.startedAt.IsZero() {
			q.startedAt = res.Start
		}
		q.done += len(it.Tokens)
		if !it.Last {
			continue
		}
		r := q.r
		var refused error
		if r.Grammar != nil {
			// The token was sampled under the grammar's mask: only a mask
			// that allowed no token at all refuses it. It is never sent.
			refused = r.Grammar.Accept(out.Token)
		}
		closeGrammar(r)
		// The sequence holds the whole prompt now: it becomes a prefix
		// cache entry tagged with where its prefix came from (or is
		// freed, and so are the entries it evicts). One that started
		// from unverified pulled KV served r only: it is freed, so that
		// the worker never exports or advertises it as its own.
		if q.unverified {
			b.cfg.Cache.NoteUnverified()
			b.freeSeqs([]engine.SeqID{q.id})
		} else {
			b.freeSeqs(b.cfg.Cache.InsertFrom(q.id, r.Hashes, len(r.Prompt), q.source))
		}
		q.started = false
		b.remove(q)
		e := End{Kind: Prefilled, Token: out.Token, Logits: out.Logits, Start: q.startedAt, Done: res.End, Batch: len(rb.Prefill), Hits: q.hits, Source: q.source, Unverified: q.unverified}
		if refused != nil {
			e.Kind, e.Err = Refused, refused
		}
		r.Out.End(e)
	}
}

// Shutdown ends every request the batch holds, or that was posted
// before Config.Stop returned, as Stopped, and frees the engine's
// sequences, the prefix cache's included.
func (p policy) Shutdown() {
	b := p.b
	if b.cfg.Stop != nil {
		b.cfg.Stop()
	}
	b.take()
	for _, s := range slices.Clone(b.queue) {
		b.drop(s)
		s.r.Out.End(End{Kind: Stopped})
	}
	if b.handTo != nil {
		// The next role's batch frees or keeps them.
		b.handTo <- b.cfg.Cache.Handover()
	}
	b.freeSeqs(b.cfg.Cache.Drain())
	b.publish()
}
