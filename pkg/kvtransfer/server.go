package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// Metrics observes finished transfers on the server. Implementations must be
// safe for concurrent use.
type Metrics interface {
	// TransferDone is called once per Push call, when it ends.
	TransferDone(TransferStats)
}

// MetricsFunc adapts a function to Metrics.
type MetricsFunc func(TransferStats)

// TransferDone calls f(s).
func (f MetricsFunc) TransferDone(s TransferStats) { f(s) }

// TransferStats describes one finished Push call.
type TransferStats struct {
	RequestID string        // empty when no valid header arrived
	Codec     string        // codec name from the header
	BytesRaw  int64         // canonical bytes decoded
	BytesWire int64         // frame bytes received
	Frames    int           // frames received
	Duration  time.Duration // from the call's start to its end
	Code      codes.Code    // OK when committed
}

// acceptedKey is the response header that tells the sender Begin accepted
// the transfer.
const acceptedKey = "pdkv-accepted"

// GRPCServerOptions returns the grpc.Server options the transport needs on
// the decode worker: a receive limit that fits a frame of the max frame
// bytes (see WithMaxFrameBytes; default DefaultMaxFrameBytes) and large
// flow-control windows. They apply to every service of that server.
func GRPCServerOptions(opts ...ServerOption) []grpc.ServerOption {
	o := newServerOptions(opts)
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxMessageBytes(o.maxFrame)),
		grpc.InitialWindowSize(DefaultWindowBytes),
		grpc.InitialConnWindowSize(DefaultConnWindowBytes),
		grpc.ReadBufferSize(ioBufferBytes),
		grpc.WriteBufferSize(ioBufferBytes),
		// Received HTTP/2 data frames go to a pool that does not clear
		// buffers gRPC is about to overwrite.
		experimental.BufferPool(&bufs),
	}
}

func newServerOptions(opts []ServerOption) serverOptions {
	o := serverOptions{
		logger:   zap.NewNop(),
		maxFrame: DefaultMaxFrameBytes,
		now:      time.Now,
	}
	for _, opt := range opts {
		opt.applyServer(&o)
	}
	return o
}

// Register serves KVTransferService on s, handing transfers to r (nil: a
// worker that receives none, a prefill worker serving only Pull), whose
// engine stores KV of dtype (its engine.ModelSpec.KVDType): the server
// refuses a transfer whose codec cannot code dtype, and any frame of
// another dtype, with INVALID_ARGUMENT; with a dtype that is not a known
// one it fails every transfer with INTERNAL. Build s with GRPCServerOptions
// (same ServerOptions) so gRPC accepts frames of the max frame bytes.
func Register(s grpc.ServiceRegistrar, r Receiver, dtype engine.DType, opts ...ServerOption) {
	pdservev1.RegisterKVTransferServiceServer(s, &server{r: r, dtype: dtype, o: newServerOptions(opts)})
}

type server struct {
	pdservev1.UnimplementedKVTransferServiceServer
	r     Receiver
	dtype engine.DType // the receiver's KV
	o     serverOptions
}

// Push serves one transfer. It reads messages with its own inMsg type, so
// the wire codec hands frames over without a protobuf copy; a client using
// another content subtype (plain protobuf) is served too, with one copy.
func (sv *server) Push(stream grpc.ClientStreamingServer[pdservev1.PushRequest, pdservev1.PushResponse]) error {
	if sv.r == nil {
		return status.Error(codes.Unimplemented, "kvtransfer: this worker receives no KV pushes")
	}
	t := transfer{
		sv:     sv,
		stream: stream,
		start:  sv.o.now(),
		fast:   usesWireCodec(stream.Context()),
	}
	defer t.msg.release()
	err := t.run()
	code := codes.OK
	if err != nil {
		err = toStatus(err)
		code = status.Code(err)
		lvl := zap.DebugLevel
		if code == codes.Internal || code == codes.Unknown {
			lvl = zap.WarnLevel
		}
		sv.o.logger.Log(lvl, "kvtransfer: transfer failed", zap.String("request_id", t.h.RequestID), zap.Stringer("code", code), zap.Error(err))
	}
	if sv.o.metrics != nil {
		sv.o.metrics.TransferDone(TransferStats{
			RequestID: t.h.RequestID,
			Codec:     t.h.Codec,
			BytesRaw:  t.bytesRaw,
			BytesWire: t.bytesWire,
			Frames:    t.frames,
			Duration:  sv.o.now().Sub(t.start),
			Code:      code,
		})
	}
	return err
}

