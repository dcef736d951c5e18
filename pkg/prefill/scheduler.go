package prefill

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/runner"
	"github.com/pdserve/pdserve/pkg/wire"
)

// Run runs the scheduler (the runner under the FCFS policy) until ctx ends
// or Stop is called, then fails the requests still live with UNAVAILABLE,
// frees their engine sequences, and waits for the sender goroutines. It
// returns nil after a stop, or an error when Run was called twice. Run
// owns the engine while it runs.
func (s *Server) Run(ctx context.Context) error { return s.run.Run(ctx) }

// expireRetained drops, until ctx ends, the retained KV of finished
// requests that no Release or Resend touched for Options.RetainTTL,
// checking every eighth of it (between 100 ms and 10 s).
func (s *Server) expireRetained(ctx context.Context) {
	t := time.NewTicker(min(max(s.o.RetainTTL/8, 100*time.Millisecond), 10*time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		n := s.retained.expire(s.now(), s.o.RetainTTL)
		s.mu.Unlock()
		if n > 0 {
			s.log.Info("retained KV expired without a release", zap.Int("requests", n), zap.Duration("retain_ttl", s.o.RetainTTL))
			s.sig.Wake() // room for queued requests
		}
	}
}

// Stop ends Run (if it runs) and cancels every transfer; it does not wait.
func (s *Server) Stop() { s.stop() }

// fcfs is the prefill worker's runner.Policy: requests in arrival order,
// each a chunk of its prompt (see Plan). It owns the engine's sequences
// (its methods run in the runner's loop, which holds the engine) and
// takes Server.mu for the requests' state.
type fcfs struct {
	s       *Server
	eng     engine.Engine
	nextSeq engine.SeqID
	kvErr   error // why the last step's KV callback failed, for its log
}

var _ runner.Policy[*request] = (*fcfs)(nil)

// Shutdown fails everything still live and waits for the senders.
func (p *fcfs) Shutdown() {
	s := p.s
	s.mu.Lock()
	s.stopped = true
	for _, r := range s.queue {
		if r.started && !r.prefilled {
			p.eng.Free(r.seq)
		}
	}
	s.queue = nil
	p.freeSeqs(s.cache.Drain())
	for _, r := range s.live {
		if r.tx != nil {
			r.tx.abort(errStopped)
		}
		s.endLocked(r, event{err: errStopped})
	}
	s.mu.Unlock()
	s.stop()
	s.xfers.Wait()
}

// Plan drops cancelled requests and picks the next step: requests in
// arrival order, each at most ChunkTokens of its remaining prompt, until
// MaxBatchTokens are used. A request gets its engine sequence, KV buffer
// and sender goroutine when it is first scheduled, if the engine's memory
// and the retention bound have room for its KV; otherwise it and every
// later request wait (FCFS).
func (p *fcfs) Plan() runner.Batch[*request] {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue[:0]
	for _, r := range s.queue {
		if r.cancelled {
			if r.started {
				p.eng.Free(r.seq)
			}
			continue
		}
		q = append(q, r)
	}
	clear(s.queue[len(q):])
	s.queue = q

	var b runner.Batch[*request]
	budget := s.o.MaxBatchTokens
	for _, r := range s.queue {
		if budget == 0 {
			break
		}
		if !r.started && !p.startLocked(r) {
			break
		}
		n := min(len(r.prompt)-r.done, s.o.ChunkTokens, budget)
		b.Prefill = append(b.Prefill, engine.PrefillItem{
			Seq:      r.seq,
			Tokens:   r.prompt[r.done : r.done+n],
			Sampling: r.sampling,
			Last:     r.done+n == len(r.prompt),
		})
		b.PrefillOf = append(b.PrefillOf, r)
		budget -= n
	}
	if len(b.Prefill) > 0 {
		b.OnKV = p.onKV(b)
	}
	return b
}

// onKV returns the step's KV callback: each chunk goes into its request's
// buffer and out to its transfer.
func (p *fcfs) onKV(b runner.Batch[*request]) engine.KVFunc {
	bySeq := make(map[engine.SeqID]*request, len(b.PrefillOf))
	for _, r := range b.PrefillOf {
		bySeq[r.seq] = r
	}
	p.kvErr = nil
	return func(c engine.KVChunk) error {
		r := bySeq[c.Seq]
		if r == nil {
			return fmt.Errorf("prefill: kv chunk of unknown sequence %d", c.Seq)
		}
		f, err := r.kv.put(c)
		if err != nil {
			p.kvErr = err
			return err
		}
		r.tx.push(f)
		return nil
	}
}

// startLocked gives r an engine sequence, a KV buffer charged to the
// retention bound and a sender goroutine. It reports false when r waits:
// the engine's memory or the retention bound has no room for it yet.
//
// Engine memory is one decision, taken here before anything is
// allocated (startFits): r starts only when its whole footprint fits
// beside the live requests' sequences and the prefix cache entries that
// cannot be evicted (pinned: the entry r forks from, which stays in the
// engine while the fork copies it, and entries a peer's export holds).
// Its footprint is its prompt, whichever way it starts: a fork, a host-
// or disk-tier load and a peer pull put at most its prompt's tokens into
// its own sequence. When the fork's source does not fit beside r, r
// waits for the live requests, or, with none live, starts without the
// fork (the entry may then be evicted for r's memory).
func (p *fcfs) startLocked(r *request) bool {
	s := p.s
	tokens, seqs := p.withLiveLocked(r)
	if !p.startFits(tokens, seqs) && (seqs > 1 || p.pinnedLocked()) {
		// Pinned entries go when their export ends (ExportPrefix wakes
		// the scheduler then). A request alone, with nothing pinned,
		// always starts: the engine then refuses only a prompt larger
		// than its whole memory.
		return false
	}
	maxHit := s.cache.MaxHitBlocks(len(r.prompt))
	from, fork := fromEngine, false
	switch {
	case r.pulled != nil && min(r.pulled.Tokens/s.cache.BlockTokens(), maxHit) > s.cache.PeerDepth(r.hashes, maxHit):
		// What the peer sent is more than any tier here holds now.
		from = fromPeer
	case s.cache.HostDeeper(r.hashes, maxHit, r.disk):
		from = fromHost
	default:
		// The entry r forks from stays in the engine, pinned, while the
		// fork copies it: it is part of r's footprint.
		src, pinned := s.cache.Source(r.hashes, maxHit)
		fork = true // a miss too: Acquire counts the lookup
		if src > 0 && !pinned && !p.startFits(tokens+src, seqs+1) {
			if seqs > 1 {
				return false // the live requests free memory as they finish
			}
			fork = false // it never fits: r computes its whole prompt
		}
	}
	need := int64(len(r.prompt)) * int64(s.spec.Layers) * int64(s.tokenBytes)
	if !s.retained.makeRoom(need) {
		return false
	}
	var hit prefixcache.Hit
	if fork {
		hit = s.cache.Acquire(r.hashes, maxHit)
	}
	p.nextSeq++
	r.seq = p.nextSeq
	r.started = true
	r.kv = newKVBuf(s.spec.Layers, len(r.prompt))
	p.makeRoomLocked(r)
	frames := p.forkPrefixLocked(r, hit, from)
	r.pulled, r.disk = nil, nil // imported or not, their bytes are not needed any more
	s.cache.Release(hit)
	// The hit's entry, pinned while r forked from it, may go now if the
	// engine's memory needs it.
	p.makeRoomLocked(r)
	r.ret = s.retained.add(r.id, r.kv, need)
	r.tx = newTransfer(peerContext(s.baseCtx, r.decodeID, r.cred), r.id, r.addr, r.codec, s.spec.KVDType, r.kv, r.skip, s.spec.KVTokenBytes(), s.auto, s.now)
	for _, f := range frames {
		r.tx.push(f)
	}
	s.xfers.Add(1)
	go func() {
		defer s.xfers.Done()
		s.transferDone(r, r.tx.run(s.dialer))
	}()
	return true
}

// startFits reports whether the engine's KV memory holds tokens and seqs
// (the live requests' whole prompts and sequences, a starting request's
// included: withLiveLocked) beside the prefix cache entries that are
// pinned now; makeRoomLocked evicts the others as needed. The caller
// holds mu.
func (p *fcfs) startFits(tokens, seqs int) bool {
	s := p.s
	if s.memTokens <= 0 && s.memSeqs <= 0 {
		return true
	}
	pinnedTokens, pinned := s.cache.Pinned()
	return (s.memTokens <= 0 || tokens+pinnedTokens <= s.memTokens) && (s.memSeqs <= 0 || seqs+pinned <= s.memSeqs)
}

// pinnedLocked reports whether some prefix cache entry is pinned now.
func (p *fcfs) pinnedLocked() bool {
	_, n := p.s.cache.Pinned()
	return n > 0
}

// withLiveLocked returns the engine memory r's whole prompt and the live
// requests (started, not yet prefilled; r counted once, started or not)
// take: tokens and sequences. The caller holds mu.
func (p *fcfs) withLiveLocked(r *request) (tokens, seqs int) {
	s := p.s
	tokens, seqs = len(r.prompt), 1
	for _, q := range s.queue {
		if q.started && !q.prefilled && q != r {
			tokens += len(q.prompt)
			seqs++
		}
	}
	return tokens, seqs
}

// makeRoomLocked evicts prefix cache entries, least recently used first
// (pinned ones stay), until the engine's KV memory holds the live
// requests' sequences, r's whole prompt and what the cache keeps, and a
// sequence slot is free for r: the cache lives in the memory live
// sequences do not use. The caller is the scheduler and holds mu; r is
// started, not yet counted among the queue's started requests.
func (p *fcfs) makeRoomLocked(r *request) {
	s := p.s
	if s.cache == nil || (s.memTokens <= 0 && s.memSeqs <= 0) {
		return
	}
	tokens, seqs := p.withLiveLocked(r)
	st := s.cache.Stats()
	var overTokens, overSeqs int
	if s.memTokens > 0 {
		overTokens = tokens + st.Tokens - s.memTokens
	}
	if s.memSeqs > 0 {
		overSeqs = seqs + st.Entries - s.memSeqs
	}
	if overTokens > 0 || overSeqs > 0 {
		p.freeSeqs(s.cache.Shrink(overTokens, overSeqs))
	}
}

// Where forkPrefixLocked takes a prompt's cached prefix from.
const (
	fromEngine = iota // the engine tier's hit
	fromHost          // the host tier (or the disk tier behind it)
	fromPeer          // what a peer worker sent (request.pulled)
)

// forkPrefixLocked starts r's engine sequence from hit, the longest cached
// prefix of its prompt (whole blocks, at least one token left to compute),
// or from the host tier's longer one (from fromHost, loaded into it; or
// the disk tier's, read before r was queued: r.disk), or
// from the prefix a peer sent (fromPeer, imported), copies that prefix's
// KV out of the sequence into r.kv (the decode worker needs the whole
// prompt's, and Resend does) and returns its frames, to be pushed to the
// transfer. On a miss, or when the fork, load or export fails (logged; r
// then prefills from scratch), it does nothing. The caller is the
// scheduler (it owns the engine), holds mu and the pin of hit.
func (p *fcfs) forkPrefixLocked(r *request, hit prefixcache.Hit, from int) []frame {
	s := p.s
	n := hit.Tokens
	fail := func(err error) []frame {
		s.log.Warn("prefix cache fork failed; prefilling the whole prompt", zap.String("request_id", r.id), zap.Int("prefix_tokens", n),
			zap.Bool("host_tier", from == fromHost), zap.Bool("peer", from == fromPeer), zap.Error(err))
		p.eng.Free(r.seq)
		r.kv = newKVBuf(s.spec.Layers, len(r.prompt))
		r.hostHit, r.hostLoad, r.diskHit, r.peerHit, r.peerLoad = 0, 0, 0, 0, 0
		r.source, r.unverified = "", false
		return nil
	}
	switch from {
	case fromHost:
		ld, err := s.cache.Host().Load(p.eng, r.seq, r.hashes, s.cache.MaxHitBlocks(len(r.prompt)), r.disk)
		if err != nil {
			return fail(err)
		}
		n, r.hostHit, r.hostLoad, r.source = ld.Tokens, ld.Tokens, ld.Took, ld.Source
		if ld.Disk {
			r.diskHit = ld.Tokens
		}
	case fromPeer:
		m, took, err := s.cache.LoadPulled(p.eng, r.seq, r.pulled, s.cache.MaxHitBlocks(len(r.prompt)))
		if err != nil {
			return fail(err)
		}
		n, r.peerHit, r.peerLoad = m, m, took
		r.source, r.unverified = r.pulled.Source, !r.pulled.Verified
	}
	if n == 0 {
		return nil
	}
	if from == fromEngine {
		if err := p.eng.(engine.Forker).Fork(hit.Seq, r.seq, n); err != nil {
			return fail(err)
		}
		r.source = hit.Source
	}
	var frames []frame
	var buf []byte
	for l := range s.spec.Layers {
		var err error
		if buf, err = p.eng.ExportKV(r.seq, l, 0, n, buf[:0]); err != nil {
			return fail(err)
		}
		c := engine.KVChunk{Seq: r.seq, Layer: l, Start: 0, End: n, Data: buf}
		if len(buf) != s.spec.KVChunkBytes(n) {
			// A scaled-down payload (sim): say what it stands for.
			c.FullBytes = s.spec.KVChunkBytes(n)
		}
		f, err := r.kv.put(c)
		if err != nil {
			return fail(err)
		}
		frames = append(frames, f)
	}
	r.done, r.prefixHit = n, n
	return frames
}

// freeSeqs frees engine sequences the prefix cache let go of, those it
// evicted copied into its host tier first (a failed copy is logged). The
// caller is the scheduler.
func (p *fcfs) freeSeqs(seqs []engine.SeqID) {
	if err := p.s.cache.Free(p.eng, seqs); err != nil {
		p.s.log.Warn("prefix cache: copy to the host tier failed", zap.Error(err))
	}
}

// Done hands out a step's results: the first token of each request whose
// prompt is all prefilled, or the step's failure to every request in it.
func (p *fcfs) Done(ctx context.Context, b runner.Batch[*request], res runner.Result) {
	s := p.s
	outs, err := res.Prefill, res.Err
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("prefill step failed", zap.Int("batch", len(b.Prefill)), zap.Error(err), zap.NamedError("kv_error", p.kvErr))
		}
		st := status.Errorf(codes.Internal, "prefill: step failed: %v", err)
		if ctx.Err() != nil {
			st = errStopped
		}
		for _, r := range b.PrefillOf {
			p.eng.Free(r.seq)
			r.prefilled = true
			s.removeLocked(r)
			r.tx.abort(st)
			if s.retained.get(r.id) == r.ret {
				s.retained.drop(r.id)
			}
			s.endLocked(r, event{err: st})
		}
		return
	}
	computed := 0
	for _, it := range b.Prefill {
		computed += len(it.Tokens)
	}
	s.peers.ObserveStep(computed, res.End.Sub(res.Start))
	for i, r := range b.PrefillOf {
		it := b.Prefill[i]
		if r.startedAt.IsZero() {
			r.startedAt = res.Start
		}
		r.done += len(it.Tokens)
		if r.kv.tokenBytes > 0 {
			s.tokenBytes = r.kv.tokenBytes
		}
		if !it.Last {
			continue
		}
		var refused error
		if r.grammar != nil {
			// The token was sampled under the grammar's mask: only a mask
			// that allowed no token at all refuses it. It is never sent.
			refused = r.grammar.Accept(outs[i].Token)
		}
		r.closeGrammar()
		var lp *pdservev1.TokenLogprob
		if r.top >= 0 {
			// From the engine's logits, before Free.
			l := wire.OutputLogprob(outs[i].Logits, outs[i].Token, len(r.prompt), r.top, s.spec.Vocab)
			lp = wire.TokenLogprob(l)
		}
		// The sequence holds the whole prompt now: it becomes a prefix
		// cache entry tagged with where its prefix came from (or is
		// freed, and so are the entries it evicts). One that started
		// from unverified pulled KV served r only: it is freed, so that
		// the worker never exports or advertises it as its own.
		if r.unverified {
			s.cache.NoteUnverified()
			p.freeSeqs([]engine.SeqID{r.seq})
		} else {
			p.freeSeqs(s.cache.InsertFrom(r.seq, r.hashes, len(r.prompt), r.source))
		}
		r.prefilled = true
		s.removeLocked(r)
		if r.cancelled {
			continue
		}
		if !r.kv.complete() {
			err := status.Errorf(codes.Internal, "prefill: engine handed out incomplete kv for %s", r.id)
			r.tx.abort(err)
			s.endLocked(r, event{err: err})
			continue
		}
		if refused != nil {
			s.log.Warn("grammar allows no first token; ending the request", zap.String("request_id", r.id), zap.Int32("token", outs[i].Token), zap.Error(refused))
			err := wire.GrammarRefusedStatus("prefill: request %s: the grammar allows no first token (%v)", r.id, refused)
			r.tx.abort(err)
			s.endLocked(r, event{err: err})
			continue
		}
		r.firstToken = outs[i].Token
		r.ret.first, r.ret.firstLP = outs[i].Token, lp
		r.ret.complete = true
		s.retained.resize(r.ret, r.kv.size())
		var hit *pdservev1.PrefixHit
		if r.prefixHit > 0 {
			hit = &pdservev1.PrefixHit{Tokens: int32(r.prefixHit), HostTokens: int32(r.hostHit), HostLoadNanos: r.hostLoad.Nanoseconds(),
				DiskTokens: int32(r.diskHit), PeerTokens: int32(r.peerHit), PeerLoadNanos: r.peerLoad.Nanoseconds()}
		}
		r.events <- event{first: &pdservev1.FirstToken{
			Token:                outs[i].Token,
			PrefillStartUnixNano: r.startedAt.UnixNano(),
			PrefillEndUnixNano:   res.End.UnixNano(),
			BatchSize:            int32(len(b.Prefill)),
			Hit:                  hit,
			Logprob:              lp,
		}}
		s.log.Debug("prompt prefilled", zap.String("request_id", r.id), zap.Int("prompt_tokens", len(r.prompt)),
			zap.Int("prefix_hit_tokens", r.prefixHit), zap.Int("host_hit_tokens", r.hostHit), zap.Duration("host_load", r.hostLoad),
			zap.Int("peer_hit_tokens", r.peerHit), zap.Duration("peer_load", r.peerLoad),
			zap.Int("skip_tokens", r.skip))
		r.tx.seal(outs[i].Token, lp)
	}
}

