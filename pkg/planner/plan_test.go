package planner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pdserve/pdserve/pkg/perfmodel"
)

func mustRun(t *testing.T, cfg *Config) *Plan {
	t.Helper()
	p, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return p
}

// opt66 is DistServe's chatbot setting for OPT-66B (ShareGPT means 755 in
// / 200 out, TTFT 2.5 s, TPOT 0.15 s at 90%) on 4-GPU workers, the first
// token from the decode worker (the KV transfer in TTFT).
func opt66(t *testing.T, gbps float64, codec string) *Config {
	return &Config{
		Prefill:         mustProfile(t, "a100-80g/opt-66b/tp4"),
		Workload:        Fixed(755, 200),
		SLO:             SLO{TTFT: 2500 * time.Millisecond, TPOT: 150 * time.Millisecond, Attainment: 0.9},
		Rate:            1.5,
		LinkBytesPerSec: gbps * 1e9 / 8,
		Codec:           mustCodec(t, codec),
		Policy:          PolicyDecode,
		GPUBudget:       20,
		GPUCostPerHour:  2,
		Limits:          Limits{ChunkTokens: 1024},
		Requests:        100,
		Seed:            1,
	}
}

// The same OPT-66B workload at the same rate needs more replicas when the
// pools are joined by 25 Gb/s than by 400 Gb/s (2.4 MB of KV per token:
// 0.57 s per prompt at 25 Gb/s), its TTFT budget is dominated by
// kv_transfer, and the lossy fp8 codec (1.88×) changes the 25 Gb/s plan.
func TestKVTransferMatters(t *testing.T) {
	slow := mustRun(t, opt66(t, 25, "none"))
	fast := mustRun(t, opt66(t, 400, "none"))
	fp8 := mustRun(t, opt66(t, 25, "fp8"))
	for _, p := range []*Plan{slow, fast, fp8} {
		t.Logf("%5.0f Gb/s %-4s: %dP+%dD, %.3g req/s per GPU, TTFT budget %+v", p.LinkGbps, p.Codec.Name,
			p.PrefillReplicas, p.DecodeReplicas, p.GoodputPerGPU.Disaggregated, p.TTFTBudgetMs)
	}
	reps := func(p *Plan) [2]int { return [2]int{p.PrefillReplicas, p.DecodeReplicas} }
	if reps(slow) == reps(fast) {
		t.Errorf("25 and 400 Gb/s give the same plan %v", reps(slow))
	}
	if reps(slow) == reps(fp8) {
		t.Errorf("fp8 at 25 Gb/s gives the same plan %v as no codec", reps(slow))
	}
	if gs, gf := slow.Disaggregated.GPUs, fast.Disaggregated.GPUs; gs <= gf {
		t.Errorf("25 Gb/s plan uses %d GPUs, 400 Gb/s %d: want more at 25", gs, gf)
	}
	if ks, kf := slow.TTFTBudgetMs.KVTransfer, fast.TTFTBudgetMs.KVTransfer; ks < 10*kf || ks < slow.TTFTBudgetMs.Prefill {
		t.Errorf("kv_transfer %.1f ms at 25 Gb/s, %.1f ms at 400 Gb/s, prefill %.1f ms: want it to dominate at 25 Gb/s",
			ks, kf, slow.TTFTBudgetMs.Prefill)
	}
	if fp8.TTFTBudgetMs.KVTransfer >= slow.TTFTBudgetMs.KVTransfer {
		t.Errorf("fp8 kv_transfer %.1f ms ≥ none %.1f ms", fp8.TTFTBudgetMs.KVTransfer, slow.TTFTBudgetMs.KVTransfer)
	}
	if !(fast.GoodputPerGPU.Disaggregated > fp8.GoodputPerGPU.Disaggregated && fp8.GoodputPerGPU.Disaggregated > slow.GoodputPerGPU.Disaggregated) {
		t.Errorf("goodput per GPU: 400 Gb/s %.3g, 25 Gb/s fp8 %.3g, 25 Gb/s %.3g: want decreasing",
			fast.GoodputPerGPU.Disaggregated, fp8.GoodputPerGPU.Disaggregated, slow.GoodputPerGPU.Disaggregated)
	}
}

