package planner

import (
	"testing"
	"time"
)

// BenchmarkPlan times a whole plan at the default 2000 requests per
// simulation: DistServe's OPT-13B example on 8 and 16 GPUs, and OPT-66B
// (4-GPU workers) at 25 Gb/s on 32 GPUs. It reports the simulations per
// plan.
func BenchmarkPlan(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  func(testing.TB) *Config
	}{
		{"opt-13b/8gpu", func(tb testing.TB) *Config { c := opt13(tb); c.Requests = 0; return c }},
		{"opt-13b/16gpu", func(tb testing.TB) *Config { c := opt13(tb); c.Requests, c.GPUBudget = 0, 16; return c }},
		{"opt-66b/32gpu/25gbps", func(tb testing.TB) *Config {
			c := opt13(tb)
			c.Prefill = mustProfile(tb, "a100-80g/opt-66b/tp4")
			c.Workload = Fixed(755, 200)
			c.SLO = SLO{TTFT: 2500 * time.Millisecond, TPOT: 150 * time.Millisecond, Attainment: 0.9}
			c.Requests, c.GPUBudget = 0, 32
			return c
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := bc.cfg(b)
			sims := 0
			for b.Loop() {
				p, err := Run(b.Context(), cfg)
				if err != nil {
					b.Fatal(err)
				}
				sims = p.Simulations
			}
			b.ReportMetric(float64(sims), "sims/plan")
		})
	}
}

// BenchmarkSimulate times one simulation of 2000 OPT-13B requests at a
// rate near each design's capacity, and reports simulated requests per
// second of CPU.
func BenchmarkSimulate(b *testing.B) {
	cfg := opt13(b)
	cfg.Requests = 2000
	cfg.LinkBytesPerSec = 400e9 / 8
	for _, d := range []Design{{Prefill: 2, Decode: 2}, {Colocated: 4, Chunk: 512}, {Colocated: 4, Chunk: -1}} {
		b.Run(d.String(), func(b *testing.B) {
			s := newSearcher(cfg)
			n := 0
			for b.Loop() {
				n = len(s.sim.reqs)
				s.sim.run(d, 20, false)
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}

// BenchmarkOnlineTick times one re-plan of the online controller over a
// window of 3 req/s (400 requests per simulation, 8 GPUs).
func BenchmarkOnlineTick(b *testing.B) {
	cfg := opt13(b)
	cfg.LinkBytesPerSec = 400e9 / 8
	cfg.Workload, cfg.Requests = nil, 0
	o, err := NewOnline(OnlineConfig{Base: *cfg, Window: 2 * time.Minute, Interval: time.Nanosecond}, nil)
	if err != nil {
		b.Fatal(err)
	}
	tr := newTraffic(cfg.Prefill)
	tr.until(o, t0.Add(2*time.Minute), 10)
	now := t0.Add(2 * time.Minute)
	for b.Loop() {
		now = now.Add(time.Nanosecond)
		if _, ok := o.Tick(now); !ok {
			b.Fatal("no re-plan")
		}
	}
}
