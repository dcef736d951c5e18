package planner

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/perfmodel"
)

func mustProfile(t testing.TB, name string) *perfmodel.Profile {
	t.Helper()
	p, err := perfmodel.Load(name)
	if err != nil {
		t.Fatalf("load profile: %v", err)
	}
	return p
}

// testCodecMBps are per-core encode and decode speeds (raw MB/s) that the
// tests plan with, of the order an optimized build measures on one core,
// fixed here so that the tests' expectations do not follow the built-in
// codec profile's figures.
var testCodecMBps = map[string][2]float64{
	"none": {0, 0}, "s2": {1000, 2000}, "zstd": {780, 1000}, "bf16": {760, 1180}, "fp8": {300, 930}, "int8": {390, 900},
}

// mustCodec is CodecByName's codec (its ratio as the built-in profile has it) with the
// speeds of testCodecMBps.
func mustCodec(t testing.TB, name string) Codec {
	t.Helper()
	c, err := CodecByName(name)
	if err != nil {
		t.Fatal(err)
	}
	mbps, ok := testCodecMBps[name]
	if !ok {
		t.Fatalf("no test speeds for codec %s", name)
	}
	c.EncodeBytesPerSec, c.DecodeBytesPerSec = mbps[0]*1e6, mbps[1]*1e6
	return c
}

// opt13 is DistServe's motivating setting: OPT-13B on A100, 512 in / 64
// out, TTFT 0.4 s and TPOT 40 ms at 90%.
func opt13(t testing.TB) *Config {
	return &Config{
		Prefill:         mustProfile(t, "a100-80g/opt-13b/tp1"),
		Workload:        Fixed(512, 64),
		SLO:             SLO{TTFT: 400 * time.Millisecond, TPOT: 40 * time.Millisecond, Attainment: 0.9},
		LinkBytesPerSec: 25e9 / 8,
		Codec:           mustCodec(t, "none"),
		GPUBudget:       8,
		GPUCostPerHour:  2,
		Requests:        200,
		Seed:            1,
	}
}

func relErr(got, want float64) float64 { return math.Abs(got-want) / math.Abs(want) }

// At low load every request is alone in the system: its TTFT is the
// step-time model's prefill time, plus the exposed part of its KV transfer
// and the first decode step under the decode policy.
func TestLowLoadTTFTIsPrefillPlusTransfer(t *testing.T) {
	for _, policy := range []Policy{PolicyDecode, PolicyPrefill} {
		for _, gbps := range []float64{25, 400} {
			t.Run(fmt.Sprintf("%s/%gGbps", policy, gbps), func(t *testing.T) {
				cfg := opt13(t)
				cfg.Policy = policy
				cfg.LinkBytesPerSec = gbps * 1e9 / 8
				cfg.Burstiness = 100 // gaps within ±10% of the mean: no overlap at 0.01 req/s
				cfg.Ingress = 2 * time.Millisecond
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				s := newSearcher(cfg)
				r := s.sim.run(Design{Prefill: 1, Decode: 1}, 0.01, false)

				p := cfg.Prefill
				prefill := p.StepSeconds(perfmodel.Batch{Prefill: []int{512}})
				total := 512 * float64(p.KVBytesPerToken()) / (gbps * 1e9 / 8)
				layers := float64(p.Spec.Layers)
				exposed := max(total-prefill*(1-1/layers), total/layers)
				want := 0.002 + prefill
				wantKV := 0.0
				if policy == PolicyDecode {
					wantKV = exposed
					want += exposed + p.StepSeconds(perfmodel.Batch{Decode: []int{512}})
				}
				const tol = 1e-9 // s: float64 rounding of times ~100 s from the start
				for _, c := range []struct {
					name      string
					got, want float64
				}{
					{"ttft p50", r.TTFT.P50, want},
					{"ttft p99", r.TTFT.P99, want},
					{"queue", r.Budget.Queue.Mean, 0},
					{"prefill", r.Budget.Prefill.Mean, prefill},
					{"kv_transfer", r.Budget.KVTransfer.Mean, wantKV},
					{"kv exposed, any policy", r.Budget.KVTransferAny.Mean, exposed},
				} {
					if math.Abs(c.got-c.want) > tol {
						t.Errorf("%s = %.9g s, want %.9g s", c.name, c.got, c.want)
					}
				}
				if r.Attainment != 1 {
					t.Errorf("attainment at low load = %v, want 1", r.Attainment)
				}
			})
		}
	}
}

// One prefill worker with one prompt per step and Poisson arrivals is an
// M/D/1 queue: the mean time from joining the queue to the end of the
// prefill is D + R·D²/(2(1−R·D)). Requests with one output token under
// the prefill policy never reach the decode pool, so nothing else
// interferes. Tolerance: 5% (20000 requests; the estimate of the mean
// wait of a queue at load ≤ 0.8 from this many correlated samples has a
// standard error of a few percent).
func TestMD1(t *testing.T) {
	for _, load := range []float64{0.3, 0.5, 0.8} {
		t.Run(fmt.Sprintf("load%.1f", load), func(t *testing.T) {
			cfg := opt13(t)
			cfg.Workload = Fixed(512, 1)
			cfg.Policy = PolicyPrefill
			cfg.Limits.MaxPrefillTokens = 512
			cfg.SLO.TTFT = 10 * time.Second // no miss ends the run early
			cfg.Requests = 20000
			s := newSearcher(cfg)
			d := cfg.Prefill.StepSeconds(perfmodel.Batch{Prefill: []int{512}})
			rate := load / d
			r := s.sim.run(Design{Prefill: 1, Decode: 1}, rate, false)
			got := r.Budget.Queue.Mean + r.Budget.Prefill.Mean
			want := d + rate*d*d/(2*(1-rate*d))
			if e := relErr(got, want); e > 0.05 {
				t.Errorf("load %.1f: mean queue+prefill = %.4f s, M/D/1 gives %.4f s (relative error %.3f > 0.05)", load, got, want, e)
			}
			t.Logf("load %.1f: simulated %.4f s, closed form %.4f s, %d requests measured", load, got, want, r.Requests)
		})
	}
}