// DistServe's motivating example (OSDI'24 §2): OPT-13B on A100, 512 in /
// 64 out, SLO TTFT 0.4 s and TPOT 0.04 s at 90%, the first token from the
// prefill instance and the KV moved over NVLink inside the node. The paper
// measured colocated (vLLM) 1.6 req/s and 2 prefill + 1 decode GPUs
// 3.3 req/s per GPU.
func TestDistServeMotivatingExample(t *testing.T) {
	cfg := opt13(t)
	cfg.Policy = PolicyPrefill
	cfg.LinkBytesPerSec = cfg.Prefill.Hardware.LinkBytesPerSec
	p := mustRun(t, cfg)
	g := p.GoodputPerGPU
	t.Logf("disaggregated %dP+%dD: %.2f req/s per GPU (DistServe: 3.3); colocated %dC: %.2f (DistServe, vLLM: 1.6)",
		p.PrefillReplicas, p.DecodeReplicas, g.Disaggregated, p.ColocatedReplicas, g.Colocated)
	if p.Disaggregated == nil || p.Colocated == nil {
		t.Fatalf("plan lacks a design: %+v", p)
	}
	if !(g.Disaggregated > g.Colocated && g.Colocated > 0) {
		t.Errorf("goodput per GPU disaggregated %.3g, colocated %.3g: want disaggregated ahead", g.Disaggregated, g.Colocated)
	}
	if p.Recommended != "disaggregated" {
		t.Errorf("recommended %q, want disaggregated", p.Recommended)
	}
	// The 2P+1D design of the paper, simulated on its own.
	s := newSearcher(cfg)
	two1 := s.maxRate(Design{Prefill: 2, Decode: 1}, 0) / 3
	one := s.maxRate(Design{Colocated: 1, Chunk: -1}, 0)
	t.Logf("2P+1D: %.2f req/s per GPU; 1 colocated GPU without chunked prefill: %.2f req/s", two1, one)
	if two1 <= one {
		t.Errorf("2P+1D %.3g req/s per GPU ≤ colocated without chunking %.3g", two1, one)
	}
}

func TestPlanAtRate(t *testing.T) {
	cfg := opt13(t)
	cfg.Requests, cfg.GPUBudget = 100, 6
	cfg.LinkBytesPerSec = 400e9 / 8
	best := mustRun(t, cfg)
	for _, tt := range []struct {
		rate     float64
		wantGPUs int // at most
	}{{1, 2}, {best.MaxRate.Disaggregated * 0.9, int(best.GPUs.Disaggregated)}} {
		t.Run(fmt.Sprint(tt.rate), func(t *testing.T) {
			c := *cfg
			c.Rate = tt.rate
			p := mustRun(t, &c)
			if p.Disaggregated == nil || p.Disaggregated.GPUs > tt.wantGPUs {
				t.Fatalf("at %.3g req/s: %+v, want ≤ %d GPUs", tt.rate, p.Disaggregated, tt.wantGPUs)
			}
			if p.Disaggregated.Rate != tt.rate || p.Disaggregated.Attainment < cfg.SLO.Attainment {
				t.Errorf("predicted at %.3g req/s with attainment %.3f; want %.3g and ≥ %.2f",
					p.Disaggregated.Rate, p.Disaggregated.Attainment, tt.rate, cfg.SLO.Attainment)
			}
			if p.MaxRate.Disaggregated < tt.rate || p.GoodputPerGPU.Disaggregated <= 0 {
				t.Errorf("chosen design's max rate %.3g, goodput per GPU %.3g; want ≥ %.3g and > 0",
					p.MaxRate.Disaggregated, p.GoodputPerGPU.Disaggregated, tt.rate)
			}
			// Every design with fewer GPUs fails the SLO at this rate.
			s := newSearcher(&c)
			for _, cd := range p.Candidates {
				if cd.GPUs < p.Disaggregated.GPUs && s.meets(cd.Design, tt.rate) {
					t.Errorf("%s uses fewer GPUs and meets the SLO at %.3g req/s", cd.Design, tt.rate)
				}
			}
		})
	}
}

func TestPlanInfeasible(t *testing.T) {
	cfg := opt13(t)
	cfg.SLO.TTFT = 50 * time.Millisecond // below one 512-token prefill (72 ms)
	p, err := Run(t.Context(), cfg)
	if !errors.Is(err, ErrInfeasible) {
		t.Fatalf("Run = %v, want ErrInfeasible", err)
	}
	if p == nil || p.Feasible || p.Disaggregated != nil || p.Colocated != nil || p.Recommended != "" {
		t.Errorf("infeasible plan = %+v", p)
	}
	cfg = opt13(t)
	cfg.Rate = 1000
	if _, err := Run(t.Context(), cfg); !errors.Is(err, ErrInfeasible) {
		t.Errorf("Run at 1000 req/s on 8 GPUs = %v, want ErrInfeasible", err)
	}
}

func TestPlanDeterministic(t *testing.T) {
	cfg := opt13(t)
	cfg.Requests, cfg.GPUBudget = 100, 5
	a, b := mustRun(t, cfg), mustRun(t, cfg)
	if diff := cmp.Diff(a, b, cmpopts.IgnoreUnexported(Candidate{})); diff != "" {
		t.Errorf("two runs differ (-first +second):\n%s", diff)
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Run(ctx, opt13(t)); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context = %v, want context.Canceled", err)
	}
}

