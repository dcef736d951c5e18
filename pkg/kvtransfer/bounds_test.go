package kvtransfer

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// rawPush sends msgs on one Push call with a plain gRPC client (content
// subtype as given; "" is plain protobuf) and returns the call's outcome.
func rawPush(t *testing.T, addr, subtype string, msgs []*pdservev1.PushRequest) (*pdservev1.PushResponse, error) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1<<30)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var opts []grpc.CallOption
	if subtype != "" {
		opts = append(opts, grpc.CallContentSubtype(subtype))
	}
	stream, err := pdservev1.NewKVTransferServiceClient(cc).Push(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			if errors.Is(err, io.EOF) {
				break // the server ended the call; CloseAndRecv says why
			}
			t.Fatal(err)
		}
	}
	return stream.CloseAndRecv()
}

func headerMsg(h StreamHeader) *pdservev1.PushRequest {
	return &pdservev1.PushRequest{Msg: &pdservev1.PushRequest_Header{Header: h.proto()}}
}

func commitMsg(tok int32) *pdservev1.PushRequest {
	return &pdservev1.PushRequest{Msg: &pdservev1.PushRequest_Commit{Commit: &pdservev1.KVCommit{FirstToken: tok}}}
}

func frameMsg(frame []byte) *pdservev1.PushRequest {
	return &pdservev1.PushRequest{Msg: &pdservev1.PushRequest_Frame{Frame: frame}}
}

// mkFrame builds a frame of rawTokens tokens of bf16 KV for layer [start,
// end), encoded with codecName, then lets edit change its bytes.
func mkFrame(t *testing.T, id, codecName string, layer, start, end, rawTokens, tokenBytes int, edit func([]byte)) []byte {
	t.Helper()
	return mkFrameDType(t, id, codecName, engine.BF16, layer, start, end, rawTokens, tokenBytes, edit)
}

// mkFrameDType is mkFrame for a frame labelled dtype dt.
func mkFrameDType(t *testing.T, id, codecName string, dt engine.DType, layer, start, end, rawTokens, tokenBytes int, edit func([]byte)) []byte {
	t.Helper()
	c, err := codec.ByName(codecName)
	if err != nil {
		t.Fatal(err)
	}
	raw := gaussianBF16(rawTokens*tokenBytes/2, uint64(layer*1000+start))
	f, err := codec.AppendFrame(nil, codec.Header{RequestID: id, Layer: uint32(layer), Start: uint32(start), End: uint32(end), DType: dt}, c, raw)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(f)
	}
	return f
}

