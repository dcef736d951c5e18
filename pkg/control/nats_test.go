package control

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/pdserve/pdserve/internal/poll"
	"go.uber.org/goleak"
)

// startNATS runs an embedded server and connects to it; both are closed,
// and goroutine leaks checked, when the test ends.
func startNATS(t *testing.T) *nats.Conn {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs last
	s, url, err := StartEmbedded("127.0.0.1:-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func TestHeartbeatMembershipOverNATS(t *testing.T) {
	nc := startNATS(t)
	clock := newFakeClock(time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC))
	m := NewMembership(5 * time.Second)
	stop, err := Watch(context.Background(), nc, m, clock.Now, time.Millisecond, onTime)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	want := Heartbeat{
		ID: "decode-1", Role: string(RoleDecode), GRPCAddr: "10.0.0.1:7000", Model: "tiny", MaxSeqLen: 1024,
		KVBlocksFree: 10, KVBlocksTotal: 64, QueuedPrefillTokens: 3, RunningBatch: 2,
		StepTimesMs: []float64{1.5, 2.25}, PrefixDigest: []uint64{1, 1<<63 + 5},
		Time: time.Date(2025, 5, 6, 7, 8, 9, 123456789, time.UTC),
	}
	var draining atomic.Bool
	pub := NewPublisher(nc, time.Hour, func() Heartbeat {
		hb := want
		hb.Draining = draining.Load()
		return hb
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = pub.Run(ctx) }) // publishes at once

	poll.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		got := m.Members(RoleDecode)
		if diff := cmp.Diff([]Heartbeat{want}, got); diff != "" {
			return fmt.Errorf("Members (-want +got):\n%s", diff)
		}
		return nil
	})

	// Draining: an explicit Publish removes it from Members at once.
	draining.Store(true)
	if err := pub.Publish(); err != nil {
		t.Fatal(err)
	}
	poll.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if got := m.Members(RoleDecode); len(got) != 0 {
			return fmt.Errorf("draining worker still listed: %+v", got)
		}
		if hb, ok := m.Get(want.ID); !ok || !hb.Draining {
			return fmt.Errorf("Get = %+v, %v; want a draining member", hb, ok)
		}
		return nil
	})

	// TTL: with the publisher stopped and the clock past the TTL, the
	// expiry ticker removes the member.
	cancel()
	wg.Wait()
	if runErr != nil {
		t.Fatalf("Run = %v, want nil after cancel", runErr)
	}
	clock.Advance(5*time.Second + time.Nanosecond)
	poll.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if _, ok := m.Get(want.ID); ok {
			return errors.New("member not expired")
		}
		return nil
	})
}

func TestPublisherRejectsBadHeartbeat(t *testing.T) {
	nc := startNATS(t)
	pub := NewPublisher(nc, time.Second, func() Heartbeat { return Heartbeat{ID: "a.b", Role: "decode"} })
	if err := pub.Run(context.Background()); !errors.Is(err, ErrBadHeartbeat) {
		t.Fatalf("Run = %v, want ErrBadHeartbeat", err)
	}
	pub = NewPublisher(nc, 0, func() Heartbeat { return Heartbeat{ID: "a", Role: "decode"} })
	if err := pub.Run(context.Background()); err == nil {
		t.Fatal("Run with interval 0 = nil, want an error")
	}
}

func TestWatchIgnoresMalformedAndStops(t *testing.T) {
	nc := startNATS(t)
	m := NewMembership(time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	stop, err := Watch(ctx, nc, m, time.Now, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for _, data := range []string{"not json", `{"id":"","role":"decode"}`, `{"id":"x.y","role":"decode"}`} {
		if err := nc.Publish(HeartbeatSubject("decode", "x"), []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Publish(HeartbeatSubject("prefill", "p1"), []byte(`{"id":"p1","role":"prefill"}`)); err != nil {
		t.Fatal(err)
	}
	poll.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if _, ok := m.Get("p1"); !ok {
			return errors.New("p1 not observed")
		}
		return nil
	})
	if got := m.All(); len(got) != 1 {
		t.Errorf("All = %+v, want only p1", got)
	}
	// The watch ends with ctx: it unsubscribes; stop after that and a
	// second stop are no-ops.
	if n := nc.NumSubscriptions(); n != 1 {
		t.Fatalf("%d subscriptions while watching, want 1", n)
	}
	cancel()
	poll.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if n := nc.NumSubscriptions(); n != 0 {
			return fmt.Errorf("%d subscriptions after ctx ended", n)
		}
		return nil
	})
	stop()
	stop()
	if _, err := Watch(context.Background(), nc, m, time.Now, 0); err == nil {
		t.Error("Watch with interval 0 = nil error")
	}
}

