package decode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pdserve/pdserve/pkg/decode/batch"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/wire"
)

// receiver is the Server's kvtransfer.Receiver. It never waits for the
// batch: KV is staged in memory as it arrives, whatever step the batch
// runs, and goes to the batch once committed and claimed (batch.Arrived,
// or in the Join), which imports it into the engine when the sequence
// joins. Its state is Server.rx; it takes Server.mu only after releasing
// rx.mu, to end a claimed request whose transfer failed.
type receiver struct{ s *Server }

// rxState is the KV receiver's: the requests that may receive KV and
// their transfers (kvIn). mu, the receiver's one lock, guards reqs and
// every sequence's kvIn; it is never held across a call into the
// service, nor into a transfer's staging. The service hands it what a
// transfer may be (expect, the claim) and a request's end (drop)
// holding no lock of its own, and the receiver takes Server.mu only
// holding no lock.
type rxState struct {
	mu   sync.Mutex
	reqs map[string]*sequence // by id, from Reserve (or the claim of a Generate without one) to the request's end
}

// register makes q a request that may receive KV, unless it ended or a
// later request of its id is registered (the service hands the receiver
// a request's end after releasing its lock, so a new request of the id
// may come first). The caller holds r.mu.
func (r *rxState) register(q *sequence) {
	if r.reqs == nil {
		r.reqs = make(map[string]*sequence)
	}
	if cur := r.reqs[q.id]; !q.ended && (cur == nil || cur.key < q.key) {
		r.reqs[q.id] = q
	}
}

// expect hands a new reservation to the receiver: q may receive limit
// tokens of KV, starting at 0 or after the hit tokens pinned for it.
// A Generate call that claimed q already (claimKV) set the limit, maybe
// grown. The caller holds no lock.
func (r *rxState) expect(q *sequence, limit, hit int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !q.claimed {
		q.limit = limit
	}
	q.hitTokens = hit
	r.register(q)
}

// drop hands the end of request q to the receiver: no transfer may begin
// or go on for it, and the KV of an open transfer, or of a committed one
// no Generate call claimed, is freed (a claimed one's is the batch's),
// after mu. Idempotent. The caller holds no lock (Server.unlock).
func (r *rxState) drop(q *sequence) {
	r.mu.Lock()
	q.ended = true
	if r.reqs[q.id] == q {
		delete(r.reqs, q.id)
	}
	var st *staging
	if q.sink != nil {
		st = q.sink.st
		q.sink = nil
	}
	held := q.held
	q.held = nil
	r.mu.Unlock()
	if st != nil {
		st.free()
	}
	if held != nil && held.Free != nil {
		held.Free()
	}
}

// receiving reports whether KV is arriving for q (an open transfer).
func (r *rxState) receiving(q *sequence) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return q.sink != nil
}

// transfers counts the open transfers.
func (r *rxState) transfers() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, q := range r.reqs {
		if q.sink != nil {
			n++
		}
	}
	return n
}

var _ kvtransfer.Receiver = receiver{}

// Begin accepts a transfer for a reserved request: FAILED_PRECONDITION
// without a reservation, for a request that prefills locally, or when KV
// was already received or is being received; RESOURCE_EXHAUSTED when the
// header's tokens exceed the reservation; INVALID_ARGUMENT when its layer
// count is not the model's or its token bytes are not the engine's.
func (r receiver) Begin(_ context.Context, h kvtransfer.StreamHeader) (kvtransfer.Sink, error) {
	s := r.s
	s.rx.mu.Lock()
	defer s.rx.mu.Unlock()
	q := s.rx.reqs[h.RequestID]
	switch {
	case q == nil || q.ended:
		return nil, status.Errorf(codes.FailedPrecondition, "decode: no reservation for request %s", h.RequestID)
	case h.Tokens > q.limit:
		return nil, status.Errorf(codes.ResourceExhausted, "decode: transfer of %s has %d tokens, %d reserved", h.RequestID, h.Tokens, q.limit)
	case h.Layers != s.spec.Layers:
		return nil, status.Errorf(codes.InvalidArgument, "decode: transfer of %s has %d layers, the model %d", h.RequestID, h.Layers, s.spec.Layers)
	case h.TokenBytes != s.tokenBytes:
		return nil, status.Errorf(codes.InvalidArgument, "decode: transfer of %s has %d bytes per token and layer, the engine %d", h.RequestID, h.TokenBytes, s.tokenBytes)
	case q.claimed && q.claimLocal:
		return nil, status.Errorf(codes.FailedPrecondition, "decode: request %s prefills locally", h.RequestID)
	case q.committed:
		return nil, status.Errorf(codes.FailedPrecondition, "decode: kv of request %s was received already", h.RequestID)
	case q.sink != nil:
		return nil, status.Errorf(codes.FailedPrecondition, "decode: kv of request %s is being received", h.RequestID)
	case q.claimed && q.claimPrompt != h.Tokens:
		return nil, status.Errorf(codes.InvalidArgument, "decode: transfer of %s has %d tokens, the prompt %d", h.RequestID, h.Tokens, q.claimPrompt)
	case h.Start != 0 && h.Start != q.hitTokens:
		return nil, status.Errorf(codes.FailedPrecondition, "decode: transfer of %s starts at token %d; this worker holds %d of its prefix", h.RequestID, h.Start, q.hitTokens)
	}
	q.firstByte = time.Time{}
	q.xferErr = nil
	k := &sink{s: s, q: q, h: h, st: &staging{s: s, start: h.Start, layers: make([][]byte, h.Layers), ends: make([][]int, h.Layers)}}
	q.sink = k
	return k, nil
}

