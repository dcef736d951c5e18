package runner_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/loadtest/client"
	"github.com/pdserve/pdserve/loadtest/internal/ssetest"
	"github.com/pdserve/pdserve/loadtest/runner"
	"github.com/pdserve/pdserve/pkg/workload"
)

func requests(t *testing.T, n int) []workload.Request {
	t.Helper()
	w, err := workload.Random(workload.RandomOptions{InputLen: 4, OutputLen: 2}, n, 1, workload.Synth{})
	if err != nil {
		t.Fatal(err)
	}
	return w.Requests
}

// lockstepClock is a virtual clock that lets the runner move time only
// after the previous request's Doer has run.
type lockstepClock struct {
	*ssetest.Clock
	called chan struct{}
	n      int
}

func (c *lockstepClock) SleepUntil(ctx context.Context, t time.Time) error {
	if c.n > 0 {
		<-c.called
	}
	c.n++
	return c.Clock.SleepUntil(ctx, t)
}

func TestScheduleFollowed(t *testing.T) {
	t0 := time.Unix(100, 0)
	sched := []time.Duration{0, 10 * time.Millisecond, 10 * time.Millisecond, 250 * time.Millisecond, time.Second}
	clock := &lockstepClock{Clock: ssetest.NewClock(t0), called: make(chan struct{}, len(sched))}
	var mu sync.Mutex
	sentAt := map[int]time.Duration{}
	do := func(_ context.Context, r *workload.Request) client.Outcome {
		mu.Lock()
		defer mu.Unlock()
		sentAt[r.Index] = clock.Peek().Sub(t0)
		clock.called <- struct{}{}
		return client.Outcome{Index: r.Index, Success: true}
	}
	res, err := runner.Run(context.Background(), requests(t, 5), do, runner.Config{Schedule: sched, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]time.Duration{}
	for i, s := range sched {
		want[i] = s
	}
	if diff := cmp.Diff(want, sentAt); diff != "" {
		t.Errorf("send offsets (-want +got):\n%s", diff)
	}
	if res.Duration != time.Second || len(res.Outcomes) != 5 || res.Interrupted {
		t.Errorf("duration %v, %d outcomes, interrupted %v; want 1s, 5, false", res.Duration, len(res.Outcomes), res.Interrupted)
	}
	for i, o := range res.Outcomes {
		if o.Index != i {
			t.Errorf("outcome %d is request %d", i, o.Index)
		}
	}
}

// waitFor polls cond until it holds or fails the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // polling interval, not a wait for an event
	}
}

func TestConcurrencyCap(t *testing.T) {
	var inflight, peak atomic.Int32
	release := make(chan struct{})
	do := func(_ context.Context, r *workload.Request) client.Outcome {
		n := inflight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		inflight.Add(-1)
		return client.Outcome{Index: r.Index, Success: true}
	}
	var done []int
	cfg := runner.Config{MaxConcurrency: 3, Progress: func(d, total int) {
		if total != 10 {
			t.Errorf("progress total %d, want 10", total)
		}
		done = append(done, d)
	}}
	finished := make(chan runner.Result)
	go func() {
		res, err := runner.Run(context.Background(), requests(t, 10), do, cfg)
		if err != nil {
			t.Error(err)
		}
		finished <- res
	}()
	waitFor(t, "three requests in flight", func() bool { return inflight.Load() == 3 })
	for range 10 {
		release <- struct{}{}
	}
	res := <-finished
	if p := peak.Load(); p != 3 {
		t.Errorf("peak in flight %d, want 3", p)
	}
	if len(res.Outcomes) != 10 {
		t.Errorf("%d outcomes, want 10", len(res.Outcomes))
	}
	if diff := cmp.Diff([]int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, done); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
}

func TestCancelStopsSending(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int32
	do := func(ctx context.Context, r *workload.Request) client.Outcome {
		if calls.Add(1) == 2 {
			cancel()
		}
		<-ctx.Done() // requests in flight see the cancel
		return client.Outcome{Index: r.Index, Error: ctx.Err().Error()}
	}
	res, err := runner.Run(ctx, requests(t, 50), do, runner.Config{MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Interrupted || len(res.Outcomes) != 2 {
		t.Errorf("interrupted %v with %d outcomes, want true with 2", res.Interrupted, len(res.Outcomes))
	}
}

func TestRequestTimeout(t *testing.T) {
	do := func(ctx context.Context, r *workload.Request) client.Outcome {
		<-ctx.Done()
		return client.Outcome{Index: r.Index, Error: ctx.Err().Error()}
	}
	res, err := runner.Run(context.Background(), requests(t, 2), do, runner.Config{RequestTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range res.Outcomes {
		if o.Error != context.DeadlineExceeded.Error() {
			t.Errorf("outcome %d: error %q, want a deadline", o.Index, o.Error)
		}
	}
}

func TestBadConfig(t *testing.T) {
	do := func(context.Context, *workload.Request) client.Outcome { return client.Outcome{} }
	for _, cfg := range []runner.Config{
		{Schedule: []time.Duration{0}},
		{MaxConcurrency: -1},
	} {
		if _, err := runner.Run(context.Background(), requests(t, 2), do, cfg); !errors.Is(err, runner.ErrConfig) {
			t.Errorf("%+v: got %v, want ErrConfig", cfg, err)
		}
	}
}

func TestScale(t *testing.T) {
	t0 := time.Unix(0, 0)
	r := runner.Result{Start: t0, Duration: 4 * time.Second, Outcomes: []client.Outcome{{
		Start: t0.Add(2 * time.Second), TTFT: 100 * time.Millisecond, TTFO: 100 * time.Millisecond,
		Latency: 300 * time.Millisecond, ITL: []time.Duration{200 * time.Millisecond},
		Budget: map[string]any{"ttft_ms": 100.0, "kv_bytes_raw": 10.0, "codec": "none"},
	}}}
	runner.Scale(&r, 2)
	want := runner.Result{Start: t0, Duration: 2 * time.Second, Outcomes: []client.Outcome{{
		Start: t0.Add(time.Second), TTFT: 50 * time.Millisecond, TTFO: 50 * time.Millisecond,
		Latency: 150 * time.Millisecond, ITL: []time.Duration{100 * time.Millisecond},
		Budget: map[string]any{"ttft_ms": 50.0, "kv_bytes_raw": 10.0, "codec": "none"},
	}}}
	if diff := cmp.Diff(want, r); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