// The derived limits protect the SLO: the largest decode batch fits 90% of
// TPOT and one more does not; the prefill batch fits half of TTFT.
func TestDerivedLimits(t *testing.T) {
	for _, name := range []string{"a100-80g/opt-13b/tp1", "h100/llama-3-8b/tp1", "a100-80g/opt-66b/tp4"} {
		t.Run(name, func(t *testing.T) {
			cfg := opt13(t)
			cfg.Prefill = mustProfile(t, name)
			l := cfg.limits()
			ctx := 512 + 32
			dec := func(b int) float64 {
				batch := make([]int, b)
				for i := range batch {
					batch[i] = ctx
				}
				return cfg.Prefill.StepSeconds(perfmodel.Batch{Decode: batch})
			}
			limit := 0.9 * cfg.SLO.TPOT.Seconds()
			if dec(l.MaxDecodeBatch) > limit && l.MaxDecodeBatch > 1 {
				t.Errorf("decode step of %d = %.4f s > %.4f s", l.MaxDecodeBatch, dec(l.MaxDecodeBatch), limit)
			}
			if l.MaxDecodeBatch < maxDecodeBatchCap && dec(l.MaxDecodeBatch+1) <= limit {
				t.Errorf("decode batch %d is not the largest: %d takes %.4f s", l.MaxDecodeBatch, l.MaxDecodeBatch+1, dec(l.MaxDecodeBatch+1))
			}
			k := l.MaxPrefillTokens / 512
			pre := make([]int, k)
			for i := range pre {
				pre[i] = 512
			}
			if got := cfg.Prefill.StepSeconds(perfmodel.Batch{Prefill: pre}); k > 1 && got > cfg.SLO.TTFT.Seconds()/2 {
				t.Errorf("prefill of %d tokens takes %.4f s > half the TTFT SLO", l.MaxPrefillTokens, got)
			}
			t.Logf("%s: %+v", name, l)
		})
	}
	cfg := opt13(t)
	cfg.Limits = Limits{MaxDecodeBatch: 7, MaxPrefillTokens: 999, ChunkTokens: -1}
	if diff := cmp.Diff(cfg.Limits, cfg.limits()); diff != "" {
		t.Errorf("given limits changed (-want +got):\n%s", diff)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
		want   string // substring of the error; "" for valid
	}{
		{"valid", func(*Config) {}, ""},
		{"no profile", func(c *Config) { c.Prefill = nil }, "no profile"},
		{"no workload", func(c *Config) { c.Workload = nil }, "no workload"},
		{"empty workload", func(c *Config) { c.Workload = &Workload{} }, "no length samples"},
		{"zero length", func(c *Config) { c.Workload = &Workload{Lengths: []Lengths{{0, 3}}} }, "lengths 0/3"},
		{"no TTFT", func(c *Config) { c.SLO.TTFT = 0 }, "SLO"},
		{"attainment 0", func(c *Config) { c.SLO.Attainment = 0 }, "attainment"},
		{"attainment > 1", func(c *Config) { c.SLO.Attainment = 1.5 }, "attainment"},
		{"negative rate", func(c *Config) { c.Rate = -1 }, "rate"},
		{"no link", func(c *Config) { c.LinkBytesPerSec = 0 }, "link"},
		{"bad codec", func(c *Config) { c.Codec = Codec{Name: "x"} }, "codec"},
		{"bad policy", func(c *Config) { c.Policy = "both" }, "policy"},
		{"budget too small", func(c *Config) { c.GPUBudget = 1 }, "GPU budget 1"},
		{"few requests", func(c *Config) { c.Requests = 3 }, "requests"},
		{"negative limit", func(c *Config) { c.Limits.MaxDecodeBatch = -1 }, "limits"},
		{"chunk -2", func(c *Config) { c.Limits.ChunkTokens = -2 }, "limits"},
		{"negative cost", func(c *Config) { c.GPUCostPerHour = -1 }, "cost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := opt13(t)
			tt.change(cfg)
			err := cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate = %v, want nil", err)
			case tt.want != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate = %v, want ErrConfig mentioning %q", err, tt.want)
			}
		})
	}
}

// MaxRate of one design agrees with the search's figure for it, meets the
// target at its answer and not 5 % above it.
func TestMaxRate(t *testing.T) {
	cfg := opt13(t)
	cfg.Requests, cfg.GPUBudget = 100, 3
	p := mustRun(t, cfg)
	s := newSearcher(cfg)
	n := 0
	for _, cd := range p.Candidates {
		if cd.Skipped || cd.MaxRate == 0 {
			continue
		}
		n++
		got, err := MaxRate(t.Context(), cfg, cd.Design)
		if err != nil {
			t.Fatalf("MaxRate(%s): %v", cd.Design, err)
		}
		if d := got/cd.MaxRate - 1; d < -0.02 || d > 0.02 {
			t.Errorf("MaxRate(%s) = %.4g, the search found %.4g", cd.Design, got, cd.MaxRate)
		}
		if !s.meets(cd.Design, got) || s.meets(cd.Design, got*1.05) {
			t.Errorf("%s: the target is not crossed within 5%% above %.4g req/s", cd.Design, got)
		}
	}
	if n == 0 {
		t.Fatal("no candidate to check")
	}
	if _, err := MaxRate(t.Context(), cfg, Design{Prefill: 1}); !errors.Is(err, ErrConfig) {
		t.Errorf("MaxRate of 1P+0D = %v, want ErrConfig", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := MaxRate(ctx, cfg, Design{Prefill: 1, Decode: 1}); !errors.Is(err, context.Canceled) {
		t.Errorf("MaxRate with a cancelled context = %v, want context.Canceled", err)
	}
}
