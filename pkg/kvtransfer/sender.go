package kvtransfer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// Sender streams one request's KV to a decode worker. Send and Commit must
// be called from one goroutine at a time; Abort and the byte counters may be
// called from any goroutine. Once Commit returned, or any call failed, the
// Sender is finished and its stream released.
type Sender struct {
	d      *Dialer
	h      StreamHeader
	codec  codec.Codec
	stream grpc.ClientStreamingClient[pdservev1.PushRequest, pdservev1.PushResponse]
	ctx    context.Context // the stream's; cancelled when the Sender finishes
	cancel context.CancelCauseFunc

	next []int // per layer: the first token not sent yet
	err  error // sticky: set when the Sender finished

	abortOnce sync.Once

	bytesRaw, bytesWire, charged atomic.Int64
	encodeNanos                  atomic.Int64 // time spent in codec.AppendFrame
}

// Header returns the header the transfer was opened with.
func (s *Sender) Header() StreamHeader { return s.h }

// BytesRaw returns the canonical KV bytes sent so far.
func (s *Sender) BytesRaw() int64 { return s.bytesRaw.Load() }

// BytesWire returns the frame bytes (headers and encoded payloads) sent so far.
func (s *Sender) BytesWire() int64 { return s.bytesWire.Load() }

// EncodeTime returns the time Send spent encoding frames so far (by the
// Dialer's clock), so that a caller can tell coding time from network
// time.
func (s *Sender) EncodeTime() time.Duration { return time.Duration(s.encodeNanos.Load()) }

// ChargedBytes returns the wire bytes the transfer stands for on a real
// deployment: Σ fullBytes × wire/raw over every Send. It equals BytesWire
// when no Send passed a fullBytes.
func (s *Sender) ChargedBytes() int64 { return s.charged.Load() }

// Send encodes the canonical KV of layer for tokens [start, end), of the
// header's DType, with the transfer's codec and sends it as one or more frames (chunks larger than
// the Dialer's max frame bytes are split by tokens). Within a layer, chunks
// must come in token order from token 0; layers may interleave. raw may be
// reused once Send returns.
//
// fullBytes is the size the chunk stands for (0 means len(raw)); with
// pacing (WithLinkGbps) Send returns no earlier than fullBytes × wire/raw
// bytes would have crossed the link.
//
// Errors: ErrBadChunk (the Sender stays usable); otherwise the Sender is
// finished: ErrAborted (with the cause given to Abort), the Open context's
// error, a codec error, or the worker's gRPC status (INVALID_ARGUMENT,
// CANCELED, ...), wrapped with the layer. Calls on a finished Sender return
// ErrFinished wrapping the reason it finished.
func (s *Sender) Send(layer, start, end int, raw []byte, fullBytes int) error {
	s.checkCtx()
	if s.err != nil {
		return fmt.Errorf("kvtransfer: send layer %d: %w: %w", layer, ErrFinished, s.err)
	}
	if err := s.checkChunk(layer, start, end, raw); err != nil {
		return err
	}
	t0 := s.d.o.now()
	tb := s.h.TokenBytes
	step := max(1, s.d.o.maxFrame/tb) // tokens per frame
	wire := 0
	for t := start; t < end; t += step {
		e := min(end, t+step)
		n, err := s.sendFrame(layer, t, e, raw[(t-start)*tb:(e-start)*tb])
		if err != nil {
			err = fmt.Errorf("kvtransfer: send layer %d [%d,%d): %w", layer, t, e, err)
			s.finish(err)
			return err
		}
		wire += n
	}
	s.next[layer] = end
	s.bytesRaw.Add(int64(len(raw)))
	s.bytesWire.Add(int64(wire))
	if fullBytes <= 0 {
		fullBytes = len(raw)
	}
	charge := chargeBytes(fullBytes, len(raw), wire)
	s.charged.Add(int64(charge))
	if s.d.link == nil {
		return nil
	}
	// The link is booked from when Send began, and Send waits until the
	// bytes would have crossed it: time spent encoding and sending counts.
	until := s.d.link.charge(t0, charge)
	if wait := until.Sub(s.d.o.now()); wait > 0 {
		if err := s.d.o.sleep(s.ctx, wait); err != nil {
			err = fmt.Errorf("kvtransfer: send layer %d: pacing: %w", layer, s.streamCause(err))
			s.finish(err)
			return err
		}
	}
	return nil
}

func (s *Sender) checkChunk(layer, start, end int, raw []byte) error {
	switch {
	case layer < 0 || layer >= s.h.Layers:
		return fmt.Errorf("%w: layer %d, stream has %d", ErrBadChunk, layer, s.h.Layers)
	case start != s.next[layer]:
		return fmt.Errorf("%w: layer %d starts at token %d, next token is %d", ErrBadChunk, layer, start, s.next[layer])
	case end <= start || end > s.h.Tokens:
		return fmt.Errorf("%w: layer %d token range [%d,%d) outside [0,%d)", ErrBadChunk, layer, start, end, s.h.Tokens)
	case len(raw) != (end-start)*s.h.TokenBytes:
		return fmt.Errorf("%w: layer %d [%d,%d): %d bytes, want %d", ErrBadChunk, layer, start, end, len(raw), (end-start)*s.h.TokenBytes)
	}
	return nil
}

