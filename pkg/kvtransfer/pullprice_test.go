package kvtransfer

import (
	"math"
	"testing"
	"time"
)

// TestPullPricer prices pulls of a prefix of 16-token blocks, 125000
// bytes (1 Mbit) of KV a token, against a worker that computes 1000
// prompt tokens a second: at 1 Gb/s pulling a token takes as long as
// computing it (cost ratio 1), at 10 Gb/s a tenth.
func TestPullPricer(t *testing.T) {
	const (
		bt         = 16
		tokenBytes = 125000
		ms         = time.Millisecond
	)
	type pull struct {
		addr  string
		bytes int64
		d     time.Duration
	}
	type price struct {
		addr      string
		own, want int
		worth     bool
		giveUp    time.Duration
	}
	for _, tc := range []struct {
		name   string
		gbps   float64
		always bool
		steps  [][2]int // tokens, milliseconds
		pulls  []pull
		prices []price
		ratio  float64
	}{
		{name: "pulls off", gbps: 0, steps: [][2]int{{1000, 1000}},
			prices: []price{{"a", 0, 4, false, 0}}},
		{name: "no step measured: worth it, no limit", gbps: 10,
			prices: []price{{"a", 0, 4, true, 0}, {"a", 4, 4, false, 0}, {"a", 5, 4, false, 0}}},
		{name: "measured: a faster link pulls", gbps: 10, steps: [][2]int{{1000, 1000}},
			// 64 tokens: pull 6.4 ms, compute 64 ms; with 3 blocks own,
			// 16 ms saved, given up after 50 ms at least.
			prices: []price{{"a", 0, 4, true, 64 * ms}, {"a", 3, 4, true, 50 * ms}, {"a", 4, 4, false, 0}},
			ratio:  0.1},
		{name: "measured: a link as slow as computing does not", gbps: 1, steps: [][2]int{{1000, 1000}},
			prices: []price{{"a", 0, 4, false, 0}}, ratio: 1},
		{name: "always pulls, and waits for the pull", gbps: 1, always: true, steps: [][2]int{{1000, 1000}},
			prices: []price{{"a", 0, 4, true, 0}, {"a", 4, 4, false, 0}}, ratio: 1},
		{name: "moving average of steps", gbps: 1, steps: [][2]int{{1000, 1000}, {2000, 500}},
			// 1000 + 0.2 × (4000 − 1000) = 1600 tokens/s.
			ratio: 1.6},
		{name: "steps of nothing ignored", gbps: 1, steps: [][2]int{{1000, 1000}, {0, 100}, {100, 0}}, ratio: 1},
		{name: "a measured link prices its peer only", gbps: 1, steps: [][2]int{{1000, 1000}},
			// 12.5 MB in 10 ms: 1.25 GB/s, 10 Gb/s to b; a is assumed 1 Gb/s.
			pulls:  []pull{{"b", 12_500_000, 10 * ms}},
			prices: []price{{"a", 0, 4, false, 0}, {"b", 0, 4, true, 64 * ms}},
			ratio:  0.1},
		{name: "the ratio takes the mean of measured links", gbps: 1, steps: [][2]int{{1000, 1000}},
			// 10 Gb/s to b, 30 Gb/s to c: a mean of 20 Gb/s.
			pulls: []pull{{"b", 12_500_000, 10 * ms}, {"c", 37_500_000, 10 * ms}},
			ratio: 0.05},
		{name: "a pull too small to measure the link", gbps: 1, steps: [][2]int{{1000, 1000}},
			pulls:  []pull{{"b", 1000, time.Nanosecond}},
			prices: []price{{"b", 0, 4, false, 0}}, ratio: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPullPricer(tc.gbps)
			p.Always = tc.always
			if p.On() != (tc.gbps > 0) {
				t.Errorf("On() = %t with %v Gb/s", p.On(), tc.gbps)
			}
			for _, s := range tc.steps {
				p.ObserveStep(s[0], time.Duration(s[1])*ms)
			}
			for _, x := range tc.pulls {
				p.ObservePull(x.addr, x.bytes, x.d, 0)
			}
			for _, x := range tc.prices {
				worth, giveUp := p.Price(x.addr, x.own, x.want, bt, tokenBytes)
				if worth != x.worth || (giveUp-x.giveUp).Abs() > time.Microsecond {
					t.Errorf("Price(%s, own %d, want %d) = %t, give up after %v; want %t, %v", x.addr, x.own, x.want, worth, giveUp, x.worth, x.giveUp)
				}
			}
			if got := p.CostRatio(tokenBytes); math.Abs(got-tc.ratio) > 1e-9 {
				t.Errorf("CostRatio = %v, want %v", got, tc.ratio)
			}
		})
	}
	var nilPricer *PullPricer
	if nilPricer.On() {
		t.Error("a nil pricer pulls")
	}
}