func TestServerBounds(t *testing.T) {
	verifyNoLeaks(t)
	const maxFrame = 128 // 8 tokens of 16 bytes
	h := StreamHeader{RequestID: "r", Codec: "s2", Layers: 2, Tokens: 16, TokenBytes: 16, DType: engine.BF16}
	fr := func(layer, start, end int) []byte {
		return mkFrame(t, h.RequestID, h.Codec, layer, start, end, end-start, h.TokenBytes, nil)
	}
	// full is every frame of a complete transfer: layer by layer, 8 tokens each.
	full := []*pdservev1.PushRequest{
		frameMsg(fr(0, 0, 8)), frameMsg(fr(0, 8, 16)), frameMsg(fr(1, 0, 8)), frameMsg(fr(1, 8, 16)),
	}
	corrupt := func(f []byte) { f[len(f)-1] ^= 0xff }
	join := func(parts ...[]*pdservev1.PushRequest) []*pdservev1.PushRequest {
		var out []*pdservev1.PushRequest
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	one := func(m ...*pdservev1.PushRequest) []*pdservev1.PushRequest { return m }
	bad := func(hh StreamHeader) *pdservev1.PushRequest { return headerMsg(hh) }
	hdr := headerMsg(h)

	tests := []struct {
		name       string
		dtype      engine.DType // the receiver's; 0 means bf16
		msgs       []*pdservev1.PushRequest
		writeErr   error
		wantCode   codes.Code
		wantSinks  int
		wantWrites int
		wantMsg    string // in the status message
	}{
		{name: "complete", msgs: join(one(hdr), full, one(commitMsg(7))), wantCode: codes.OK, wantSinks: 1, wantWrites: 4},
		{name: "no header", msgs: one(frameMsg(fr(0, 0, 8))), wantCode: codes.InvalidArgument, wantMsg: "not a header"},
		{name: "nothing", wantCode: codes.InvalidArgument, wantMsg: "before its header"},
		{name: "no layers", msgs: one(bad(StreamHeader{RequestID: "r", Codec: "s2", Tokens: 16, TokenBytes: 16})), wantCode: codes.InvalidArgument},
		{name: "unknown codec", msgs: one(bad(StreamHeader{RequestID: "r", Codec: "lzw", Layers: 2, Tokens: 16, TokenBytes: 16})), wantCode: codes.InvalidArgument, wantMsg: "unknown codec"},
		{name: "layer out of range", msgs: one(hdr, frameMsg(fr(2, 0, 8))), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "layer 2, stream has 2"},
		{name: "end beyond tokens", msgs: one(hdr, frameMsg(fr(0, 0, 8)), frameMsg(fr(0, 8, 12)), frameMsg(fr(0, 12, 17))), wantCode: codes.InvalidArgument, wantSinks: 1, wantWrites: 2, wantMsg: "outside [0,16)"},
		{name: "raw length mismatch", msgs: one(hdr, frameMsg(mkFrame(t, "r", "s2", 0, 0, 4, 3, 16, nil))), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "raw length 48, want 64"},
		{name: "not from token 0", msgs: one(hdr, frameMsg(fr(0, 8, 16))), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "next token is 0"},
		{name: "sent twice", msgs: one(hdr, frameMsg(fr(0, 0, 8)), frameMsg(fr(0, 0, 8))), wantCode: codes.InvalidArgument, wantSinks: 1, wantWrites: 1, wantMsg: "next token is 8"},
		{name: "other request", msgs: one(hdr, frameMsg(mkFrame(t, "q", "s2", 0, 0, 8, 8, 16, nil))), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "request id"},
		{name: "other dtype", msgs: one(hdr, frameMsg(mkFrameDType(t, "r", "s2", engine.F16, 0, 0, 8, 8, 16, nil))), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "dtype f16, receiver kv is bf16"},
		{name: "f16 receiver", dtype: engine.F16, msgs: one(hdr, frameMsg(fr(0, 0, 8))), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "dtype bf16, receiver kv is f16"},
		{name: "codec cannot code the receiver's dtype", dtype: engine.Q8_0, msgs: one(bad(StreamHeader{RequestID: "r", Codec: "fp8", Layers: 2, Tokens: 16, TokenBytes: 16})), wantCode: codes.InvalidArgument, wantMsg: "receiver kv is q8_0"},
		{name: "receiver dtype unknown", dtype: 7, msgs: one(hdr), wantCode: codes.Internal, wantMsg: "not a known dtype"},
		{name: "other codec", msgs: one(hdr, frameMsg(mkFrame(t, "r", "zstd", 0, 0, 8, 8, 16, nil))), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "codec"},
		{name: "above max frame", msgs: one(hdr, frameMsg(mkFrame(t, "r", "s2", 0, 0, 9, 9, 16, nil))), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "too large"},
		{name: "corrupt payload", msgs: one(hdr, frameMsg(mkFrame(t, "r", "s2", 0, 0, 8, 8, 16, corrupt))), wantCode: codes.InvalidArgument, wantSinks: 1},
		// A frame both out of bounds and corrupt is refused for its bounds:
		// the header is checked before the payload is decoded.
		{name: "bounds before decoding", msgs: one(hdr, frameMsg(mkFrame(t, "r", "s2", 5, 0, 8, 8, 16, corrupt))), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "layer 5, stream has 2"},
		{name: "trailing bytes", msgs: one(hdr, frameMsg(append(fr(0, 0, 8), 0))), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "after the frame"},
		{name: "commit before all KV", msgs: one(hdr, full[0], full[1], full[2], commitMsg(1)), wantCode: codes.InvalidArgument, wantSinks: 1, wantWrites: 3, wantMsg: "layer 1 has 8 of 16"},
		{name: "closed before commit", msgs: join(one(hdr), full), wantCode: codes.InvalidArgument, wantSinks: 1, wantWrites: 4, wantMsg: "before commit"},
		{name: "header twice", msgs: one(hdr, hdr), wantCode: codes.InvalidArgument, wantSinks: 1, wantMsg: "twice"},
		{name: "sink fails with status", msgs: join(one(hdr), full), writeErr: status.Error(codes.ResourceExhausted, "pool full"), wantCode: codes.ResourceExhausted, wantSinks: 1, wantMsg: "pool full"},
		{name: "sink fails", msgs: join(one(hdr), full), writeErr: errors.New("engine broke"), wantCode: codes.Internal, wantSinks: 1, wantMsg: "engine broke"},
	}
	for _, subtype := range []string{CodecName, ""} {
		for _, tc := range tests {
			t.Run(tc.name+"/"+subtype, func(t *testing.T) {
				r := &fakeReceiver{}
				if tc.writeErr != nil {
					r.write = func(int, int, int) error { return tc.writeErr }
				}
				dt := tc.dtype
				if dt == 0 {
					dt = engine.BF16
				}
				addr := startServerDType(t, r, dt, []ServerOption{WithMaxFrameBytes(maxFrame)})
				resp, err := rawPush(t, addr, subtype, tc.msgs)
				if got := status.Code(err); got != tc.wantCode {
					t.Fatalf("Push = %v (code %v), want %v", err, got, tc.wantCode)
				}
				if err != nil && !strings.Contains(err.Error(), tc.wantMsg) {
					t.Errorf("Push = %v, want a message containing %q", err, tc.wantMsg)
				}
				sinks := r.allSinks()
				if len(sinks) != tc.wantSinks {
					t.Fatalf("Begin called %d times, want %d", len(sinks), tc.wantSinks)
				}
				if tc.wantSinks == 0 {
					return
				}
				s := r.onlySink(t)
				_, commits, aborts, violation := s.state()
				if violation != nil {
					t.Error(violation)
				}
				if s.writes != tc.wantWrites {
					t.Errorf("%d writes reached the sink, want %d", s.writes, tc.wantWrites)
				}
				if tc.wantCode == codes.OK {
					if len(commits) != 1 || aborts != 0 || resp.GetBytesRaw() != 2*16*16 {
						t.Errorf("commits %v, aborts %d, ack %v; want one commit", commits, aborts, resp)
					}
				} else if aborts != 1 || len(commits) != 0 {
					t.Errorf("commits %v, aborts %d; want exactly one abort", commits, aborts)
				}
			})
		}
	}
}
