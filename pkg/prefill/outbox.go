package prefill

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/prefill/batch"
	"github.com/pdserve/pdserve/pkg/wire"
)

// Run runs the batch (pkg/prefill/batch: chunked prefill by priority) until ctx
// ends or Stop is called, then fails the requests still live with
// UNAVAILABLE, frees their engine sequences, and waits for the sender
// goroutines. It returns nil after a stop, or an error when Run was
// called twice. The batch owns the engine while it runs.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { s.expireRetained(ctx) })
	err := s.b.Run(ctx)
	cancel()
	bg.Wait()
	if err != nil {
		return err
	}
	s.stop()
	s.xfers.Wait()
	return nil
}

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

// stopping is the batch's Config.Stop: the worker refuses new requests
// and fails every live one (their transfers aborted); the batch then
// frees what it holds of them.
func (s *Server) stopping() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for _, r := range s.live {
		if r.tx != nil {
			r.tx.abort(errStopped)
		}
		s.endLocked(r, event{err: errStopped})
	}
}

// The request is the batch's Outbox of its Prefill call: it is called on
// the batch's loop goroutine and takes Server.mu, never waiting for the
// loop. The loop alone writes kv's bytes (Prefix, KV) and sets kv and tx
// (Start, under mu); sender goroutines read the bytes of frames pushed
// to tx (see kvBuf).
var _ batch.Outbox = (*request)(nil)

// Start charges r's KV to the retention bound (evicting retained KV
// least recently used first) and starts its sender goroutine: Wait when
// the bound has no room yet, Gone when r ended meanwhile.
func (r *request) Start() batch.Admit {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.ended {
		return batch.Gone
	}
	need := int64(len(r.prompt)) * int64(s.spec.Layers) * int64(s.tokenBytes)
	if !s.retained.makeRoom(need) {
		return batch.Wait
	}
	r.kv = newKVBuf(s.spec.Layers, len(r.prompt))
	r.ret = s.retained.add(r.id, r.kv, need)
	r.tx = newTransfer(peerContext(s.baseCtx, r.decodeID, r.cred), r.id, r.addr, r.codec, s.spec.KVDType, r.kv, r.skip, s.spec.KVTokenBytes(), s.auto, s.now)
	s.xfers.Add(1)
	go func() {
		defer s.xfers.Done()
		s.transferDone(r, r.tx.run(s.dialer))
	}()
	return batch.Go
}

// Prefix copies the prefix r started from into its KV buffer and hands
// its frames to the transfer, all or none.
func (r *request) Prefix(chunks []engine.KVChunk) error {
	frames := make([]frame, 0, len(chunks))
	for _, c := range chunks {
		f, err := r.kv.put(c)
		if err != nil {
			r.kv.reset()
			return err
		}
		frames = append(frames, f)
	}
	r.learnTokenBytes()
	for _, f := range frames {
		r.tx.push(f)
	}
	return nil
}

// KV copies a computed chunk into r's KV buffer and hands it to the
// transfer.
func (r *request) KV(c engine.KVChunk) error {
	f, err := r.kv.put(c)
	if err != nil {
		return err
	}
	r.learnTokenBytes()
	r.tx.push(f)
	return nil
}

// learnTokenBytes sets the worker's KV bytes of a token (the engine's
// payload, scaled down on sim) from r's first chunk.
func (r *request) learnTokenBytes() {
	if r.learnt || r.kv.tokenBytes == 0 {
		return
	}
	r.learnt = true
	r.s.mu.Lock()
	r.s.tokenBytes = r.kv.tokenBytes
	r.s.mu.Unlock()
}

// End ends r's prefill: its first token to the handler and the transfer
// (sealed), or its failure.
func (r *request) End(e batch.End) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leftBatchLocked(r)
	if r.ended {
		return // cancelled, or its transfer failed
	}
	fail := func(err error) {
		if r.tx != nil {
			r.tx.abort(err)
		}
		s.endLocked(r, event{err: err})
	}
	switch e.Kind {
	case batch.Stopped:
		if r.ret != nil && s.retained.get(r.id) == r.ret {
			s.retained.drop(r.id)
		}
		fail(errStopped)
		return
	case batch.Failed:
		if r.ret != nil && s.retained.get(r.id) == r.ret {
			s.retained.drop(r.id)
		}
		fail(status.Errorf(codes.Internal, "prefill: step failed: %v", e.Err))
		return
	case batch.Refused:
		s.log.Warn("grammar allows no first token; ending the request", zap.String("request_id", r.id), zap.Int32("token", e.Token), zap.Error(e.Err))
		fail(wire.GrammarRefusedStatus("prefill: request %s: the grammar allows no first token (%v)", r.id, e.Err))
		return
	}
	if !r.kv.complete() {
		fail(status.Errorf(codes.Internal, "prefill: engine handed out incomplete kv for %s", r.id))
		return
	}
	var lp *pdservev1.TokenLogprob
	if r.top >= 0 {
		// From the engine's logits, valid during End.
		lp = wire.TokenLogprob(wire.OutputLogprob(e.Logits, e.Token, len(r.prompt), r.top, s.spec.Vocab))
	}
	r.ret.first, r.ret.firstLP = e.Token, lp
	r.ret.complete = true
	s.retained.resize(r.ret, r.kv.size())
	h := e.Hits
	var hit *pdservev1.PrefixHit
	if h.Prefix > 0 {
		hit = &pdservev1.PrefixHit{Tokens: int32(h.Prefix), HostTokens: int32(h.Host), HostLoadNanos: h.HostLoad.Nanoseconds(),
			DiskTokens: int32(h.Disk), PeerTokens: int32(h.Peer), PeerLoadNanos: h.PeerLoad.Nanoseconds()}
	}
	r.events <- event{first: &pdservev1.FirstToken{
		Token:                e.Token,
		PrefillStartUnixNano: e.Start.UnixNano(),
		PrefillEndUnixNano:   e.Done.UnixNano(),
		BatchSize:            int32(e.Batch),
		Hit:                  hit,
		Logprob:              lp,
	}}
	s.log.Debug("prompt prefilled", zap.String("request_id", r.id), zap.Int("prompt_tokens", len(r.prompt)),
		zap.Int("prefix_hit_tokens", h.Prefix), zap.Int("host_hit_tokens", h.Host), zap.Duration("host_load", h.HostLoad),
		zap.Int("peer_hit_tokens", h.Peer), zap.Duration("peer_load", h.PeerLoad),
		zap.Int("skip_tokens", r.skip))
	r.kv.prov = provenance(e.Source, e.Unverified)
	r.tx.seal(e.Token, lp)
}

// transferDone ends r once its sender goroutine returned.
func (s *Server) transferDone(r *request, res transferResult) {
	s.m.addBytes(res.codec, res.bytesRaw, res.bytes)
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.sig.Wake() // room under the retention bound
	s.retained.unpin(r.ret, s.now())
	if res.err != nil {
		if !r.ended {
			s.log.Debug("kv transfer failed", zap.String("request_id", r.id), zap.String("decode_addr", r.addr), zap.Error(res.err))
		}
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