// transferDone ends r once its sender goroutine returned.
func (s *Server) transferDone(r *request, res transferResult) {
	s.m.addBytes(res.codec, res.bytesRaw, res.bytes)
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.sig.Wake()
	s.retained.unpin(r.ret, s.now())
	if res.err != nil {
		if !r.ended {
			s.log.Debug("kv transfer failed", zap.String("request_id", r.id), zap.String("decode_addr", r.addr), zap.Error(res.err))
		}
		// The scheduler may not have seen the abort yet: it frees the
		// sequence at the next plan, and a cancel already ended r.
		r.cancelled = true
		err := wire.KVTransferFailedStatus(r.id, r.addr, res.err)
		if s.baseCtx.Err() != nil {
			// The worker is stopping: that, not the decode worker, ended
			// the transfer.
			err = errStopped
		}
		s.endLocked(r, event{err: err})
		return
	}
	link, _ := s.auto.Links().Throughput(r.addr)
	s.log.Debug("kv sent", zap.String("request_id", r.id), zap.String("decode_addr", r.addr),
		zap.String("codec", res.codec), zap.String("codec_reason", res.reason),
		zap.Int64("bytes_raw", res.bytesRaw), zap.Int64("bytes_wire", res.bytes), zap.Float64("link_bytes_per_s", link))
	s.endLocked(r, event{done: kvDone(res)})
}
