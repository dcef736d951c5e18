package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// MaxPullBlocks is the most block hashes a PullRequest may carry: a
// prompt of 1M tokens in blocks of 16.
const MaxPullBlocks = 1 << 16

// ErrPullIncomplete: a Pull stream ended before every layer held the
// header's tokens, or carried a frame outside them.
var ErrPullIncomplete = errors.New("kvtransfer: pulled KV incomplete or out of order")

// PrefixKV is a cached prefix's KV a PullSource serves.
type PrefixKV struct {
	// Tokens is the prefix: whole blocks; 0 when the source holds fewer
	// than the pull's min blocks.
	Tokens int
	// Tier is where the source read it from ("engine", "host", "disk").
	Tier string
	// Layers holds, per layer, the canonical KV of tokens [0, Tokens)
	// (all K rows, then all V rows).
	Layers [][]byte
}

// PullSource is what a worker serves Pull from: its prefix cache.
type PullSource interface {
	// BlockTokens is the tokens per hashed block of the source's cache.
	BlockTokens() int
	// ExportPrefix returns the KV of the longest prefix of hashes, at
	// most maxBlocks blocks, that the source holds in any tier, when it
	// holds at least minBlocks (≥ 1) of them; Tokens 0 otherwise.
	ExportPrefix(ctx context.Context, hashes []kv.Hash, minBlocks, maxBlocks int) (PrefixKV, error)
}

// WithPullSource makes the server answer Pull from src (without it: the
// worker serves no pulls, UNIMPLEMENTED).
func WithPullSource(src PullSource) ServerOption {
	return serverFunc(func(o *serverOptions) { o.pull = src })
}

// Pull serves one peer pull: the longest cached prefix of the request's
// blocks, as a header and frames of the request's codec.
func (sv *server) Pull(req *pdservev1.PullRequest, stream grpc.ServerStreamingServer[pdservev1.PullResponse]) error {
	return sv.served("kvtransfer: pull failed", req.GetRequestId(), sv.pull(req, stream))
}

// served returns a pull handler's err as a gRPC status, logged as msg:
// at warn for an internal error, at debug for the caller's (a peer gone,
// a credential refused, nothing held).
func (sv *server) served(msg, id string, err error) error {
	if err == nil {
		return nil
	}
	err = toStatus(err)
	lvl := zap.DebugLevel
	if c := status.Code(err); c == codes.Internal || c == codes.Unknown {
		lvl = zap.WarnLevel
	}
	sv.o.logger.Log(lvl, msg, zap.String("request_id", id), zap.Error(err))
	return err
}