// TestPullPricerCostRatio: the heartbeat's pull cost is a token's true
// KV size over the link (assumed, then the peers' measured mean) against
// the measured prefill throughput, and 0 while pulls are off or no step
// was measured.
func TestPullPricerCostRatio(t *testing.T) {
	const bpt = 131072 // llama-3-8b bf16: bytes of KV a token
	p := NewPullPricer(100)
	if got := p.CostRatio(bpt); got != 0 {
		t.Errorf("before any step: %v, want 0", got)
	}
	p.ObserveStep(20000, time.Second) // 20k tokens/s: 50 µs a token
	// 131072 B at 12.5 GB/s is 10.49 µs: 0.2097 of 50 µs.
	if got, want := p.CostRatio(bpt), float64(bpt)/12.5e9*20000; math.Abs(got-want) > 1e-9 {
		t.Errorf("assumed link: %v, want %v", got, want)
	}
	p.ObservePull("peer-a", 1<<30, time.Second, 0) // 1 GiB/s measured
	if got, want := p.CostRatio(bpt), float64(bpt)/(1<<30)*20000; math.Abs(got-want) > 1e-9 {
		t.Errorf("measured link: %v, want %v", got, want)
	}
	off := NewPullPricer(0)
	off.ObserveStep(20000, time.Second)
	if got := off.CostRatio(bpt); got != 0 {
		t.Errorf("pulls off: %v, want 0", got)
	}
}

// TestPullPricerFixedCost: a pull pays its fixed cost (the first byte of
// past pulls) however few its bytes. Issue 38: pulls of one 512-token
// block took 62-125 ms where computing took about 17 ms; priced on bytes
// alone over a fast link they looked worth it. Fails without the fixed
// term.
func TestPullPricerFixedCost(t *testing.T) {
	const tokenBytes = 131072 // llama-3-8b bf16
	p := NewPullPricer(100)
	p.ObserveStep(30000, time.Second) // 512 tokens in about 17 ms
	if worth, _ := p.Price("a", 0, 32, 16, tokenBytes); !worth {
		t.Fatal("an unmeasured peer over 100 Gb/s: 512 tokens should be worth pulling")
	}
	// A pull of 512 tokens took 90 ms, 80 of them before the first byte.
	p.ObservePull("a", 512*tokenBytes, 90*time.Millisecond, 80*time.Millisecond)
	if worth, _ := p.Price("a", 0, 32, 16, tokenBytes); worth {
		t.Error("a peer whose pulls cost 80 ms before their first byte is still worth pulling 17 ms of prefill from")
	}
	if pull, _ := p.Estimate("a", 512, 512*tokenBytes); pull < 80*time.Millisecond {
		t.Errorf("Estimate = %v, want at least the 80 ms fixed cost", pull)
	}
	if worth, _ := p.Price("b", 0, 32, 16, tokenBytes); !worth {
		t.Error("another peer's fixed cost priced this one")
	}
}
