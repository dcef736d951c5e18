package kvtransfer

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/pdserve/pdserve/internal/poll"
)

// blackhole is a TCP proxy to a server that, once hung, keeps reading
// both ways but forwards nothing: to each end the other looks alive at the
// TCP level and silent above it, as a hung process or a broken network
// path does. It closes when the test ends.
type blackhole struct {
	lis    net.Listener
	target string
	hung   atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{lis: lis, target: target}
	b.wg.Go(b.accept)
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) addr() string { return b.lis.Addr().String() }

func (b *blackhole) accept() {
	for {
		c, err := b.lis.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", b.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, c, s)
		b.mu.Unlock()
		b.wg.Go(func() { b.pipe(s, c) })
		b.wg.Go(func() { b.pipe(c, s) })
	}
}

// pipe copies src to dst until src fails, dropping what it reads once the
// proxy hung.
func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.hung.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

func (b *blackhole) close() {
	_ = b.lis.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// A decode worker that hangs mid-transfer is found by the Dialer's
// keepalive: the transfer fails with UNAVAILABLE within the keepalive time
// and timeout, not never. (gRPC clients ping at most every 10 s, so this
// test takes about 11 s.)
func TestKeepaliveDetectsHungServer(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for gRPC's 10 s minimum client keepalive")
	}
	verifyNoLeaks(t)
	r := &fakeReceiver{}
	proxy := newBlackhole(t, startServer(t, r, nil))
	const pingTime, pingTimeout = 10 * time.Second, time.Second
	d := NewDialer(WithConnsPerAddr(1), WithKeepalive(keepalive.ClientParameters{Time: pingTime, Timeout: pingTimeout}))
	defer d.Close()
	h := testShape
	h.Codec = "none"
	s, err := d.Open(context.Background(), proxy.addr(), h)
	if err != nil {
		t.Fatal(err)
	}
	if err := sendAll(s, testKV(h), 8); err != nil {
		t.Fatal(err)
	}
	proxy.hung.Store(true)
	start := time.Now()
	_, err = s.Commit(context.Background(), Commit{}) // blocks until the connection is found dead
	took := time.Since(start)
	t.Logf("commit through a hung proxy failed after %v: %v", took, err)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Commit = %v, want UNAVAILABLE", err)
	}
	if limit := pingTime + pingTimeout + 3*time.Second; took > limit {
		t.Errorf("hung server found after %v, want within %v", took, limit)
	}
}

// A prefill worker that hangs mid-transfer is found by the server's
// keepalive: the transfer is aborted and the receiver frees what it holds.
func TestServerKeepaliveDetectsHungClient(t *testing.T) {
	verifyNoLeaks(t)
	r := &fakeReceiver{}
	const pingTime, pingTimeout = time.Second, 500 * time.Millisecond // the server minimum is 1 s
	srv := startServer(t, r, nil, grpc.KeepaliveParams(keepalive.ServerParameters{Time: pingTime, Timeout: pingTimeout}))
	proxy := newBlackhole(t, srv)
	d := NewDialer(WithConnsPerAddr(1))
	defer d.Close()
	h := testShape
	h.Codec = "none"
	s, err := d.Open(context.Background(), proxy.addr(), h)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Abort(nil)
	if err := s.Send(0, 0, 4, testKV(h)[0][:4*h.TokenBytes], 0); err != nil {
		t.Fatal(err)
	}
	proxy.hung.Store(true)
	start := time.Now()
	sink := r.onlySink(t) // waits until the sink ended
	took := time.Since(start)
	_, commits, aborts, violation := sink.state()
	t.Logf("hung client found after %v", took)
	if len(commits) != 0 || aborts != 1 || violation != nil {
		t.Errorf("sink: %d commits, %d aborts, violation %v; want one abort", len(commits), aborts, violation)
	}
	if limit := pingTime + pingTimeout + 3*time.Second; took > limit {
		t.Errorf("hung client found after %v, want within %v", took, limit)
	}
}

// The connections to an address no transfer used for the idle timeout
// are closed by the next Open; those with a transfer open stay.
func TestDialerClosesIdleConnections(t *testing.T) {
	verifyNoLeaks(t)
	r := &fakeReceiver{}
	gone, busy, next := startServer(t, r, nil), startServer(t, r, nil), startServer(t, r, nil)
	ft := &fakeTime{now: time.Unix(5000, 0)}
	const idle = time.Minute
	d := NewDialer(WithConnsPerAddr(2), WithIdleTimeout(idle), WithClock(ft.Now, nil))
	defer d.Close()
	h := testShape
	h.Codec = "none"
	kv := testKV(h)
	transfer := func(addr, id string) {
		t.Helper()
		h := h
		h.RequestID = id
		s, err := d.Open(context.Background(), addr, h)
		if err != nil {
			t.Fatal(err)
		}
		if err := sendAll(s, kv, 16); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(context.Background(), Commit{}); err != nil {
			t.Fatal(err)
		}
	}
	transfer(gone, "a")
	h.RequestID = "open"
	open, err := d.Open(context.Background(), busy, h) // stays open
	if err != nil {
		t.Fatal(err)
	}
	defer open.Abort(nil)
	pool := func(addr string) *connPool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.pools[addr]
	}
	goneConns := pool(gone).conns

	// Before the idle timeout nothing closes; once the first transfer
	// has ended, the release is counted (after its stream context ends).
	ft.Advance(idle - time.Second)
	poll.WaitFor(t, "the ended transfer released", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.pools[gone].active == 0
	})
	transfer(next, "b")
	if pool(gone) == nil {
		t.Fatal("connections closed before the idle timeout")
	}
	ft.Advance(2 * time.Second)
	transfer(next, "c")
	if pool(gone) != nil {
		t.Error("connections of an idle address kept")
	}
	for i, cc := range goneConns {
		if st := cc.GetState(); st != connectivity.Shutdown {
			t.Errorf("idle connection %d: state %v, want SHUTDOWN", i, st)
		}
	}
	if pool(busy) == nil {
		t.Error("connections of an address with a transfer open closed")
	}
	if pool(next) == nil {
		t.Error("connections of the address just used closed")
	}
	// A new transfer to the closed address connects again.
	transfer(gone, "d")

	// The open transfer still works.
	if err := sendAll(open, kv, 16); err != nil {
		t.Fatal(err)
	}
	if _, err := open.Commit(context.Background(), Commit{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Open(context.Background(), gone, h); !errors.Is(err, ErrClosed) {
		t.Errorf("Open after Close: %v, want ErrClosed", err)
	}
}
