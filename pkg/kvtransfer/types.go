package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"time"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// StreamHeader opens a transfer and bounds every frame that follows it.
type StreamHeader struct {
	RequestID  string // at most 255 bytes, not empty
	Codec      string // codec name of pkg/kv/codec ("none", "s2", "zstd", "bf16", "fp8", "int8", or an alias such as "f16")
	Layers     int    // > 0; frames carry layer in [0, Layers)
	Tokens     int    // > 0; prompt tokens whose KV is sent: frames cover [0, Tokens) in every layer
	TokenBytes int    // > 0; canonical bytes of one token in one layer (engine.ModelSpec.KVTokenBytes)
	// Start is the first token whose KV is sent, in [0, Tokens): the
	// receiver already holds the KV of [0, Start) (a prefix cache hit it
	// reported at Reserve), and frames cover [Start, Tokens) in every
	// layer, the first one starting at Start.
	Start int
	// DType is the element type of the KV (engine.ModelSpec.KVDType), a
	// known dtype that the codec takes. The sender labels every frame
	// with it; it is not part of the stream header on the wire. On the
	// server it is the receiver's own KV dtype (see Register), which every
	// frame must carry.
	DType engine.DType
}

// Validate reports ErrBadHeader, wrapped with detail, when h cannot open a
// transfer. It does not check that the codec exists or takes the dtype.
func (h StreamHeader) Validate() error {
	switch {
	case h.RequestID == "" || len(h.RequestID) > codec.MaxRequestID:
		return fmt.Errorf("%w: request id must have 1 to %d bytes, has %d", ErrBadHeader, codec.MaxRequestID, len(h.RequestID))
	case h.Layers <= 0 || h.Tokens <= 0 || h.TokenBytes <= 0:
		return fmt.Errorf("%w: layers %d, tokens %d, token bytes %d must be positive", ErrBadHeader, h.Layers, h.Tokens, h.TokenBytes)
	case h.Layers > maxInt32 || h.Tokens > maxInt32 || h.TokenBytes > maxInt32:
		return fmt.Errorf("%w: layers %d, tokens %d, token bytes %d must fit in 32 bits", ErrBadHeader, h.Layers, h.Tokens, h.TokenBytes)
	case h.Start < 0 || h.Start >= h.Tokens:
		return fmt.Errorf("%w: start token %d outside [0, %d)", ErrBadHeader, h.Start, h.Tokens)
	case !h.DType.Valid():
		return fmt.Errorf("%w: kv dtype %v (want bf16, f16 or q8_0)", ErrBadHeader, h.DType)
	}
	return nil
}

const maxInt32 = 1<<31 - 1

func (h StreamHeader) proto() *pdservev1.KVStreamHeader {
	return &pdservev1.KVStreamHeader{
		RequestId:  h.RequestID,
		Codec:      h.Codec,
		Layers:     int32(h.Layers),
		Tokens:     int32(h.Tokens),
		TokenBytes: int32(h.TokenBytes),
		StartToken: int32(h.Start),
	}
}

func headerFromProto(p *pdservev1.KVStreamHeader) StreamHeader {
	return StreamHeader{
		RequestID:  p.GetRequestId(),
		Codec:      p.GetCodec(),
		Layers:     int(p.GetLayers()),
		Tokens:     int(p.GetTokens()),
		TokenBytes: int(p.GetTokenBytes()),
		Start:      int(p.GetStartToken()),
	}
}

// Commit closes a transfer successfully.
type Commit struct {
	FirstToken int32 // the token the prefill worker sampled after the prompt
	// FirstLogprob is FirstToken's log-probability, or nil when the
	// request asked for none.
	FirstLogprob *pdservev1.TokenLogprob
	// Provenance says where the pushed KV came from (UNSPECIFIED, from a
	// sender that predates it, reads as COMPUTED): a receiver caches none
	// of KV pulled by the sender and not verified (Unverified).
	Provenance pdservev1.KVProvenance
}