// The TTFT budget's terms add up to each request's TTFT, so their means add
// up to the mean TTFT, under load, for both designs and both policies.
func TestBudgetAddsUp(t *testing.T) {
	for _, policy := range []Policy{PolicyDecode, PolicyPrefill} {
		for _, d := range []Design{{Prefill: 2, Decode: 1}, {Colocated: 2, Chunk: 512}, {Colocated: 2, Chunk: -1}} {
			t.Run(string(policy)+"/"+d.String(), func(t *testing.T) {
				cfg := opt13(t)
				cfg.Policy = policy
				cfg.Workload = &Workload{Lengths: []Lengths{{100, 20}, {512, 64}, {1500, 200}, {40, 1}}}
				s := newSearcher(cfg)
				r := s.sim.run(d, 6, false)
				b := r.Budget
				sum := b.Ingress.Mean + b.Queue.Mean + b.Prefill.Mean + b.KVTransfer.Mean + b.FirstToken.Mean
				if e := relErr(sum, r.TTFT.Mean); e > 1e-9 {
					t.Errorf("budget terms sum to %.6f s, mean TTFT %.6f s", sum, r.TTFT.Mean)
				}
				if r.Requests == 0 || r.Aborted {
					t.Errorf("run measured %d requests, aborted %v", r.Requests, r.Aborted)
				}
			})
		}
	}
}

// More load never raises attainment much, and the simulation is
// deterministic in the seed.
func TestSimDeterministicAndLoadSensitive(t *testing.T) {
	cfg := opt13(t)
	s := newSearcher(cfg)
	d := Design{Prefill: 1, Decode: 1}
	a := s.sim.run(d, 2, false)
	b := newSearcher(cfg).sim.run(d, 2, false)
	if a.TTFT != b.TTFT || a.Attainment != b.Attainment {
		t.Errorf("same seed, different results: %+v vs %+v", a.TTFT, b.TTFT)
	}
	hi := s.sim.run(d, 40, false)
	if hi.Attainment >= a.Attainment || hi.TTFT.P90 <= a.TTFT.P90 {
		t.Errorf("at 40 req/s attainment %.3f, p90 TTFT %.3f s; at 2 req/s %.3f, %.3f s: want worse under load",
			hi.Attainment, hi.TTFT.P90, a.Attainment, a.TTFT.P90)
	}
	cfg.Seed = 2
	if c := newSearcher(cfg).sim.run(d, 2, false); c.TTFT == a.TTFT {
		t.Errorf("another seed gave the identical TTFT distribution %+v", c.TTFT)
	}
}

// A request longer than a decode worker's KV memory fails (and misses)
// instead of blocking the system.
func TestTooLongForMemoryFails(t *testing.T) {
	cfg := opt13(t)
	cap := cfg.Prefill.MaxKVTokens()
	cfg.Workload = &Workload{Lengths: []Lengths{{512, 64}, {int(cap), 64}}}
	s := newSearcher(cfg)
	s.sim.st.clamped = 0
	for i := range s.sim.st.lens { // the model's context would clamp it; force it back
		if s.sim.st.lens[i].In > 512 {
			s.sim.st.lens[i] = Lengths{int(cap), 64}
		}
	}
	for _, d := range []Design{{Prefill: 1, Decode: 1}, {Colocated: 1, Chunk: 512}} {
		r := s.sim.run(d, 1, false)
		if r.Failed == 0 || r.Attainment > 0.6 {
			t.Errorf("%s: %d failed, attainment %.2f; want the long half to fail", d, r.Failed, r.Attainment)
		}
	}
}

func TestGammaVariateMoments(t *testing.T) {
	for _, k := range []float64{0.25, 1, 4} {
		w := &Workload{Lengths: []Lengths{{1, 1}}, Burstiness: k}
		st := newStream(w, 50000, 0, 7, 0, false)
		gaps := make([]float64, len(st.unitArr))
		prev := 0.0
		for i, a := range st.unitArr {
			gaps[i], prev = a-prev, a
		}
		var mean float64
		for _, g := range gaps {
			mean += g
		}
		mean /= float64(len(gaps))
		cv := cvOf(gaps)
		if math.Abs(mean-1) > 0.03 || math.Abs(cv-1/math.Sqrt(k)) > 0.05/math.Sqrt(k) {
			t.Errorf("burstiness %v: gaps mean %.3f, CV %.3f; want 1 and %.3f", k, mean, cv, 1/math.Sqrt(k))
		}
	}
}