// usesWireCodec reports whether the call's content subtype is CodecName.
func usesWireCodec(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, ct := range md.Get("content-type") {
		ct = strings.ToLower(ct)
		if sub, ok := strings.CutPrefix(ct, "application/grpc+"); ok && strings.TrimSpace(strings.SplitN(sub, ";", 2)[0]) == CodecName {
			return true
		}
	}
	return false
}

// transfer is the state of one Push call.
type transfer struct {
	sv     *server
	stream grpc.ClientStreamingServer[pdservev1.PushRequest, pdservev1.PushResponse]
	start  time.Time
	fast   bool

	h     StreamHeader
	codec codec.Codec
	sink  Sink
	next  []int // per layer: the first token not received yet
	msg   inMsg // reused for every message

	firstByte           time.Time
	bytesRaw, bytesWire int64
	frames              int
}

// errInvalid wraps a protocol violation of the sender (INVALID_ARGUMENT).
func errInvalid(format string, a ...any) error {
	return status.Errorf(codes.InvalidArgument, "kvtransfer: "+format, a...)
}

func (t *transfer) recv() error {
	if t.fast {
		return t.stream.RecvMsg(&t.msg)
	}
	t.msg.release()
	req, err := t.stream.Recv()
	if err != nil {
		return err
	}
	switch x := req.GetMsg().(type) {
	case *pdservev1.PushRequest_Header:
		t.msg.header = x.Header
	case *pdservev1.PushRequest_Commit:
		t.msg.commit = x.Commit
	case *pdservev1.PushRequest_Frame:
		t.msg.frame = x.Frame
	default:
		return errInvalid("push message is empty")
	}
	return nil
}

func (t *transfer) run() (err error) {
	if err := t.recv(); err != nil {
		if errors.Is(err, io.EOF) {
			return errInvalid("stream closed before its header")
		}
		return err
	}
	if t.msg.header == nil {
		return errInvalid("first message is not a header")
	}
	if !t.sv.dtype.Valid() {
		return status.Errorf(codes.Internal, "kvtransfer: receiver kv dtype %v is not a known dtype", t.sv.dtype)
	}
	t.h = headerFromProto(t.msg.header)
	t.h.DType = t.sv.dtype // every frame must carry the receiver's
	if err := t.h.Validate(); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	c, err := codec.ByName(t.h.Codec)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if err := c.Supports(t.h.DType); err != nil {
		return status.Errorf(codes.InvalidArgument, "kvtransfer: receiver kv is %v: %v", t.h.DType, err)
	}
	t.codec = c

	sink, err := t.sv.r.Begin(t.stream.Context(), t.h)
	if err != nil {
		return fmt.Errorf("kvtransfer: begin %s: %w", t.h.RequestID, err)
	}
	t.sink = sink
	// Only now, with the layer count checked by the receiver against its
	// model, is per-layer state allocated: a header may claim 2³¹ layers.
	t.next = make([]int, t.h.Layers)
	for l := range t.next {
		t.next[l] = t.h.Start
	}
	committed := false
	defer func() {
		if !committed {
			t.sink.Abort(err)
		}
	}()
	if err := t.stream.SendHeader(metadata.Pairs(acceptedKey, "1")); err != nil {
		return err
	}
	for {
		if err := t.recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return errInvalid("stream closed before commit")
			}
			return err
		}
		switch {
		case t.msg.frame != nil:
			err := t.frame(t.msg.frame)
			t.msg.release()
			if err != nil {
				return err
			}
		case t.msg.commit != nil:
			ack, err := t.commit(Commit{FirstToken: t.msg.commit.GetFirstToken(), FirstLogprob: t.msg.commit.GetFirstLogprob(), Provenance: t.msg.commit.GetProvenance()})
			if err != nil {
				return err
			}
			committed = true
			return t.stream.SendAndClose(ack)
		default:
			return errInvalid("header sent twice")
		}
	}
}