// Unverified reports whether c's KV was, in part, pulled by its sender
// from a peer without a spot check: it serves its own request only.
func (c Commit) Unverified() bool {
	return c.Provenance == pdservev1.KVProvenance_KV_PROVENANCE_PULLED_UNVERIFIED
}

// Ack is the receiver's answer once all KV was imported.
type Ack struct {
	BytesRaw  int64     // canonical (decoded) KV bytes received
	BytesWire int64     // frame bytes received (frame headers and encoded payloads)
	FirstByte time.Time // first frame arrived; receiver clock
	Done      time.Time // commit processed; receiver clock
}

func ackFromProto(p *pdservev1.PushResponse) Ack {
	return Ack{
		BytesRaw:  p.GetBytesRaw(),
		BytesWire: p.GetBytesWire(),
		FirstByte: unixNano(p.GetFirstByteUnixNano()),
		Done:      unixNano(p.GetDoneUnixNano()),
	}
}

func unixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func unixNanoOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Receiver accepts transfers on the decode worker. Implementations must be
// safe for concurrent use: every stream calls Begin from its own goroutine.
type Receiver interface {
	// Begin is called when a transfer opens, before any frame is decoded,
	// with a header that passed StreamHeader.Validate and names a known
	// codec that takes the receiver's KV dtype (h.DType). ctx ends when the stream ends (also when the sender cancels);
	// a Sink that may block must watch it. It fails with a gRPC status:
	// FAILED_PRECONDITION when no reservation exists for the request,
	// RESOURCE_EXHAUSTED when the header exceeds the reservation; an error
	// without a status reaches the sender as INTERNAL. The header comes
	// from the network (Layers and Tokens up to 2³¹−1): Begin must check
	// it against what it expects (the model's layers, the reservation)
	// before allocating by it; the server allocates per layer only once
	// Begin accepted it.
	Begin(ctx context.Context, h StreamHeader) (Sink, error)
}

// Sink takes one transfer's KV. Its methods are called from the stream's
// goroutine, one at a time. After Begin returned it, exactly one of these
// ends it: Commit returns nil, or Abort is called once (also after a Write
// or Commit that failed); no method is called after that.
type Sink interface {
	// Write stores the canonical KV of layer for tokens [start, end).
	// Frames arrive in token order within each layer, starting at the
	// header's Start, so every layer's start is Start plus its count so
	// far; layers may interleave.
	// raw is owned by the caller and valid only during the call;
	// len(raw) == (end-start) × TokenBytes. An error with a gRPC status
	// reaches the sender as is, any other as INTERNAL.
	Write(layer, start, end int, raw []byte) error
	// Commit is called once every layer holds the KV of [Start, Tokens).
	Commit(c Commit) error
	// Abort tells the sink the transfer failed or was cancelled: free
	// everything it holds. err says why.
	Abort(err error)
}

// Errors returned by this package, wrapped with detail; match with
// errors.Is. Errors that came from the other side of a stream also carry
// their gRPC status (status.Code works on the wrapped error).
var (
	// ErrBadHeader: a StreamHeader is not valid.
	ErrBadHeader = errors.New("kvtransfer: invalid stream header")
	// ErrBadChunk: Send was called with a layer, range or length outside the
	// header's bounds, or out of order.
	ErrBadChunk = errors.New("kvtransfer: chunk outside the stream's bounds")
	// ErrAborted: the Sender was aborted (the cause is wrapped too).
	ErrAborted = errors.New("kvtransfer: transfer aborted")
	// ErrFinished: the Sender was already committed or failed.
	ErrFinished = errors.New("kvtransfer: transfer already finished")
	// ErrClosed: the Dialer was closed.
	ErrClosed = errors.New("kvtransfer: dialer closed")
	// ErrIncomplete: Commit before every layer held all Tokens of KV.
	ErrIncomplete = errors.New("kvtransfer: commit before all KV was sent")
)