func TestCommands(t *testing.T) {
	nc := startNATS(t)
	var mu sync.Mutex
	var got []Command
	sub, err := HandleCommands(nc, "decode", "decode-1", func(c Command) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, c)
		if c.Kind == CmdResend && c.Arg == "" {
			return errors.New("resend needs a decode address")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sub.Unsubscribe(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	tests := []struct {
		name    string
		worker  string
		cmd     Command
		wantErr error
	}{
		{"drain", "decode-1", Command{Kind: CmdDrain}, nil},
		{"cancel", "decode-1", Command{Kind: CmdCancel, RequestID: "r1"}, nil},
		{"handler error", "decode-1", Command{Kind: CmdResend, RequestID: "r2"}, ErrCommandFailed},
		{"no such worker", "decode-9", Command{Kind: CmdDrain}, ErrNoWorker},
		{"bad worker id", "decode.1", Command{Kind: CmdDrain}, ErrBadToken},
		{"empty kind", "decode-1", Command{}, ErrBadCommand},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := SendCommand(ctx, nc, "decode", tc.worker, tc.cmd)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("SendCommand = %v, want %v", err, tc.wantErr)
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	want := []Command{{Kind: CmdDrain}, {Kind: CmdCancel, RequestID: "r1"}, {Kind: CmdResend, RequestID: "r2"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("handled commands (-want +got):\n%s", diff)
	}

	// A request that is not a command gets an error reply.
	msg, err := nc.RequestWithContext(ctx, CommandSubject("decode", "decode-1"), []byte("{"))
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) == `{"ok":true}` {
		t.Errorf("reply to garbage = %s, want an error", msg.Data)
	}
}

func TestStartEmbeddedBadAddr(t *testing.T) {
	for _, addr := range []string{"nope", "127.0.0.1:x", "127.0.0.1:70000"} {
		if s, _, err := StartEmbedded(addr); err == nil {
			s.Shutdown()
			t.Errorf("StartEmbedded(%q) = nil error", addr)
		}
	}
}

// TestWatchHoldsMembersWhileDisconnected: while the watcher's NATS
// connection is down (the server restarts), no member expires however
// long it lasts; once reconnected, a member not heard from for a TTL
// expires as before.
func TestWatchHoldsMembersWhileDisconnected(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s, url, err := StartEmbedded("127.0.0.1:-1")
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr().String()
	var reconnected atomic.Int32
	nc, err := nats.Connect(url, nats.ReconnectWait(10*time.Millisecond), nats.MaxReconnects(-1),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	clock := newFakeClock(time.Unix(1000, 0))
	ttl := 5 * time.Second
	m := NewMembership(ttl)
	stop, err := Watch(context.Background(), nc, m, clock.Now, time.Millisecond, onTime)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	m.Observe(Heartbeat{ID: "p1", Role: string(RolePrefill), GRPCAddr: "a:1"}, clock.Now())

	s.Shutdown()
	s.WaitForShutdown()
	poll.WaitFor(t, "disconnected", func() bool { return !nc.IsConnected() })
	clock.Advance(3 * ttl)
	time.Sleep(50 * time.Millisecond) // many expiry ticks while deaf
	if _, ok := m.Get("p1"); !ok {
		t.Fatal("member expired while the watcher could not hear heartbeats")
	}

	s2, _, err := StartEmbedded(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s2.Shutdown()
		s2.WaitForShutdown()
	}()
	poll.WaitFor(t, "reconnected", func() bool { return reconnected.Load() > 0 && nc.IsConnected() })
	time.Sleep(20 * time.Millisecond)
	if _, ok := m.Get("p1"); !ok {
		t.Fatal("member expired right after the reconnect, before a TTL passed")
	}
	clock.Advance(ttl + time.Second)
	poll.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if _, ok := m.Get("p1"); ok {
			return errors.New("member not expired a TTL after the reconnect")
		}
		return nil
	})
}