// sendFrame frames raw into a pooled buffer and hands it to gRPC, which
// returns the buffer to the pool once written. It returns the frame length.
func (s *Sender) sendFrame(layer, start, end int, raw []byte) (int, error) {
	size := maxFramePrefix + codec.HeaderLen(s.h.RequestID) + len(raw)
	if s.codec.ID() != codec.None {
		size += len(raw)/16 + 512 // room for an incompressible payload
	}
	bp := bufs.Get(size)
	h := codec.Header{
		RequestID: s.h.RequestID,
		Layer:     uint32(layer),
		Start:     uint32(start),
		End:       uint32(end),
		DType:     s.h.DType,
	}
	// The frame goes after room for the message prefix, which is written
	// right-aligned in front of it once the frame's length is known.
	t0 := s.d.o.now()
	out, err := codec.AppendFrame((*bp)[:maxFramePrefix], h, s.codec, raw)
	s.encodeNanos.Add(int64(s.d.o.now().Sub(t0)))
	if err != nil {
		bufs.Put(bp)
		return 0, err
	}
	n := len(out) - maxFramePrefix
	var pre [maxFramePrefix]byte
	pre[0] = frameTag
	k := 1 + binary.PutUvarint(pre[1:], uint64(n))
	off := maxFramePrefix - k
	copy(out[off:], pre[:k])
	*bp = out // AppendFrame may have grown it; the pool takes either back
	root := mem.NewBuffer(bp, &bufs)
	msg := &outFrame{buf: root.Slice(off, len(out))}
	root.Free() // the slice holds the buffer now
	if err := s.stream.SendMsg(msg); err != nil {
		if msg.buf != nil { // not marshaled: still ours
			msg.buf.Free()
		}
		return 0, s.streamErr(err)
	}
	return n, nil
}

// Commit sends c, half-closes the stream and waits for the worker's Ack.
// It finishes the Sender, successful or not. If ctx ends first, the
// transfer is aborted and ctx's error returned.
//
// Errors: ErrIncomplete (some layer lacks tokens; the transfer is
// aborted), ErrFinished (wrapping why), ErrAborted, ctx errors, or the
// worker's gRPC status, wrapped.
func (s *Sender) Commit(ctx context.Context, c Commit) (Ack, error) {
	s.checkCtx()
	if s.err != nil {
		return Ack{}, fmt.Errorf("kvtransfer: commit %s: %w: %w", s.h.RequestID, ErrFinished, s.err)
	}
	for l, n := range s.next {
		if n != s.h.Tokens {
			err := fmt.Errorf("kvtransfer: commit %s: %w: layer %d has %d of %d tokens", s.h.RequestID, ErrIncomplete, l, n, s.h.Tokens)
			s.finish(err)
			return Ack{}, err
		}
	}
	if ctx.Err() != nil {
		err := fmt.Errorf("kvtransfer: commit %s: %w", s.h.RequestID, context.Cause(ctx))
		s.finish(err)
		return Ack{}, err
	}
	stop := context.AfterFunc(ctx, func() { s.cancel(context.Cause(ctx)) })
	defer stop()
	ack, err := s.commit(c)
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		err = fmt.Errorf("kvtransfer: commit %s: %w", s.h.RequestID, err)
		s.finish(err)
		return Ack{}, err
	}
	s.finish(errCommitted)
	return ack, nil
}

func (s *Sender) commit(c Commit) (Ack, error) {
	req := &pdservev1.PushRequest{Msg: &pdservev1.PushRequest_Commit{Commit: &pdservev1.KVCommit{FirstToken: c.FirstToken, FirstLogprob: c.FirstLogprob, Provenance: c.Provenance}}}
	if err := s.stream.SendMsg(req); err != nil {
		return Ack{}, s.streamErr(err)
	}
	resp, err := s.stream.CloseAndRecv()
	if err != nil {
		return Ack{}, s.streamCause(err)
	}
	return ackFromProto(resp), nil
}

// errCommitted is the reason a committed Sender refuses more calls.
var errCommitted = errors.New("committed")

// Abort cancels the transfer: the worker sees CANCELED and frees what it
// received. err (may be nil) is the cause reported by later calls, wrapped
// with ErrAborted. Abort is idempotent, safe to call from any goroutine, and
// a no-op once the Sender finished.
func (s *Sender) Abort(err error) {
	s.abortOnce.Do(func() {
		if err == nil {
			err = ErrAborted
		} else {
			err = fmt.Errorf("%w: %w", ErrAborted, err)
		}
		s.cancel(err)
	})
}

// checkCtx finishes the Sender when its stream context ended (Abort, or
// the context of Open).
func (s *Sender) checkCtx() {
	if s.err == nil && s.ctx.Err() != nil {
		s.finish(context.Cause(s.ctx))
	}
}

// finish ends the Sender with err (sticky) and releases the stream.
func (s *Sender) finish(err error) {
	if s.err == nil {
		s.err = err
	}
	s.cancel(err)
}

// streamErr turns an error of SendMsg into the stream's real status: gRPC
// reports a stream the worker ended as io.EOF on send, and the status on
// receive. sendErr may be nil when the stream is known to have ended.
func (s *Sender) streamErr(sendErr error) error {
	if sendErr != nil && !errors.Is(sendErr, io.EOF) {
		return s.streamCause(sendErr)
	}
	var resp pdservev1.PushResponse
	err := s.stream.RecvMsg(&resp)
	if err == nil || errors.Is(err, io.EOF) {
		return status.Error(codes.Internal, "kvtransfer: worker ended the stream without a status")
	}
	return s.streamCause(err)
}

// streamCause replaces a CANCELED status caused by Abort or by the Open
// context with the cancellation's cause, which wraps ErrAborted or the
// context error.
func (s *Sender) streamCause(err error) error {
	if s.ctx.Err() == nil {
		return err
	}
	cause := context.Cause(s.ctx)
	if cause == nil || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w (%w)", cause, err)
}
