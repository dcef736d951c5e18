package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/pdserve/pdserve/pkg/engine"
)

// verifyNoLeaks checks, when the test ends (after every later cleanup),
// that no goroutine was left behind.
func verifyNoLeaks(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// startServer serves r, a receiver of bf16 KV, on a loopback port with the
// transport's server options and stops the server when the test ends.
// extra adds grpc.ServerOptions (credentials).
func startServer(t testing.TB, r Receiver, opts []ServerOption, extra ...grpc.ServerOption) string {
	t.Helper()
	return startServerDType(t, r, engine.BF16, opts, extra...)
}

// startServerDType is startServer for a receiver of KV of dtype dt.
func startServerDType(t testing.TB, r Receiver, dt engine.DType, opts []ServerOption, extra ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(append(GRPCServerOptions(opts...), extra...)...)
	Register(s, r, dt, opts...)
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Serve(lis) })
	t.Cleanup(func() {
		s.Stop()
		wg.Wait()
	})
	return lis.Addr().String()
}

// fakeReceiver accepts every transfer with a fakeSink unless begin says
// otherwise. Safe for concurrent use.
type fakeReceiver struct {
	begin func(ctx context.Context, h StreamHeader) error // nil: accept
	write func(layer, start, end int) error               // nil: accept; given to every sink

	mu    sync.Mutex
	sinks []*fakeSink
	peers map[string]int // remote address → streams
}

func (r *fakeReceiver) Begin(ctx context.Context, h StreamHeader) (Sink, error) {
	if r.begin != nil {
		if err := r.begin(ctx, h); err != nil {
			return nil, err
		}
	}
	s := &fakeSink{h: h, write: r.write, layers: make([][]byte, h.Layers), done: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sinks = append(r.sinks, s)
	if p, ok := peer.FromContext(ctx); ok {
		if r.peers == nil {
			r.peers = make(map[string]int)
		}
		r.peers[p.Addr.String()]++
	}
	return s, nil
}

func (r *fakeReceiver) allSinks() []*fakeSink {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*fakeSink(nil), r.sinks...)
}

// onlySink waits for the receiver's one sink to finish and returns it.
func (r *fakeReceiver) onlySink(t testing.TB) *fakeSink {
	t.Helper()
	sinks := r.allSinks()
	if len(sinks) != 1 {
		t.Fatalf("%d sinks, want 1", len(sinks))
	}
	s := sinks[0]
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("sink neither committed nor aborted")
	}
	return s
}

// fakeSink records what it receives. It checks the Sink contract: writes
// inside the header's bounds, in order, nothing after the end.
type fakeSink struct {
	h     StreamHeader
	write func(layer, start, end int) error

	mu        sync.Mutex
	layers    [][]byte // per layer, the KV received so far
	writes    int
	commits   []Commit
	aborts    []error
	violation error // first contract violation seen
	done      chan struct{}
}

func (s *fakeSink) Write(layer, start, end int, raw []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ended():
		s.violate(fmt.Errorf("write after the end"))
	case layer < 0 || layer >= s.h.Layers || end > s.h.Tokens || start != s.h.Start+len(s.layers[layer])/s.h.TokenBytes:
		s.violate(fmt.Errorf("write layer %d [%d,%d) outside or out of order", layer, start, end))
	case len(raw) != (end-start)*s.h.TokenBytes:
		s.violate(fmt.Errorf("write of %d bytes for [%d,%d)", len(raw), start, end))
	}
	if s.write != nil {
		if err := s.write(layer, start, end); err != nil {
			return err
		}
	}
	s.writes++
	if layer >= 0 && layer < len(s.layers) {
		s.layers[layer] = append(s.layers[layer], raw...)
	}
	return nil
}

func (s *fakeSink) Commit(c Commit) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended() {
		s.violate(errors.New("commit after the end"))
	}
	s.commits = append(s.commits, c)
	close(s.done)
	return nil
}

func (s *fakeSink) Abort(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.commits) > 0 {
		s.violate(errors.New("abort after commit"))
	}
	s.aborts = append(s.aborts, err)
	if len(s.aborts) == 1 {
		close(s.done)
	}
}

func (s *fakeSink) ended() bool { return len(s.commits)+len(s.aborts) > 0 }

func (s *fakeSink) violate(err error) {
	if s.violation == nil {
		s.violation = err
	}
}

// state returns what the sink saw, for assertions.
func (s *fakeSink) state() (layers [][]byte, commits []Commit, aborts int, violation error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.layers, s.commits, len(s.aborts), s.violation
}

// gaussianBF16 returns n bf16 values drawn from N(0, σ²) with σ varying by
// head dimension, the way attention K/V look, little endian, from seed.
func gaussianBF16(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]byte, 2*n)
	for i := range n {
		sigma := 0.5 + float64(i%128)/64 // per-channel scale
		f := float32(r.NormFloat64() * sigma)
		out[2*i], out[2*i+1] = bf16Bytes(f)
	}
	return out
}

// bf16Bytes rounds f to bfloat16 (nearest, ties to even) and returns its two
// little-endian bytes.
func bf16Bytes(f float32) (byte, byte) {
	b := math.Float32bits(f)
	b += 0x7fff + (b>>16)&1
	h := uint16(b >> 16)
	return byte(h), byte(h >> 8)
}

// kvLikeF16 returns n f16 values drawn like gaussianBF16's, with one value
// in 500 an outlier (× 30), little endian, from seed.
func kvLikeF16(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0xf16))
	out := make([]byte, 2*n)
	for i := range n {
		f := r.NormFloat64() * (0.5 + float64(i%128)/64)
		if r.IntN(500) == 0 {
			f *= 30
		}
		h := f16Bits(float32(f))
		out[2*i], out[2*i+1] = byte(h), byte(h>>8)
	}
	return out
}

// f16Bits rounds finite f, |f| < 65504, to IEEE half (nearest, ties to
// even).
func f16Bits(f float32) uint16 {
	x := float64(f)
	var sign uint16
	if math.Signbit(x) {
		sign, x = 0x8000, -x
	}
	if x < 0x1p-14 {
		return sign | uint16(math.RoundToEven(x*0x1p24))
	}
	frac, exp := math.Frexp(x)
	m := math.RoundToEven(frac * 2048)
	if m == 2048 {
		m, exp = 1024, exp+1
	}
	return sign | uint16(exp+14)<<10 | uint16(m-1024)
}
