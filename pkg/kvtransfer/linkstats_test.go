package kvtransfer

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
)

func TestLinkStats(t *testing.T) {
	const mib = 1 << 20
	type obs struct {
		addr  string
		bytes int64
		d     time.Duration
		lower bool
	}
	for _, tc := range []struct {
		name    string
		obs     []obs
		want    float64 // bytes/s of "a"
		samples int
		mean    float64 // MeanThroughput; 0: want
	}{
		{name: "none observed"},
		{name: "first sample is the estimate", obs: []obs{{"a", 10 * mib, time.Second, false}}, want: 10 * mib, samples: 1},
		{name: "moving average", obs: []obs{{"a", 10 * mib, time.Second, false}, {"a", 20 * mib, time.Second, false}}, want: 13 * mib, samples: 2},
		{name: "other addresses apart", obs: []obs{{"a", 10 * mib, time.Second, false}, {"b", 20 * mib, time.Second, false}}, want: 10 * mib, samples: 1, mean: 15 * mib},
		{name: "small transfers ignored", obs: []obs{{"a", 10 * mib, time.Second, false}, {"a", MinLinkSampleBytes - 1, time.Nanosecond, false}}, want: 10 * mib, samples: 1},
		{name: "zero time ignored", obs: []obs{{"a", 10 * mib, 0, false}}},
		{name: "a lower bound does not lower it", obs: []obs{{"a", 10 * mib, time.Second, false}, {"a", 1 * mib, time.Second, true}}, want: 10 * mib, samples: 2},
		{name: "a lower bound raises it", obs: []obs{{"a", 10 * mib, time.Second, false}, {"a", 20 * mib, time.Second, true}}, want: 13 * mib, samples: 2},
		{name: "a first lower bound is the estimate", obs: []obs{{"a", 1 * mib, time.Second, true}}, want: 1 * mib, samples: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLinkStats(0.3)
			for _, o := range tc.obs {
				l.Observe(o.addr, o.bytes, o.d, o.lower)
			}
			got, n := l.Throughput("a")
			if math.Abs(got-tc.want) > 1e-6*tc.want || n != tc.samples {
				t.Errorf("Throughput(a) = %v over %d samples, want %v over %d", got, n, tc.want, tc.samples)
			}
			mean := tc.mean
			if mean == 0 {
				mean = tc.want
			}
			if got := l.MeanThroughput(); math.Abs(got-mean) > 1e-6*mean {
				t.Errorf("MeanThroughput() = %v, want %v", got, mean)
			}
		})
	}
}

// The least recently updated address goes when the table is full.
func TestLinkStatsBounded(t *testing.T) {
	l := NewLinkStats(0)
	for i := range maxLinkAddrs + 1 {
		l.Observe(fmt.Sprintf("d%d:1", i), MinLinkSampleBytes, time.Second, false)
	}
	if _, n := l.Throughput("d0:1"); n != 0 {
		t.Error("the oldest address was kept")
	}
	if _, n := l.Throughput(fmt.Sprintf("d%d:1", maxLinkAddrs)); n != 1 {
		t.Error("the newest address was dropped")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.addr) != maxLinkAddrs {
		t.Errorf("%d addresses kept, want %d", len(l.addr), maxLinkAddrs)
	}
}

// tickClock advances by step at every reading.
type tickClock struct {
	mu   sync.Mutex
	now  time.Time
	step time.Duration
}

func (c *tickClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(c.step)
	return c.now
}

// EncodeTime is the clock's time around every frame's encoding: one tick
// per frame with a clock that ticks at every reading.
func TestSenderEncodeTime(t *testing.T) {
	verifyNoLeaks(t)
	addr := startServer(t, &fakeReceiver{}, nil)
	clk := &tickClock{now: time.Unix(1, 0), step: time.Millisecond}
	const maxFrame = 4096
	d := NewDialer(WithClock(clk.Now, nil), WithMaxFrameBytes(maxFrame))
	defer d.Close()
	h := StreamHeader{RequestID: "r", Codec: "bf16", Layers: 2, Tokens: 64, TokenBytes: 256, DType: engine.BF16}
	s, err := d.Open(context.Background(), addr, h)
	if err != nil {
		t.Fatal(err)
	}
	kv := gaussianBF16(h.Tokens*h.TokenBytes/2, 1)
	for l := range h.Layers {
		if err := s.Send(l, 0, h.Tokens, kv, 0); err != nil {
			t.Fatal(err)
		}
	}
	frames := h.Layers * h.Tokens * h.TokenBytes / maxFrame
	if got, want := s.EncodeTime(), time.Duration(frames)*time.Millisecond; got != want {
		t.Errorf("EncodeTime = %v, want %v (%d frames)", got, want, frames)
	}
	if _, err := s.Commit(context.Background(), Commit{}); err != nil {
		t.Fatal(err)
	}
}