// staging holds one transfer's KV in memory, one buffer per layer (tokens
// [start, start+len/TokenBytes) of it, the frames' bytes back to back;
// start is the header's, the prefix before it comes from the prefix
// cache), from its
// first frame until the batch imported it into the engine or the
// request ended. Frame boundaries are kept: a frame's canonical bytes are
// laid out for its own token range (K of every token, then V), so the
// frames are imported one by one, as sent. Its size is bounded by the
// transfer's header, itself bounded by the reservation: Layers × Tokens ×
// TokenBytes bytes. Server.stagedBytes counts the bytes of every live
// staging.
type staging struct {
	s      *Server
	start  int        // first token held (the header's Start); fixed
	mu     sync.Mutex // guards layers, ends, bytes and freed; a leaf: taken holding no other lock
	layers [][]byte
	ends   [][]int // per layer, the end token of each frame, ascending
	bytes  int64   // capacity allocated, counted in Server.stagedBytes
	freed  bool
}

// Reasons add fails.
var (
	errFreed = errors.New("staging freed")
	errFrame = errors.New("frame does not continue its layer")
)

// add appends raw, the KV of layer for tokens [start, end) of h, to the
// layer's buffer, allocating it for h.Tokens tokens at the layer's first
// frame. raw is copied. Errors: errFreed once the staging was freed (the
// request ended), errFrame when the frame does not continue the layer.
func (g *staging) add(h kvtransfer.StreamHeader, layer, start, end int, raw []byte) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.freed {
		return errFreed
	}
	tb := h.TokenBytes
	if layer < 0 || layer >= len(g.layers) || start != g.start+len(g.layers[layer])/tb || end > h.Tokens || len(raw) != (end-start)*tb {
		return errFrame
	}
	if g.layers[layer] == nil {
		n := (h.Tokens - g.start) * tb
		g.layers[layer] = make([]byte, 0, n)
		g.bytes += int64(n)
		g.s.stagedBytes.Add(int64(n))
	}
	g.layers[layer] = append(g.layers[layer], raw...)
	g.ends[layer] = append(g.ends[layer], end)
	return nil
}

// handOver returns the staged KV of h for the batch, which frees it
// (KV.Free) after its import, once every layer holds all of it. The
// sink writes no more to it. Errors: errFreed once the staging was
// freed, INTERNAL when a layer lacks KV.
func (g *staging) handOver(h kvtransfer.StreamHeader) (*batch.KV, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.freed {
		return nil, errFreed
	}
	for l := range h.Layers {
		if n := len(g.layers[l]); n != (h.Tokens-h.Start)*h.TokenBytes {
			return nil, status.Errorf(codes.Internal, "decode: kv of %s layer %d holds %d bytes after the transfer, want %d", h.RequestID, l, n, (h.Tokens-h.Start)*h.TokenBytes)
		}
	}
	return &batch.KV{Start: g.start, Layers: g.layers, Ends: g.ends, Free: g.free}, nil
}

// free drops the buffers. Idempotent; safe for concurrent use.
func (g *staging) free() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.freed {
		return
	}
	g.freed = true
	g.layers, g.ends = nil, nil
	g.s.stagedBytes.Add(-g.bytes)
	g.bytes = 0
}

// sink stages one transfer's KV. Write, Commit and Abort of one transfer
// come from its stream's goroutine, one at a time; the staging may be freed
// concurrently by whoever ends the request.
type sink struct {
	s    *Server
	q    *sequence
	h    kvtransfer.StreamHeader
	st   *staging
	last time.Time // when the last frame was staged; written by Write only
	// stamped: the first frame stamped q.firstByte; Write's only.
	stamped bool
}

// errGone fails writes to a request that ended while its KV arrived.
func (k *sink) errGone() error {
	return status.Errorf(codes.Aborted, "decode: request %s ended during its kv transfer", k.q.id)
}

