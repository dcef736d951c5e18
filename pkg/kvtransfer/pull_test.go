package kvtransfer

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// pullSpec is a bf16 model of 3 layers, 8 bytes a token a layer.
var pullSpec = engine.ModelSpec{Name: "pull", Layers: 3, KVHeads: 1, HeadDim: 2, KVDType: engine.BF16, Vocab: 100, MaxSeqLen: 1024, Hidden: 2, Heads: 1}

// fakeSource holds one prefix of tokens tokens (blocks of 4): the first
// len(hashes) blocks of any request whose hashes start with them.
type fakeSource struct {
	hashes []kv.Hash
	layers [][]byte // canonical KV of len(hashes)×4 tokens
	block  chan struct{}
}

func (f *fakeSource) BlockTokens() int { return 4 }

func (f *fakeSource) ExportPrefix(ctx context.Context, hashes []kv.Hash, minBlocks, maxBlocks int) (PrefixKV, error) {
	n := 0
	for n < len(f.hashes) && n < len(hashes) && n < maxBlocks && hashes[n] == f.hashes[n] {
		n++
	}
	if n < minBlocks {
		return PrefixKV{}, nil
	}
	if f.block != nil {
		<-f.block
	}
	out := make([][]byte, len(f.layers))
	for l, data := range f.layers {
		out[l] = appendRange(nil, data, len(f.hashes)*4, 0, n*4)
	}
	return PrefixKV{Tokens: n * 4, Tier: "host", Layers: out}, nil
}

func newFakeSource(blocks int) *fakeSource {
	f := &fakeSource{}
	for i := range blocks {
		f.hashes = append(f.hashes, kv.Hash(1000+i))
	}
	tb := pullSpec.KVTokenBytes()
	for l := range pullSpec.Layers {
		f.layers = append(f.layers, gaussianBF16(blocks*4*tb/2, uint64(l+1)))
	}
	return f
}

// pullFrom pulls req's prefix from addr with a dialer of opts.
func pullFrom(t *testing.T, addr string, req PullRequest, opts ...DialOption) (Pulled, error) {
	t.Helper()
	d := NewDialer(opts...)
	defer d.Close()
	req.Addr, req.Spec, req.BlockTokens = addr, pullSpec, 4
	if req.RequestID == "" {
		req.RequestID = "pull-1"
	}
	return d.Pull(context.Background(), req)
}

// TestPullRoundTrip: a pull brings the longest prefix the source holds,
// within the request's bounds, split into frames of whole tokens, every
// codec, and the bytes are the source's.
func TestPullRoundTrip(t *testing.T) {
	verifyNoLeaks(t)
	src := newFakeSource(5)
	addr := startServer(t, nil, []ServerOption{WithPullSource(src), WithMaxFrameBytes(24)})
	want := func(blocks int) [][]byte {
		out := make([][]byte, len(src.layers))
		for l, data := range src.layers {
			out[l] = appendRange(nil, data, 20, 0, blocks*4)
		}
		return out
	}
	for _, tc := range []struct {
		name            string
		hashes          []kv.Hash
		min, max, codec string
		minB, maxB      int
		blocks          int
	}{
		{name: "all", hashes: src.hashes, minB: 1, maxB: 5, blocks: 5},
		{name: "max bound", hashes: src.hashes, minB: 1, maxB: 3, blocks: 3, codec: "s2"},
		{name: "longer prompt", hashes: append(append([]kv.Hash{}, src.hashes[:4]...), 7, 8), minB: 2, maxB: 6, blocks: 4, codec: "zstd"},
		{name: "too few", hashes: src.hashes[:2], minB: 3, maxB: 3, blocks: 0},
		{name: "other prompt", hashes: []kv.Hash{1, 2, 3}, minB: 1, maxB: 3, blocks: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := pullFrom(t, addr, PullRequest{Hashes: tc.hashes, MinBlocks: tc.minB, MaxBlocks: tc.maxB, Codec: tc.codec})
			if err != nil {
				t.Fatal(err)
			}
			if p.Tokens != tc.blocks*4 {
				t.Fatalf("pulled %d tokens, want %d", p.Tokens, tc.blocks*4)
			}
			if tc.blocks == 0 {
				return
			}
			if p.Tier != "host" || p.BytesWire == 0 {
				t.Errorf("pulled %+v: want tier host and bytes counted", p)
			}
			for l, w := range want(tc.blocks) {
				if !bytes.Equal(p.Layers[l], w) {
					t.Errorf("layer %d: pulled KV differs from the source's", l)
				}
			}
		})
	}
}