func (sv *server) pull(req *pdservev1.PullRequest, stream grpc.ServerStreamingServer[pdservev1.PullResponse]) error {
	src := sv.o.pull
	if src == nil {
		return status.Error(codes.Unimplemented, "kvtransfer: this worker serves no pulls")
	}
	id := req.GetRequestId()
	hs := req.GetBlockHashes()
	switch {
	case id == "" || len(id) > codec.MaxRequestID:
		return errInvalid("pull: request_id must have 1 to %d bytes", codec.MaxRequestID)
	case len(hs) == 0 || len(hs) > MaxPullBlocks:
		return errInvalid("pull %s: %d block hashes, want 1 to %d", id, len(hs), MaxPullBlocks)
	case int(req.GetBlockTokens()) != src.BlockTokens():
		return status.Errorf(codes.FailedPrecondition, "kvtransfer: pull %s: blocks of %d tokens, this worker's are %d", id, req.GetBlockTokens(), src.BlockTokens())
	case req.GetMinBlocks() < 0 || req.GetMaxBlocks() < 0:
		return errInvalid("pull %s: negative min_blocks or max_blocks", id)
	}
	// A signed pull credential reads the one chain it names: not another
	// prompt's prefix, not a forged run of hashes.
	if err := grpcauth.CheckPull(stream.Context(), hs); err != nil {
		return status.Errorf(codes.PermissionDenied, "kvtransfer: pull %s: %v", id, err)
	}
	name := req.GetCodec()
	if name == "" {
		name = "none"
	}
	c, err := codec.ByName(name)
	if err != nil {
		return errInvalid("pull %s: %v", id, err)
	}
	if err := c.Supports(sv.dtype); err != nil {
		return errInvalid("pull %s: %v", id, err)
	}
	hashes := make([]kv.Hash, len(hs))
	for i, h := range hs {
		hashes[i] = kv.Hash(h)
	}
	maxBlocks := len(hashes)
	if m := int(req.GetMaxBlocks()); m > 0 {
		maxBlocks = min(m, maxBlocks)
	}
	x, err := src.ExportPrefix(stream.Context(), hashes, max(int(req.GetMinBlocks()), 1), maxBlocks)
	if err != nil {
		if s, ok := status.FromError(err); ok {
			return s.Err()
		}
		sv.o.logger.Warn("kvtransfer: pull: export failed", zap.String("request_id", id), zap.Error(err))
		return status.Error(codes.Internal, "kvtransfer: pull: the worker could not read its cached KV")
	}
	if x.Tokens <= 0 {
		return stream.Send(&pdservev1.PullResponse{Msg: &pdservev1.PullResponse_Header{Header: &pdservev1.PullHeader{}}})
	}
	tokenBytes := len(x.Layers[0]) / x.Tokens
	if err := stream.Send(&pdservev1.PullResponse{Msg: &pdservev1.PullResponse_Header{Header: &pdservev1.PullHeader{
		Tokens: int32(x.Tokens), Layers: int32(len(x.Layers)), TokenBytes: int32(tokenBytes), Tier: x.Tier,
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
				return fmt.Errorf("kvtransfer: pull %s: layer %d: %w", id, l, err)
			}
			if err := stream.Send(&pdservev1.PullResponse{Msg: &pdservev1.PullResponse_Frame{Frame: buf}}); err != nil {
				return err
			}
		}
	}
	return nil
}

// appendRange appends to dst the canonical KV of tokens [s, e) of data,
// one layer's canonical KV of n tokens (K rows, then V rows).
func appendRange(dst, data []byte, n, s, e int) []byte {
	row := len(data) / (2 * n)
	dst = append(dst, data[s*row:e*row]...)
	return append(dst, data[(n+s)*row:(n+e)*row]...)
}

// PullRequest is one peer pull.
type PullRequest struct {
	// RequestID names the pull in the frames and logs (at most
	// codec.MaxRequestID bytes).
	RequestID string
	// Addr, ID and Role are the peer's gRPC address, heartbeat id and
	// role (for WithPullTLS).
	Addr, ID, Role string
	// Hashes are the prompt's chained block hashes, BlockTokens the
	// tokens of a block.
	Hashes      []kv.Hash
	BlockTokens int
	// MinBlocks (≥ 1) and MaxBlocks (≥ MinBlocks) bound the prefix worth
	// pulling.
	MinBlocks, MaxBlocks int
	// Codec names the frames' codec ("" or "none": raw).
	Codec string
	// Spec is the puller's model: the pulled KV must have its layers,
	// token bytes and dtype.
	Spec engine.ModelSpec
	// TokenBytes, when > 0, replaces Spec.KVTokenBytes() as the bytes of
	// one token in one layer the pulled KV must have: the puller's engine
	// hands out less than its model's size (the sim engine's scaled
	// payload). The pacing still charges Spec's true size.
	TokenBytes int
}

// Pulled is what a pull brought: the peer's prefix (Tokens 0: the peer
// held too few blocks).
type Pulled struct {
	PrefixKV
	// BytesWire is the frame bytes received.
	BytesWire int64
	// Took is the pull's time, the pacing included.
	Took time.Duration
	// FirstByte is the time to the peer's header: the pull's fixed cost
	// (dial, credential, the peer's lookup), which PullPricer charges
	// every pull.
	FirstByte time.Duration
}

// Pull asks the worker at r.Addr for its longest cached prefix of
// r.Hashes and returns it checked: every frame's CRC-32C, the request id,
// every layer's token ranges in order and complete, the puller's layers,
// token bytes and dtype. With WithLinkGbps the pull waits as if the KV's
// true size (r.Spec's KVBytesPerToken, times the codec's wire/raw ratio)
// crossed the link. Errors: ErrPullIncomplete, codec's (ErrChecksum,
// ErrCorrupt, ...), the call's status (UNAVAILABLE for a peer that is
// gone, ...), ctx's.
func (d *Dialer) Pull(ctx context.Context, r PullRequest) (Pulled, error) {
	t0 := d.o.now()
	fail := func(err error) (Pulled, error) {
		return Pulled{}, fmt.Errorf("kvtransfer: pull %s from %s: %w", r.RequestID, r.Addr, err)
	}
	if len(r.Hashes) == 0 || r.MinBlocks < 1 || r.MaxBlocks < r.MinBlocks {
		return fail(errors.New("nothing to pull"))
	}
	cl, pool, err := d.client(r.Addr, r.ID, r.Role)
	if err != nil {
		return fail(err)
	}
	defer d.release(pool)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hs := make([]uint64, len(r.Hashes))
	for i, h := range r.Hashes {
		hs[i] = uint64(h)
	}
	stream, err := cl.Pull(ctx, &pdservev1.PullRequest{
		RequestId: r.RequestID, BlockHashes: hs, BlockTokens: int32(r.BlockTokens),
		MinBlocks: int32(r.MinBlocks), MaxBlocks: int32(r.MaxBlocks), Codec: r.Codec,
	})
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
	case n == 0:
		return Pulled{}, nil
	case n < 0 || n%r.BlockTokens != 0 || n > r.MaxBlocks*r.BlockTokens || n < r.MinBlocks*r.BlockTokens:
		return fail(fmt.Errorf("%w: %d tokens for blocks [%d, %d] of %d", ErrPullIncomplete, n, r.MinBlocks, r.MaxBlocks, r.BlockTokens))
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

// receive reads the frames of a pull whose header said p's tokens and
// tier (recv returns the next frame, io.EOF after the last) into p, and
// paces it on the link as a push of its bytes would be; p.Took is from
// t0, when the pull began.
func (d *Dialer) receive(ctx context.Context, t0 time.Time, p Pulled, tb int, id string, spec engine.ModelSpec, recv func() ([]byte, error)) (Pulled, error) {
	p.Layers = make([][]byte, spec.Layers)
	rawLen, err := recvFrames(recv, &p, p.Tokens, tb, id, spec)
	if err != nil {
		return Pulled{}, err
	}
	if d.link != nil {
		full := int(int64(p.Tokens) * int64(spec.KVBytesPerToken()))
		until := d.link.charge(t0, chargeBytes(full, int(rawLen), int(p.BytesWire)))
		if err := d.o.sleep(ctx, until.Sub(d.o.now())); err != nil {
			return Pulled{}, err
		}
	}
	p.Took = d.o.now().Sub(t0)
	return p, nil
}

// recvFrames reads a pull's frames (recv returns the next frame, io.EOF
// after the last) into p's layers of n tokens of tb bytes each, checking
// that every frame is id's, of spec's dtype, and continues its layer;
// every layer must end whole. It returns the raw bytes decoded. Errors:
// ErrPullIncomplete for a frame out of place or a layer short,
// codec.ErrChecksum for corrupt bytes, and recv's.
func recvFrames(recv func() ([]byte, error), p *Pulled, n, tb int, id string, spec engine.ModelSpec) (int64, error) {
	next := make([]int, spec.Layers)
	row := tb / 2
	var raw []byte
	var rawLen int64
	for {
		frame, err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return rawLen, err
		}
		fh, _, err := codec.PeekHeader(frame, n*tb)
		if err != nil {
			return rawLen, err
		}
		l, s, e := int(fh.Layer), int(fh.Start), int(fh.End)
		if fh.RequestID != id || fh.DType != spec.KVDType || l >= spec.Layers || s != next[l] || e <= s || e > n {
			return rawLen, fmt.Errorf("%w: frame %q layer %d [%d, %d) of %v", ErrPullIncomplete, fh.RequestID, l, s, e, fh.DType)
		}
		if _, raw, _, err = codec.DecodeFrame(raw[:0], frame, (e-s)*tb); err != nil {
			return rawLen, err // ErrChecksum for corrupt bytes
		}
		if p.Layers[l] == nil {
			p.Layers[l] = make([]byte, n*tb)
		}
		k := (e - s) * row
		copy(p.Layers[l][s*row:], raw[:k])
		copy(p.Layers[l][(n+s)*row:], raw[k:])
		next[l] = e
		p.BytesWire += int64(len(frame))
		rawLen += int64(len(raw))
	}
	for l := range next {
		if next[l] != n {
			return rawLen, fmt.Errorf("%w: layer %d holds %d of %d tokens", ErrPullIncomplete, l, next[l], n)
		}
	}
	return rawLen, nil
}