// Write copies the frame into the transfer's staging buffer; it never
// waits for a batch step, and takes Server.rx.mu only for the first
// frame (to stamp it): later frames see the request's end through the
// staging, which the end (rxState.drop) and Abort free. raw is not kept. Errors:
// ABORTED when the request ended, INVALID_ARGUMENT for a frame that does
// not continue its layer (the kvtransfer server checks frames against the
// header already).
func (k *sink) Write(layer, start, end int, raw []byte) error {
	s, q := k.s, k.q
	if !k.stamped {
		s.rx.mu.Lock()
		gone := q.ended || q.sink != k
		if !gone {
			q.firstByte = s.now()
		}
		s.rx.mu.Unlock()
		if gone {
			return k.errGone()
		}
		k.stamped = true
	}
	switch err := k.st.add(k.h, layer, start, end, raw); {
	case errors.Is(err, errFreed):
		return k.errGone()
	case err != nil:
		return status.Errorf(codes.InvalidArgument, "decode: kv of %s: frame of layer %d [%d, %d) with %d bytes: %v", q.id, layer, start, end, len(raw), err)
	}
	k.last = s.now()
	return nil
}

// Commit hands the staged KV to the batch (batch.Arrived, or in the Join
// of the Generate call that claims the request); the batch imports it
// into the engine when the sequence joins. Returning
// nil acknowledges the transfer: the KV is received and held here, so the
// prefill worker may drop its copy (it keeps it for Resend until Release
// anyway). Errors: ABORTED when the request ended, INTERNAL when a layer
// lacks KV, INVALID_ARGUMENT for a first token outside the vocabulary.
func (k *sink) Commit(c kvtransfer.Commit) error { return k.commit(c) }

// commit is Commit: the staging is handed over (its lock), then the
// transfer committed under rx.mu.
func (k *sink) commit(c kvtransfer.Commit) error {
	s, q := k.s, k.q
	// Write, Commit and Abort of a transfer come one at a time: nothing
	// is staged meanwhile; only the request's end may free the staging.
	x, err := k.st.handOver(k.h)
	switch {
	case errors.Is(err, errFreed):
		return k.errGone()
	case err != nil:
		return err
	}
	s.rx.mu.Lock()
	defer s.rx.mu.Unlock()
	if q.ended || q.sink != k {
		// Ended meanwhile: drop freed (or frees) the staging.
		return k.errGone()
	}
	if c.FirstToken < 0 || int(c.FirstToken) >= s.spec.Vocab {
		return status.Errorf(codes.InvalidArgument, "decode: first token %d of %s outside the vocabulary", c.FirstToken, q.id)
	}
	q.sink = nil
	// An unclaimed reservation keeps its TTL: received KV does not keep it
	// alive when no Generate call comes for it.
	q.committed = true
	q.kvTokens = k.h.Tokens
	if k.h.Start > 0 {
		s.kvSaved.Add(int64(k.h.Start) * int64(s.spec.KVBytesPerToken()))
	}
	x.Tokens, x.First, x.FirstByte, x.Done = k.h.Tokens, c.FirstToken, q.firstByte, k.last
	// KV its sender pulled and did not check is never cached here.
	x.Unverified = c.Unverified()
	if c.FirstLogprob != nil {
		lp := wire.FromTokenLogprob(c.FirstLogprob)
		x.FirstLP = &lp
	}
	if !q.claimed {
		// Held here until a Generate call claims it (and hands it to the
		// batch in its Join) or the request ends (drop frees it).
		q.held = x
		return nil
	}
	// Claimed: the service handed, or is handing, the request to the
	// batch. Posted under rx.mu, so that it reaches the batch before the
	// Cancel of the request's end (posted after drop: Server.unlock).
	s.b.Post(batch.Arrived(q.key, x))
	return nil
}

// Abort frees the KV staged so far. A Generate call waiting for it ends
// with ABORTED, and so does one that comes later, unless a new transfer
// began in between; the reservation stays until Cancel or its TTL.
func (k *sink) Abort(err error) {
	s, q := k.s, k.q
	s.rx.mu.Lock()
	if q.ended || q.sink != k {
		// Ended (drop freed the staging) or committed (the staging
		// is the sequence's now).
		s.rx.mu.Unlock()
		return
	}
	q.sink = nil
	q.xferErr = err
	if err == nil {
		q.xferErr = errors.New("aborted")
	}
	claimed := q.claimed
	s.rx.mu.Unlock()
	k.st.free()
	if claimed {
		// Its KV never committed, so it never joined the batch. An attach
		// that claims q after the unlock sees xferErr and ends it itself.
		s.end(q, status.Errorf(codes.Aborted, "decode: kv transfer of %s failed: %v", q.id, fmt.Sprint(err)))
	}
}