// TestPullRefused: bad requests and a worker without a source fail with
// their status codes; a push to a worker that receives none is refused.
func TestPullRefused(t *testing.T) {
	verifyNoLeaks(t)
	addr := startServer(t, nil, []ServerOption{WithPullSource(newFakeSource(2))})
	bare := startServer(t, nil, nil)
	for _, tc := range []struct {
		name string
		addr string
		req  *pdservev1.PullRequest
		code codes.Code
	}{
		{"no hashes", addr, &pdservev1.PullRequest{RequestId: "a", BlockTokens: 4}, codes.InvalidArgument},
		{"no id", addr, &pdservev1.PullRequest{BlockHashes: []uint64{1}, BlockTokens: 4}, codes.InvalidArgument},
		{"block size", addr, &pdservev1.PullRequest{RequestId: "a", BlockHashes: []uint64{1}, BlockTokens: 16}, codes.FailedPrecondition},
		{"codec", addr, &pdservev1.PullRequest{RequestId: "a", BlockHashes: []uint64{1}, BlockTokens: 4, Codec: "lz9"}, codes.InvalidArgument},
		{"no source", bare, &pdservev1.PullRequest{RequestId: "a", BlockHashes: []uint64{1}, BlockTokens: 4}, codes.Unimplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, err := grpc.NewClient(tc.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			st, err := pdservev1.NewKVTransferServiceClient(cc).Pull(context.Background(), tc.req)
			if err == nil {
				_, err = st.Recv()
			}
			if status.Code(err) != tc.code {
				t.Errorf("pull: %v, want %v", err, tc.code)
			}
		})
	}
	d := NewDialer()
	defer d.Close()
	_, err := d.Open(context.Background(), addr, StreamHeader{RequestID: "p", Codec: "none", Layers: 1, Tokens: 1, TokenBytes: 8, DType: engine.BF16})
	if status.Code(errors.Unwrap(err)) != codes.Unimplemented && status.Code(err) != codes.Unimplemented {
		t.Errorf("push to a worker that receives none: %v, want UNIMPLEMENTED", err)
	}
}

// corruptServer answers a pull with one frame whose payload was changed
// after its CRC was taken.
type corruptServer struct {
	pdservev1.UnimplementedKVTransferServiceServer
	flip bool // corrupt the payload; false: a frame out of order
}

func (c corruptServer) Pull(req *pdservev1.PullRequest, stream grpc.ServerStreamingServer[pdservev1.PullResponse]) error {
	tb := pullSpec.KVTokenBytes()
	if err := stream.Send(&pdservev1.PullResponse{Msg: &pdservev1.PullResponse_Header{Header: &pdservev1.PullHeader{Tokens: 4, Layers: 3, TokenBytes: int32(tb), Tier: "engine"}}}); err != nil {
		return err
	}
	cd, _ := codec.ByName("none")
	start := uint32(0)
	if !c.flip {
		start = 1
	}
	f, err := codec.AppendFrame(nil, codec.Header{RequestID: req.GetRequestId(), Layer: 0, Start: start, End: 4, DType: engine.BF16}, cd, gaussianBF16(int(4-start)*tb/2, 3))
	if err != nil {
		return err
	}
	if c.flip {
		f[len(f)-1] ^= 0x40
	}
	return stream.Send(&pdservev1.PullResponse{Msg: &pdservev1.PullResponse_Frame{Frame: f}})
}

// TestPullChecked: a frame that fails its CRC-32C, one out of order, and
// a stream that ends before every layer is complete fail the pull.
func TestPullChecked(t *testing.T) {
	verifyNoLeaks(t)
	for _, tc := range []struct {
		name string
		srv  corruptServer
		want error
	}{
		{"crc", corruptServer{flip: true}, codec.ErrChecksum},
		{"order", corruptServer{}, ErrPullIncomplete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			s := grpc.NewServer()
			pdservev1.RegisterKVTransferServiceServer(s, tc.srv)
			var wg sync.WaitGroup
			wg.Go(func() { _ = s.Serve(lis) })
			defer func() { s.Stop(); wg.Wait() }()
			_, err = pullFrom(t, lis.Addr().String(), PullRequest{Hashes: []kv.Hash{1}, MinBlocks: 1, MaxBlocks: 1})
			if !errors.Is(err, tc.want) {
				t.Errorf("pull: %v, want %v", err, tc.want)
			}
		})
	}
	// The good frame of layer 0 only: the other layers are missing.
	src := newFakeSource(1)
	addr := startServer(t, nil, []ServerOption{WithPullSource(src)})
	d := NewDialer()
	defer d.Close()
	_, err := d.Pull(context.Background(), PullRequest{RequestID: "x", Addr: addr, Hashes: src.hashes, BlockTokens: 4, MinBlocks: 1, MaxBlocks: 1,
		Spec: engine.ModelSpec{Name: "more", Layers: 4, KVHeads: 1, HeadDim: 2, KVDType: engine.BF16}})
	if !errors.Is(err, ErrPullIncomplete) {
		t.Errorf("pull of 3 layers into a model of 4: %v, want ErrPullIncomplete", err)
	}
}

