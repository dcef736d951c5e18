package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/frontend"
)

var (
	tierRate     = flag.Float64("tier.rate", 40, "BenchmarkTierFallback: interactive requests a second (Poisson)")
	tierRequests = flag.Int("tier.requests", 400, "BenchmarkTierFallback: requests per run")
	tierBudget   = flag.Float64("tier.budget-ms", 300, "BenchmarkTierFallback: every request's TTFT budget, ms")
	tierPrompt   = flag.Int("tier.prompt", 1024, "BenchmarkTierFallback: prompt tokens (random, so no prefix hits)")
)

// tierRun is what one run of BenchmarkTierFallback measured.
type tierRun struct {
	within, failed int
	byModel        map[string]int
	// failures counts the failed requests by status (0: no response).
	failures map[int]int
	ttfts    []float64
}

func (r tierRun) share(n int) float64 { return float64(r.within) / float64(n) }

func (r tierRun) p(q float64) float64 {
	if len(r.ttfts) == 0 {
		return 0
	}
	s := slices.Clone(r.ttfts)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// BenchmarkTierFallback measures issue 42's tier claim on the sim engine:
// two pools, h100/llama-3-8b/tp1 (the fast tier, 1 prefill + 1 decode
// worker) and h100/llama-3-70b/tp4 (the quality tier, 1 + 1), KV paced at
// 100 Gb/s; open-loop Poisson interactive requests at -tier.rate, each
// with an X-PDServe-TTFT-Budget-Ms of -tier.budget-ms, a prompt of
// -tier.prompt random tokens and 16 output tokens, enough to saturate
// the fast tier. It reports the share of requests whose TTFT (the
// server's budget) is within their budget, sent to the fast tier's model
// alone and sent to the tier alias "chat" (policy: llama-3-8b then
// llama-3-70b), each on a fresh deployment, and their ratio. Timings are
// this host's and depend on its load; the sim engine warns in its log
// when it falls behind its model.
//
//	go test -run '^$' -bench TierFallback -benchtime 1x ./loadtest/deploy/
func BenchmarkTierFallback(b *testing.B) {
	policy := filepath.Join(b.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("tiers:\n  chat: {models: [llama-3-8b, llama-3-70b]}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	spec := Spec{Mode: Disaggregated, Engine: "sim", Profile: "h100/llama-3-8b/tp1", PrefillWorkers: 1, DecodeWorkers: 1,
		TierProfile: "h100/llama-3-70b/tp4", TierPrefillWorkers: 1, TierDecodeWorkers: 1,
		LinkGbps: 100, PayloadScale: 1.0 / 1024, PolicyFile: policy, QueueLimit: 4096}
	n := *tierRequests
	for range b.N {
		// Tiers first, then the fast tier alone: a run's position must
		// not favour it (swap them to check).
		tiered := runTier(b, spec, "chat", n)
		alone := runTier(b, spec, "llama-3-8b", n)
		for name, r := range map[string]tierRun{"fast_alone": alone, "tiers": tiered} {
			b.Logf("%s: %d/%d within %.0f ms (%.1f%%), failed %d %v (by status), TTFT p50 %.0f ms p95 %.0f ms, served by %v",
				name, r.within, n, *tierBudget, 100*r.share(n), r.failed, r.failures, r.p(0.5), r.p(0.95), r.byModel)
		}
		b.ReportMetric(alone.share(n), "within_fast_alone")
		b.ReportMetric(tiered.share(n), "within_tiers")
		if alone.within > 0 {
			b.ReportMetric(tiered.share(n)/alone.share(n), "ratio")
		}
	}
}

// runTier starts spec, sends n requests naming model, and stops it.
func runTier(b *testing.B, spec Spec, model string, n int) tierRun {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	l, err := Start(ctx, spec, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	// Both models joined (Start waits for one worker of each role only).
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := http.Get(l.URL() + "/v1/models")
		if err == nil {
			var body struct{ Data []struct{ ID string } }
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if len(body.Data) >= 3 { // two models and the tier
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("the two pools did not both join")
		}
		time.Sleep(100 * time.Millisecond)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	run := tierRun{byModel: map[string]int{}, failures: map[int]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	start := time.Now()
	next := time.Duration(0)
	for range n {
		next += time.Duration(rng.ExpFloat64() / *tierRate * float64(time.Second))
		prompt := make([]int, *tierPrompt)
		for j := range prompt {
			prompt[j] = 3 + rng.IntN(250)
		}
		time.Sleep(time.Until(start.Add(next)))
		wg.Go(func() {
			data, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 16, "ignore_eos": true})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.URL()+"/v1/completions", bytes.NewReader(data))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(frontend.HeaderTTFTBudget, fmt.Sprint(*tierBudget))
			resp, err := client.Do(req)
			var body struct {
				Model   string `json:"model"`
				PDServe struct {
					TTFTMs float64 `json:"ttft_ms"`
				} `json:"pdserve"`
			}
			ok := err == nil && resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&body) == nil
			if err == nil && resp.StatusCode != http.StatusOK {
				var e bytes.Buffer
				_, _ = e.ReadFrom(resp.Body)
				b.Logf("status %d: %s", resp.StatusCode, e.Bytes())
			}
			if err == nil {
				resp.Body.Close()
			}
			mu.Lock()
			defer mu.Unlock()
			if !ok {
				run.failed++
				code := 0
				if err == nil {
					code = resp.StatusCode
				}
				run.failures[code]++
				return
			}
			run.byModel[body.Model]++
			run.ttfts = append(run.ttfts, body.PDServe.TTFTMs)
			if body.PDServe.TTFTMs <= *tierBudget {
				run.within++
			}
		})
	}
	wg.Wait()
	return run
}
