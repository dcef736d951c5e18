package kvtransfer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

func TestLinkCharge(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type step struct {
		at    time.Duration // after t0
		bytes float64
		want  time.Duration // returned time, after t0
	}
	tests := []struct {
		name  string
		gbps  float64
		steps []step
	}{
		{"one byte per ns at 8 Gb/s", 8, []step{{0, 1000, 1000}}},
		{"back to back queue", 8, []step{{0, 1000, 1000}, {0, 500, 1500}, {10, 100, 1600}}},
		{"idle link starts now", 8, []step{{0, 1000, 1000}, {5000, 1000, 6000}}},
		{"100 Gb/s", 100, []step{{0, 12.5e9, time.Second}}},
		{"fractions round up", 8, []step{{0, 0.5, 1}}},
		{"nothing costs nothing", 8, []step{{0, 0, 0}, {0, -3, 0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLink(tc.gbps)
			for i, s := range tc.steps {
				if got := l.charge(t0.Add(s.at), s.bytes).Sub(t0); got != s.want {
					t.Errorf("step %d: done at +%v, want +%v", i, got, s.want)
				}
			}
		})
	}
}

func TestChargeBytes(t *testing.T) {
	tests := []struct {
		full, raw, wire int
		want            float64
	}{
		{1000, 1000, 1000, 1000},
		{4000, 1000, 500, 2000}, // scaled-down payload, 2:1 codec
		{0, 1000, 500, 0},
		{100, 0, 10, 0},
	}
	for _, tc := range tests {
		if got := chargeBytes(tc.full, tc.raw, tc.wire); got != tc.want {
			t.Errorf("chargeBytes(%d, %d, %d) = %v, want %v", tc.full, tc.raw, tc.wire, got, tc.want)
		}
	}
}

// fakeTime is a clock that only moves when told and a sleeper that records
// what it was asked to wait and advances the clock by it.
type fakeTime struct {
	mu     sync.Mutex
	now    time.Time
	slept  []time.Duration
	sleepE error
}

func (f *fakeTime) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeTime) Sleep(_ context.Context, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slept = append(f.slept, d)
	if f.sleepE != nil {
		return f.sleepE
	}
	f.now = f.now.Add(d)
	return nil
}

func (f *fakeTime) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

func TestSenderPacing(t *testing.T) {
	verifyNoLeaks(t)
	r := &fakeReceiver{}
	addr := startServer(t, r, nil)
	ft := &fakeTime{now: time.Unix(5000, 0)}
	// 8 Gb/s: one byte per nanosecond.
	d := NewDialer(WithLinkGbps(8), WithClock(ft.Now, ft.Sleep))
	defer d.Close()
	h := StreamHeader{RequestID: "r", Codec: "none", Layers: 1, Tokens: 30, TokenBytes: 128, DType: engine.BF16}
	kv := gaussianBF16(h.Tokens*h.TokenBytes/2, 3)
	s, err := d.Open(context.Background(), addr, h)
	if err != nil {
		t.Fatal(err)
	}
	chunk := func(i int) []byte { return kv[i*10*h.TokenBytes : (i+1)*10*h.TokenBytes] }
	raw := 10 * h.TokenBytes                    // 1280 bytes per Send
	wire := raw + codec.HeaderLen("r")          // "none" adds only the frame header
	full := 10 * raw                            // stands for ten times the payload
	perSend := time.Duration(full * wire / raw) // bytes at 1 B/ns, exact here

	// First Send: the link is idle; Send waits the chunk's time.
	if err := s.Send(0, 0, 10, chunk(0), full); err != nil {
		t.Fatal(err)
	}
	// Second Send right after: the clock moved by the first wait only, so
	// it waits its own time again.
	if err := s.Send(0, 10, 20, chunk(1), full); err != nil {
		t.Fatal(err)
	}
	// Third Send after the link went idle for long: the time spent counts,
	// so fullBytes 0 (= len(raw)) costs only the raw frame's time.
	ft.Advance(time.Hour)
	if err := s.Send(0, 20, 30, chunk(2), 0); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{perSend, perSend, time.Duration(wire)}
	if diff := cmp.Diff(want, ft.slept); diff != "" {
		t.Errorf("waits (-want +got):\n%s", diff)
	}
	if got, want := s.ChargedBytes(), int64(2*full*wire/raw+wire); got != want {
		t.Errorf("ChargedBytes = %d, want %d", got, want)
	}
	if _, err := s.Commit(context.Background(), Commit{}); err != nil {
		t.Fatal(err)
	}
}

func TestSenderPacingInterrupted(t *testing.T) {
	verifyNoLeaks(t)
	r := &fakeReceiver{}
	addr := startServer(t, r, nil)
	stop := errors.New("stopped")
	ft := &fakeTime{now: time.Unix(5000, 0), sleepE: stop}
	d := NewDialer(WithLinkGbps(1), WithClock(ft.Now, ft.Sleep))
	defer d.Close()
	h := StreamHeader{RequestID: "r", Codec: "none", Layers: 1, Tokens: 1, TokenBytes: 128, DType: engine.BF16}
	s, err := d.Open(context.Background(), addr, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(0, 0, 1, make([]byte, 128), 0); !errors.Is(err, stop) {
		t.Fatalf("Send = %v, want the sleeper's error", err)
	}
	if _, _, aborts, _ := r.onlySink(t).state(); aborts != 1 {
		t.Errorf("sink aborted %d times, want 1", aborts)
	}
}

func TestSleepCtx(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	if err := sleepCtx(ctx, 0); err != nil {
		t.Errorf("sleepCtx(0) = %v", err)
	}
	if err := sleepCtx(ctx, time.Nanosecond); err != nil {
		t.Errorf("sleepCtx(1ns) = %v", err)
	}
	cause := errors.New("why")
	cancel(cause)
	if err := sleepCtx(ctx, time.Hour); !errors.Is(err, cause) {
		t.Errorf("sleepCtx on a cancelled ctx = %v, want its cause", err)
	}
}
