package kvtransfer

import (
	"context"
	"fmt"
	"github.com/pdserve/pdserve/pkg/grpcauth"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// TierMigration is the PullHeader tier of a PullSequence stream.
const TierMigration = "migration"

// SequenceKV is a migrated sequence's KV a SequenceSource serves: per
// layer, the canonical KV of tokens [0, Tokens) (all K rows, then all V
// rows).
type SequenceKV struct {
	Tokens int
	Layers [][]byte
}

// SequenceSource is what a worker serves PullSequence from: the
// sequences it moved out (a live migration).
type SequenceSource interface {
	// TakeSequence returns the KV of migrated request id, which the
	// stream then sends; done(sent) tells the source whether it went out
	// whole (the source may then drop it; otherwise it keeps it for
	// another pull). An error with a gRPC status (NOT_FOUND for an id it
	// does not hold) is sent as is.
	TakeSequence(ctx context.Context, id string) (x SequenceKV, done func(sent bool), err error)
}

// WithSequenceSource makes the server answer PullSequence from src
// (without it: UNIMPLEMENTED).
func WithSequenceSource(src SequenceSource) ServerOption {
	return serverFunc(func(o *serverOptions) { o.seqs = src })
}

// PullSequence serves one migration pull.
func (sv *server) PullSequence(req *pdservev1.PullSequenceRequest, stream grpc.ServerStreamingServer[pdservev1.PullSequenceResponse]) error {
	return sv.served("kvtransfer: sequence pull failed", req.GetRequestId(), sv.pullSequence(req, stream))
}

func (sv *server) pullSequence(req *pdservev1.PullSequenceRequest, stream grpc.ServerStreamingServer[pdservev1.PullSequenceResponse]) error {
	src := sv.o.seqs
	if src == nil {
		return status.Error(codes.Unimplemented, "kvtransfer: this worker serves no sequence pulls")
	}
	id := req.GetRequestId()
	if id == "" || len(id) > codec.MaxRequestID {
		return errInvalid("pull sequence: request_id must have 1 to %d bytes", codec.MaxRequestID)
	}
	name := req.GetCodec()
	if name == "" {
		name = "none"
	}
	c, err := codec.ByName(name)
	if err != nil {
		return errInvalid("pull sequence %s: %v", id, err)
	}
	if err := c.Supports(sv.dtype); err != nil {
		return errInvalid("pull sequence %s: %v", id, err)
	}
	if err := grpcauth.CheckPullSequence(stream.Context(), id); err != nil {
		// A signed migration credential reads the one sequence it names.
		return status.Errorf(codes.PermissionDenied, "kvtransfer: pull sequence %s: %v", id, err)
	}
	x, done, err := src.TakeSequence(stream.Context(), id)
	if err != nil {
		if s, ok := status.FromError(err); ok {
			return s.Err()
		}
		return status.Errorf(codes.Internal, "kvtransfer: pull sequence %s: %v", id, err)
	}
	sent := false
	defer func() { done(sent) }()
	if x.Tokens <= 0 || len(x.Layers) == 0 {
		return status.Errorf(codes.Internal, "kvtransfer: pull sequence %s: no KV held", id)
	}
	tokenBytes := len(x.Layers[0]) / x.Tokens
	if err := stream.Send(&pdservev1.PullSequenceResponse{Msg: &pdservev1.PullSequenceResponse_Header{Header: &pdservev1.PullHeader{
		Tokens: int32(x.Tokens), Layers: int32(len(x.Layers)), TokenBytes: int32(tokenBytes), Tier: TierMigration,
	}}}); err != nil {
		return err
	}
	step := max(sv.o.maxFrame/max(tokenBytes, 1), 1)
	var buf, raw []byte
	for l, data := range x.Layers {
		for s := 0; s < x.Tokens; s += step {
			e := min(x.Tokens, s+step)
			raw = appendRange(raw[:0], data, x.Tokens, s, e)
			buf, err = codec.AppendFrame(buf[:0], codec.Header{RequestID: id, Layer: uint32(l), Start: uint32(s), End: uint32(e), DType: sv.dtype}, c, raw)
			if err != nil {
				return fmt.Errorf("kvtransfer: pull sequence %s: layer %d: %w", id, l, err)
			}
			if err := stream.Send(&pdservev1.PullSequenceResponse{Msg: &pdservev1.PullSequenceResponse_Frame{Frame: buf}}); err != nil {
				return err
			}
		}
	}
	sent = true
	return nil
}

// SequencePull is one migration pull.
type SequencePull struct {
	// RequestID is the migrated request's id.
	RequestID string
	// Addr, ID and Role are the source worker's gRPC address, heartbeat
	// id and role (for WithPullTLS).
	Addr, ID, Role string
	// MaxTokens bounds the sequence (its prompt and output): a source
	// that announces more is refused before anything is allocated.
	MaxTokens int
	// Codec names the frames' codec ("" or "none": raw).
	Codec string
	// Spec and TokenBytes are as PullRequest's.
	Spec       engine.ModelSpec
	TokenBytes int
}

// PullSequence pulls the KV of migrated request r.RequestID from the
// worker at r.Addr, checked as Pull checks a prefix (every frame's
// CRC-32C, request id, dtype, layer, token ranges in order and complete,
// the puller's layers and token bytes), and paced as Pull is.
func (d *Dialer) PullSequence(ctx context.Context, r SequencePull) (Pulled, error) {
	t0 := d.o.now()
	fail := func(err error) (Pulled, error) {
		return Pulled{}, fmt.Errorf("kvtransfer: pull sequence %s from %s: %w", r.RequestID, r.Addr, err)
	}
	cl, pool, err := d.client(r.Addr, r.ID, r.Role)
	if err != nil {
		return fail(err)
	}
	defer d.release(pool)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cl.PullSequence(ctx, &pdservev1.PullSequenceRequest{RequestId: r.RequestID, Codec: r.Codec})
	if err != nil {
		return fail(err)
	}
	first, err := stream.Recv()
	if err != nil {
		return fail(err)
	}
	firstByte := d.o.now().Sub(t0)
	h := first.GetHeader()
	n, tb := int(h.GetTokens()), r.Spec.KVTokenBytes()
	if r.TokenBytes > 0 {
		tb = r.TokenBytes
	}
	switch {
	case h == nil:
		return fail(fmt.Errorf("%w: no header first", ErrPullIncomplete))
	case n <= 0 || n > r.MaxTokens:
		return fail(fmt.Errorf("%w: %d tokens, want 1 to %d", ErrPullIncomplete, n, r.MaxTokens))
	case int(h.GetLayers()) != r.Spec.Layers || int(h.GetTokenBytes()) != tb:
		return fail(fmt.Errorf("%w: %d layers of %d bytes a token, want %d of %d", ErrPullIncomplete, h.GetLayers(), h.GetTokenBytes(), r.Spec.Layers, tb))
	}
	p, err := d.receive(ctx, t0, Pulled{PrefixKV: PrefixKV{Tokens: n, Tier: h.GetTier()}, FirstByte: firstByte}, tb, r.RequestID, r.Spec, func() ([]byte, error) {
		m, err := stream.Recv()
		return m.GetFrame(), err
	})
	if err != nil {
		return fail(err)
	}
	return p, nil
}