// frame checks one frame against the stream's header before decoding it,
// decodes it and hands it to the sink.
func (t *transfer) frame(frame []byte) error {
	if t.frames == 0 {
		t.firstByte = t.sv.o.now()
	}
	t.frames++
	t.bytesWire += int64(len(frame))
	fh, n, err := codec.PeekHeader(frame, t.sv.o.maxFrame)
	if err != nil {
		return errInvalid("frame %d: %v", t.frames, err)
	}
	if n != len(frame) {
		return errInvalid("frame %d: %d bytes after the frame", t.frames, len(frame)-n)
	}
	if err := t.check(fh); err != nil {
		return errInvalid("frame %d: %v", t.frames, err)
	}
	// Only now is the payload decoded, into at most RawLen bytes.
	rawLen := int(fh.RawLen)
	var raw []byte
	if fh.Codec == codec.None {
		// The payload is the raw KV: hand it over in place once its
		// CRC-32C checks out, instead of copying it.
		payload := frame[codec.HeaderLen(fh.RequestID):n]
		if len(payload) != rawLen {
			return errInvalid("frame %d: %d payload bytes for %d raw: %v", t.frames, len(payload), rawLen, codec.ErrCorrupt)
		}
		if crc32.Checksum(payload, castagnoli) != fh.Checksum {
			return errInvalid("frame %d: %v", t.frames, codec.ErrChecksum)
		}
		raw = payload
	} else {
		bp := bufs.Get(rawLen)
		defer bufs.Put(bp)
		if _, raw, _, err = codec.DecodeFrame((*bp)[:0], frame, rawLen); err != nil {
			return errInvalid("frame %d: %v", t.frames, err)
		}
	}
	layer, start, end := int(fh.Layer), int(fh.Start), int(fh.End)
	if err := t.sink.Write(layer, start, end, raw); err != nil {
		return fmt.Errorf("kvtransfer: write layer %d [%d,%d): %w", layer, start, end, err)
	}
	t.next[layer] = end
	t.bytesRaw += int64(rawLen)
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// check bounds a frame header by the stream header: the right request,
// codec and dtype (the receiver's), a layer that exists, the next token range of that layer
// within [Start, Tokens), and exactly (End−Start) × TokenBytes raw bytes, at
// most the max frame bytes.
func (t *transfer) check(fh codec.Header) error {
	switch {
	case fh.RequestID != t.h.RequestID:
		return fmt.Errorf("request id %q, stream is %q", fh.RequestID, t.h.RequestID)
	case fh.Codec != t.codec.ID():
		return fmt.Errorf("codec %d, stream uses %s (%d)", fh.Codec, t.codec.Name(), t.codec.ID())
	case fh.DType != t.h.DType:
		return fmt.Errorf("dtype %v, receiver kv is %v", fh.DType, t.h.DType)
	case int64(fh.Layer) >= int64(t.h.Layers):
		return fmt.Errorf("layer %d, stream has %d", fh.Layer, t.h.Layers)
	case int64(fh.Start) != int64(t.next[fh.Layer]):
		return fmt.Errorf("layer %d starts at token %d, next token is %d", fh.Layer, fh.Start, t.next[fh.Layer])
	case fh.End <= fh.Start || int64(fh.End) > int64(t.h.Tokens):
		return fmt.Errorf("layer %d token range [%d,%d) outside [0,%d)", fh.Layer, fh.Start, fh.End, t.h.Tokens)
	case int64(fh.RawLen) != int64(fh.End-fh.Start)*int64(t.h.TokenBytes):
		return fmt.Errorf("layer %d [%d,%d): raw length %d, want %d", fh.Layer, fh.Start, fh.End, fh.RawLen, int64(fh.End-fh.Start)*int64(t.h.TokenBytes))
	case int64(fh.RawLen) > int64(t.sv.o.maxFrame):
		return fmt.Errorf("raw length %d above the max frame bytes %d", fh.RawLen, t.sv.o.maxFrame)
	}
	return nil
}

func (t *transfer) commit(c Commit) (*pdservev1.PushResponse, error) {
	for l, n := range t.next {
		if n != t.h.Tokens {
			return nil, errInvalid("commit: layer %d has %d of %d tokens", l, n, t.h.Tokens)
		}
	}
	if err := t.sink.Commit(c); err != nil {
		return nil, fmt.Errorf("kvtransfer: commit %s: %w", t.h.RequestID, err)
	}
	return &pdservev1.PushResponse{
		BytesRaw:          t.bytesRaw,
		BytesWire:         t.bytesWire,
		FirstByteUnixNano: unixNanoOf(t.firstByte),
		DoneUnixNano:      unixNanoOf(t.sv.o.now()),
	}, nil
}

// toStatus maps an error to the gRPC status the sender sees: a status
// (possibly wrapped) keeps its code and gets the full message, context
// errors become CANCELED or DEADLINE_EXCEEDED, anything else INTERNAL.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return s.Err() // carries err's full message
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
