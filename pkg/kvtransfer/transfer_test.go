package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// testShape is a small model: 3 layers, 37 prompt tokens, 128 bytes of KV
// per token and layer (2 KV heads × 16 dims × K and V × bf16).
var testShape = StreamHeader{RequestID: "req-1", Layers: 3, Tokens: 37, TokenBytes: 128, DType: engine.BF16}

// testKV returns one layer's canonical KV per layer for h, of h.DType
// (for q8_0: random bytes, which the codecs that take it treat as opaque).
func testKV(h StreamHeader) [][]byte {
	kv := make([][]byte, h.Layers)
	for l := range kv {
		switch h.DType {
		case engine.F16:
			kv[l] = kvLikeF16(h.Tokens*h.TokenBytes/2, uint64(l)+1)
		case engine.Q8_0:
			r := rand.New(rand.NewPCG(uint64(l), 80))
			kv[l] = make([]byte, h.Tokens*h.TokenBytes)
			for i := range kv[l] {
				kv[l][i] = byte(r.Uint32())
			}
		default:
			kv[l] = gaussianBF16(h.Tokens*h.TokenBytes/2, uint64(l)+1)
		}
	}
	return kv
}

// sendAll sends kv the way a prefill worker does: prompt chunks of chunk
// tokens, every layer of a chunk before the next chunk.
func sendAll(s *Sender, kv [][]byte, chunk int) error {
	h := s.Header()
	for c := 0; c < h.Tokens; c += chunk {
		e := min(h.Tokens, c+chunk)
		for l := range kv {
			if err := s.Send(l, c, e, kv[l][c*h.TokenBytes:e*h.TokenBytes], 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// expectedKV is what a receiver decodes from kv sent by sendAll with
// frames of at most maxFrame raw bytes: kv itself for a lossless codec, the
// codec's round trip of each frame for a lossy one.
func expectedKV(t *testing.T, c codec.Codec, h StreamHeader, kv [][]byte, chunk, maxFrame int) [][]byte {
	t.Helper()
	if c.Lossless() {
		return kv
	}
	step := max(1, maxFrame/h.TokenBytes)
	out := make([][]byte, len(kv))
	for l := range kv {
		for c0 := 0; c0 < h.Tokens; c0 += chunk {
			e0 := min(h.Tokens, c0+chunk)
			for s := c0; s < e0; s += step {
				e := min(e0, s+step)
				part := kv[l][s*h.TokenBytes : e*h.TokenBytes]
				enc, err := c.Encode(nil, part, h.DType)
				if err != nil {
					t.Fatal(err)
				}
				if out[l], err = c.Decode(out[l], enc, len(part), h.DType); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return out
}

func TestRoundTripEveryCodec(t *testing.T) {
	for _, dt := range []engine.DType{engine.BF16, engine.F16, engine.Q8_0} {
		t.Run(dt.String(), func(t *testing.T) { testRoundTripEveryCodec(t, dt) })
	}
}

// testRoundTripEveryCodec sends KV of dtype dt with every codec that takes
// it to a receiver of dt.
func testRoundTripEveryCodec(t *testing.T, dt engine.DType) {
	verifyNoLeaks(t)
	const maxFrame = 1000 // 7 tokens: chunks of 16 tokens split into frames
	const chunk = 16
	r := &fakeReceiver{}
	addr := startServerDType(t, r, dt, []ServerOption{WithMaxFrameBytes(maxFrame)})
	d := NewDialer(WithConnsPerAddr(2), WithMaxFrameBytes(maxFrame))
	defer d.Close()
	shape := testShape
	shape.DType = dt
	if dt == engine.Q8_0 {
		shape.TokenBytes = 2 * 2 * 34 // K and V rows of 64 values: 2 blocks each
	}
	kv := testKV(shape)

	n := 0 // transfers so far: the index of the next one's sink
	for _, c := range codec.All() {
		if c.Supports(dt) != nil {
			continue
		}
		idx := n
		n++
		t.Run(c.Name(), func(t *testing.T) {
			h := shape
			h.RequestID = fmt.Sprintf("req-%s", c.Name())
			h.Codec = c.Name()
			s, err := d.Open(context.Background(), addr, h)
			if err != nil {
				t.Fatal(err)
			}
			if err := sendAll(s, kv, chunk); err != nil {
				t.Fatal(err)
			}
			// The provenance crosses the wire with the first token.
			commit := Commit{FirstToken: 42, Provenance: pdservev1.KVProvenance_KV_PROVENANCE_PULLED_UNVERIFIED}
			ack, err := s.Commit(context.Background(), commit)
			if err != nil {
				t.Fatal(err)
			}
			sink := r.allSinks()[idx]
			<-sink.done
			layers, commits, aborts, violation := sink.state()
			if violation != nil {
				t.Fatal(violation)
			}
			if diff := cmp.Diff([]Commit{commit}, commits); diff != "" || aborts != 0 {
				t.Fatalf("commits (-want +got):\n%s aborts %d", diff, aborts)
			}
			want := expectedKV(t, c, h, kv, chunk, maxFrame)
			for l := range want {
				if !cmp.Equal(want[l], layers[l]) {
					t.Errorf("layer %d: received KV differs from the sent KV's decoding (lossless %v)", l, c.Lossless())
				}
			}
			raw := int64(h.Layers * h.Tokens * h.TokenBytes)
			if ack.BytesRaw != raw || s.BytesRaw() != raw {
				t.Errorf("bytes raw: ack %d, sender %d, want %d", ack.BytesRaw, s.BytesRaw(), raw)
			}
			if ack.BytesWire != s.BytesWire() || ack.BytesWire <= 0 {
				t.Errorf("bytes wire: ack %d, sender %d", ack.BytesWire, s.BytesWire())
			}
			if s.ChargedBytes() != s.BytesWire() {
				t.Errorf("charged bytes %d, want the wire bytes %d without fullBytes", s.ChargedBytes(), s.BytesWire())
			}
			if ack.FirstByte.IsZero() || ack.Done.Before(ack.FirstByte) {
				t.Errorf("ack stamps: first byte %v, done %v", ack.FirstByte, ack.Done)
			}
			// A finished Sender refuses more work.
			if err := s.Send(0, 0, 1, kv[0][:h.TokenBytes], 0); !errors.Is(err, ErrFinished) {
				t.Errorf("Send after Commit = %v, want ErrFinished", err)
			}
		})
	}
}

// TestDTypeMismatch sends KV labelled with one dtype to a receiver of
// another: the server refuses the first frame, or the header when the
// codec cannot code the receiver's dtype, with INVALID_ARGUMENT.
func TestDTypeMismatch(t *testing.T) {
	verifyNoLeaks(t)
	for _, tc := range []struct {
		name          string
		sender, recv  engine.DType
		codec         string
		wantOpenError bool
		wantMsg       string
	}{
		{"bf16 to f16", engine.BF16, engine.F16, "bf16", false, "dtype bf16, receiver kv is f16"},
		{"f16 to bf16", engine.F16, engine.BF16, "none", false, "dtype f16, receiver kv is bf16"},
		{"f16 to q8_0", engine.F16, engine.Q8_0, "zstd", false, "dtype f16, receiver kv is q8_0"},
		{"int8 to q8_0", engine.F16, engine.Q8_0, "int8", true, "receiver kv is q8_0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &fakeReceiver{}
			addr := startServerDType(t, r, tc.recv, nil)
			d := NewDialer()
			defer d.Close()
			h := testShape
			h.Codec, h.DType = tc.codec, tc.sender
			s, err := d.Open(context.Background(), addr, h)
			if tc.wantOpenError {
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.wantMsg) {
					t.Fatalf("Open = %v, want INVALID_ARGUMENT with %q", err, tc.wantMsg)
				}
				if n := len(r.allSinks()); n != 0 {
					t.Errorf("%d sinks created for a refused transfer", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			err = sendAll(s, testKV(h), 16)
			if err == nil {
				_, err = s.Commit(context.Background(), Commit{})
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("send = %v, want INVALID_ARGUMENT with %q", err, tc.wantMsg)
			}
			layers, commits, aborts, _ := r.onlySink(t).state()
			if len(commits) != 0 || aborts != 1 || len(layers[0]) != 0 {
				t.Errorf("commits %v, aborts %d, %d bytes of layer 0 written; want one abort and nothing written", commits, aborts, len(layers[0]))
			}
		})
	}
}

// TestOpenCanonicalCodecName opens a transfer with the plane codec's f16
// alias: the worker is told the codec's own name.
func TestOpenCanonicalCodecName(t *testing.T) {
	verifyNoLeaks(t)
	var st stats
	r := &fakeReceiver{}
	addr := startServerDType(t, r, engine.F16, []ServerOption{WithMetrics(&st)})
	d := NewDialer()
	defer d.Close()
	h := testShape
	h.Codec, h.DType = "f16", engine.F16
	s, err := d.Open(context.Background(), addr, h)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Header().Codec; got != "bf16" {
		t.Errorf("Header().Codec = %q, want bf16", got)
	}
	kv := testKV(h)
	if err := sendAll(s, kv, 16); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(context.Background(), Commit{}); err != nil {
		t.Fatal(err)
	}
	sink := r.onlySink(t)
	if sink.h.Codec != "bf16" || sink.h.DType != engine.F16 {
		t.Errorf("Begin saw codec %q, dtype %v; want bf16, f16", sink.h.Codec, sink.h.DType)
	}
	if layers, _, _, _ := sink.state(); !cmp.Equal(kv, layers) {
		t.Error("received KV differs")
	}
	if code := st.waitCode(t, 1); code != codes.OK || st.all[0].Codec != "bf16" {
		t.Errorf("server reported code %v, codec %q; want OK, bf16", code, st.all[0].Codec)
	}
}

func TestOpenErrors(t *testing.T) {
	verifyNoLeaks(t)
	reject := func(code codes.Code) func(context.Context, StreamHeader) error {
		return func(context.Context, StreamHeader) error { return status.Error(code, "no") }
	}
	tests := []struct {
		name     string
		begin    func(context.Context, StreamHeader) error
		header   func(*StreamHeader)
		wantCode codes.Code
		wantErr  error
	}{
		{name: "no reservation", begin: reject(codes.FailedPrecondition), wantCode: codes.FailedPrecondition},
		{name: "beyond reservation", begin: reject(codes.ResourceExhausted), wantCode: codes.ResourceExhausted},
		{name: "error without status", begin: func(context.Context, StreamHeader) error { return errors.New("boom") }, wantCode: codes.Internal},
		{name: "unknown codec", header: func(h *StreamHeader) { h.Codec = "lz77" }, wantErr: codec.ErrUnknownCodec, wantCode: codes.Unknown},
		{name: "no layers", header: func(h *StreamHeader) { h.Layers = 0 }, wantErr: ErrBadHeader, wantCode: codes.Unknown},
		{name: "no request id", header: func(h *StreamHeader) { h.RequestID = "" }, wantErr: ErrBadHeader, wantCode: codes.Unknown},
		{name: "no dtype", header: func(h *StreamHeader) { h.DType = 0 }, wantErr: ErrBadHeader, wantCode: codes.Unknown},
		{name: "unknown dtype", header: func(h *StreamHeader) { h.DType = 9 }, wantErr: ErrBadHeader, wantCode: codes.Unknown},
		{name: "bf16 codec on q8_0", header: func(h *StreamHeader) { h.Codec, h.DType = "bf16", engine.Q8_0 }, wantErr: codec.ErrDType, wantCode: codes.Unknown},
		{name: "int8 on q8_0", header: func(h *StreamHeader) { h.Codec, h.DType = "int8", engine.Q8_0 }, wantErr: codec.ErrDType, wantCode: codes.Unknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &fakeReceiver{begin: tc.begin}
			addr := startServer(t, r, nil)
			d := NewDialer()
			defer d.Close()
			h := testShape
			h.Codec = "none"
			if tc.header != nil {
				tc.header(&h)
			}
			s, err := d.Open(context.Background(), addr, h)
			if err == nil {
				s.Abort(nil)
				t.Fatal("Open = nil error")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("Open = %v, want %v", err, tc.wantErr)
			}
			if got := status.Code(err); got != tc.wantCode {
				t.Errorf("Open = %v, code %v, want %v", err, got, tc.wantCode)
			}
			if n := len(r.allSinks()); n != 0 {
				t.Errorf("%d sinks created for a rejected transfer", n)
			}
		})
	}
}

func TestSendBadChunkKeepsSender(t *testing.T) {
	verifyNoLeaks(t)
	r := &fakeReceiver{}
	addr := startServer(t, r, nil)
	d := NewDialer()
	defer d.Close()
	h := testShape
	h.Codec = "s2"
	kv := testKV(h)
	s, err := d.Open(context.Background(), addr, h)
	if err != nil {
		t.Fatal(err)
	}
	tb := h.TokenBytes
	bad := []struct {
		name              string
		layer, start, end int
		raw               []byte
	}{
		{"layer out of range", h.Layers, 0, 1, kv[0][:tb]},
		{"negative layer", -1, 0, 1, kv[0][:tb]},
		{"not from token 0", 0, 1, 2, kv[0][tb : 2*tb]},
		{"end beyond tokens", 0, 0, h.Tokens + 1, make([]byte, (h.Tokens+1)*tb)},
		{"empty range", 0, 0, 0, nil},
		{"length mismatch", 0, 0, 2, kv[0][:tb]},
	}
	for _, b := range bad {
		if err := s.Send(b.layer, b.start, b.end, b.raw, 0); !errors.Is(err, ErrBadChunk) {
			t.Errorf("%s: Send = %v, want ErrBadChunk", b.name, err)
		}
	}
	if err := sendAll(s, kv, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(context.Background(), Commit{FirstToken: 1}); err != nil {
		t.Fatal(err)
	}
	layers, _, _, violation := r.onlySink(t).state()
	if violation != nil {
		t.Fatal(violation)
	}
	if !cmp.Equal(kv, layers) {
		t.Error("received KV differs")
	}
}

// stats collects the server's TransferStats.
type stats struct {
	mu  sync.Mutex
	all []TransferStats
}

func (s *stats) TransferDone(ts TransferStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, ts)
}

// waitCode waits for the server to report n transfers and returns the last
// one's code.
func (s *stats) waitCode(t *testing.T, n int) codes.Code {
	t.Helper()
	var code codes.Code
	poll.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.all) < n {
			return fmt.Errorf("%d transfers reported, want %d", len(s.all), n)
		}
		code = s.all[n-1].Code
		return nil
	})
	return code
}

func TestAbortReachesSinkOnce(t *testing.T) {
	verifyNoLeaks(t)
	cause := errors.New("prefill cancelled")
	tests := []struct {
		name    string
		end     func(s *Sender, cancelOpen context.CancelFunc, d *Dialer)
		wantErr error // from Send afterwards
	}{
		{"Abort", func(s *Sender, _ context.CancelFunc, _ *Dialer) { s.Abort(cause) }, cause},
		{"Abort nil", func(s *Sender, _ context.CancelFunc, _ *Dialer) { s.Abort(nil) }, ErrAborted},
		{"Open context cancelled", func(_ *Sender, cancel context.CancelFunc, _ *Dialer) { cancel() }, context.Canceled},
		{"Dialer closed", func(_ *Sender, _ context.CancelFunc, d *Dialer) { _ = d.Close() }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := &stats{}
			r := &fakeReceiver{}
			addr := startServer(t, r, []ServerOption{WithMetrics(st)})
			d := NewDialer()
			defer d.Close()
			h := testShape
			h.Codec = "zstd"
			kv := testKV(h)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := d.Open(ctx, addr, h)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(0, 0, 4, kv[0][:4*h.TokenBytes], 0); err != nil {
				t.Fatal(err)
			}
			tc.end(s, cancel, d)
			sink := r.onlySink(t)
			if _, commits, aborts, violation := sink.state(); aborts != 1 || len(commits) != 0 || violation != nil {
				t.Errorf("sink: %d aborts, %d commits, violation %v; want exactly one abort", aborts, len(commits), violation)
			}
			if code := st.waitCode(t, 1); code != codes.Canceled {
				t.Errorf("server code %v, want Canceled", code)
			}
			err = s.Send(0, 4, 8, kv[0][4*h.TokenBytes:8*h.TokenBytes], 0)
			if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Errorf("Send after the end = %v, want %v", err, tc.wantErr)
			}
			if _, err := s.Commit(context.Background(), Commit{}); err == nil {
				t.Error("Commit after the end = nil error")
			}
			s.Abort(errors.New("again")) // no-op
			if _, _, aborts, _ := sink.state(); aborts != 1 {
				t.Errorf("sink aborted %d times", aborts)
			}
		})
	}
}

func TestCommitErrors(t *testing.T) {
	verifyNoLeaks(t)
	h := testShape
	h.Codec = "none"
	kv := testKV(h)

	t.Run("incomplete", func(t *testing.T) {
		st := &stats{}
		r := &fakeReceiver{}
		addr := startServer(t, r, []ServerOption{WithMetrics(st)})
		d := NewDialer()
		defer d.Close()
		s, err := d.Open(context.Background(), addr, h)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(0, 0, h.Tokens, kv[0], 0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(context.Background(), Commit{}); !errors.Is(err, ErrIncomplete) {
			t.Fatalf("Commit = %v, want ErrIncomplete", err)
		}
		if _, _, aborts, _ := r.onlySink(t).state(); aborts != 1 {
			t.Errorf("sink aborted %d times, want 1", aborts)
		}
		if code := st.waitCode(t, 1); code != codes.Canceled {
			t.Errorf("server code %v, want Canceled", code)
		}
	})

	t.Run("context done before commit", func(t *testing.T) {
		r := &fakeReceiver{}
		addr := startServer(t, r, nil)
		d := NewDialer()
		defer d.Close()
		s, err := d.Open(context.Background(), addr, h)
		if err != nil {
			t.Fatal(err)
		}
		if err := sendAll(s, kv, h.Tokens); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.Commit(ctx, Commit{}); !errors.Is(err, context.Canceled) {
			t.Fatalf("Commit = %v, want context.Canceled", err)
		}
		if _, commits, aborts, _ := r.onlySink(t).state(); aborts != 1 || len(commits) != 0 {
			t.Errorf("sink: %d aborts, %d commits; want one abort", aborts, len(commits))
		}
	})

	t.Run("context ends while the worker commits", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		entered := make(chan struct{})
		var streamCtx context.Context
		r := &fakeReceiver{begin: func(ctx context.Context, _ StreamHeader) error {
			streamCtx = ctx
			return nil
		}}
		addr := startServer(t, &blockingCommit{fakeReceiver: r, entered: entered, ctx: func() context.Context { return streamCtx }}, nil)
		d := NewDialer()
		defer d.Close()
		s, err := d.Open(context.Background(), addr, h)
		if err != nil {
			t.Fatal(err)
		}
		if err := sendAll(s, kv, h.Tokens); err != nil {
			t.Fatal(err)
		}
		go func() {
			<-entered
			cancel()
		}()
		if _, err := s.Commit(ctx, Commit{}); !errors.Is(err, context.Canceled) {
			t.Fatalf("Commit = %v, want context.Canceled", err)
		}
		if _, _, aborts, _ := r.onlySink(t).state(); aborts != 1 {
			t.Errorf("sink aborted %d times, want 1 (after its failed Commit)", aborts)
		}
	})
}

// blockingCommit wraps fakeReceiver's sinks so that Commit blocks until the
// stream's context ends, then fails.
type blockingCommit struct {
	*fakeReceiver
	entered chan struct{}
	ctx     func() context.Context
}

func (b *blockingCommit) Begin(ctx context.Context, h StreamHeader) (Sink, error) {
	s, err := b.fakeReceiver.Begin(ctx, h)
	if err != nil {
		return nil, err
	}
	return blockingSink{fakeSink: s.(*fakeSink), b: b}, nil
}

type blockingSink struct {
	*fakeSink
	b *blockingCommit
}

func (s blockingSink) Commit(Commit) error {
	close(s.b.entered)
	<-s.b.ctx().Done()
	return s.b.ctx().Err()
}

func TestConnPoolRoundRobin(t *testing.T) {
	verifyNoLeaks(t)
	r := &fakeReceiver{}
	addr := startServer(t, r, nil)
	d := NewDialer(WithConnsPerAddr(3))
	h := testShape
	h.Codec = "none"
	kv := testKV(h)
	for i := range 6 {
		h.RequestID = fmt.Sprintf("r%d", i)
		s, err := d.Open(context.Background(), addr, h)
		if err != nil {
			t.Fatal(err)
		}
		if err := sendAll(s, kv, h.Tokens); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(context.Background(), Commit{}); err != nil {
			t.Fatal(err)
		}
	}
	r.mu.Lock()
	peers := r.peers
	r.mu.Unlock()
	want := map[string]int{}
	for p := range peers {
		want[p] = 2
	}
	if len(peers) != 3 || !cmp.Equal(want, peers) {
		t.Errorf("streams per connection %v, want 2 on each of 3", peers)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := d.Open(context.Background(), addr, h); !errors.Is(err, ErrClosed) {
		t.Errorf("Open after Close = %v, want ErrClosed", err)
	}
}

func TestConcurrentTransfers(t *testing.T) {
	verifyNoLeaks(t)
	r := &fakeReceiver{}
	addr := startServer(t, r, []ServerOption{WithMaxFrameBytes(2048)})
	d := NewDialer(WithConnsPerAddr(2), WithMaxFrameBytes(2048), WithLinkGbps(1000))
	defer d.Close()
	const n = 8
	kv := testKV(testShape)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			h := testShape
			h.RequestID = fmt.Sprintf("c%d", i)
			h.Codec = codec.All()[i%len(codec.All())].Name()
			s, err := d.Open(context.Background(), addr, h)
			if err != nil {
				errs <- err
				return
			}
			if err := sendAll(s, kv, 5); err != nil {
				errs <- err
				return
			}
			_, err = s.Commit(context.Background(), Commit{FirstToken: int32(i)})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	for _, s := range r.allSinks() {
		<-s.done
		_, commits, aborts, violation := s.state()
		if violation != nil || aborts != 0 || len(commits) != 1 {
			t.Errorf("%s: commits %v, aborts %d, violation %v", s.h.RequestID, commits, aborts, violation)
		}
	}
}