// TestPullPeerGone: a peer that stops while it is being pulled from fails
// the pull (UNAVAILABLE), and nothing is left running.
func TestPullPeerGone(t *testing.T) {
	verifyNoLeaks(t)
	src := newFakeSource(2)
	src.block = make(chan struct{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(GRPCServerOptions()...)
	Register(s, nil, engine.BF16, WithPullSource(src))
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Serve(lis) })
	errc := make(chan error, 1)
	go func() {
		_, err := pullFrom(t, lis.Addr().String(), PullRequest{Hashes: src.hashes, MinBlocks: 1, MaxBlocks: 2})
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond) // the pull waits in ExportPrefix
	s.Stop()
	close(src.block)
	wg.Wait()
	if err := <-errc; status.Code(errors.Unwrap(err)) != codes.Unavailable && status.Code(err) != codes.Unavailable {
		t.Errorf("pull from a peer that stopped: %v, want UNAVAILABLE", err)
	}
}

// TestPullPaced: with a link rate, a pull takes the KV's true size over
// the link.
func TestPullPaced(t *testing.T) {
	verifyNoLeaks(t)
	src := newFakeSource(5)
	addr := startServer(t, nil, []ServerOption{WithPullSource(src)})
	now, sleep := sleepClock()
	p, err := pullFrom(t, addr, PullRequest{Hashes: src.hashes, MinBlocks: 1, MaxBlocks: 5}, WithLinkGbps(0.001), WithClock(now, sleep))
	if err != nil || p.Tokens != 20 {
		t.Fatalf("pull: %+v, %v", p, err)
	}
	// 20 tokens × 3 layers × 8 bytes, wire/raw of "none" a little over 1,
	// at 1 Mb/s: about 3.8 ms.
	if min := time.Duration(float64(20*pullSpec.KVBytesPerToken()*8) / 1e6 * float64(time.Second)); p.Took < min {
		t.Errorf("paced pull took %v, want at least %v", p.Took, min)
	}
}

// sleepClock returns a clock that moves only when the pull sleeps, and
// its sleep.
func sleepClock() (now func() time.Time, sleep func(context.Context, time.Duration) error) {
	var mu sync.Mutex
	clock := time.Unix(0, 0)
	now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	sleep = func(_ context.Context, d time.Duration) error {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(d)
		return nil
	}
	return now, sleep
}

// TestPullScaledPayload: a puller whose engine hands out a scaled-down
// payload (the sim engine) pulls KV of its own token bytes when it says
// so (PullRequest.TokenBytes), and is paced by the model's true size;
// without it that KV is refused as not the model's.
func TestPullScaledPayload(t *testing.T) {
	verifyNoLeaks(t)
	src := newFakeSource(5)
	tb := pullSpec.KVTokenBytes() / 2 // a payload at half scale
	for l := range src.layers {
		src.layers[l] = gaussianBF16(20*tb/2, uint64(l+1))
	}
	addr := startServer(t, nil, []ServerOption{WithPullSource(src)})
	if _, err := pullFrom(t, addr, PullRequest{Hashes: src.hashes, MinBlocks: 1, MaxBlocks: 5}); !errors.Is(err, ErrPullIncomplete) {
		t.Fatalf("pull of half-scale KV without TokenBytes: %v, want ErrPullIncomplete", err)
	}
	now, sleep := sleepClock()
	p, err := pullFrom(t, addr, PullRequest{Hashes: src.hashes, MinBlocks: 1, MaxBlocks: 5, TokenBytes: tb}, WithLinkGbps(0.001), WithClock(now, sleep))
	if err != nil || p.Tokens != 20 {
		t.Fatalf("pull with TokenBytes %d: %+v, %v", tb, p, err)
	}
	for l, w := range src.layers {
		if !bytes.Equal(p.Layers[l], w) {
			t.Errorf("layer %d: pulled KV differs from the source's", l)
		}
	}
	if min := time.Duration(float64(20*pullSpec.KVBytesPerToken()*8) / 1e6 * float64(time.Second)); p.Took < min {
		t.Errorf("paced pull took %v, want at least %v (the true size)", p.Took, min)
	}
}
