package coordinator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// A tier alias ("chat": tiny first, then small) is served by its first
// model while no budget rules it out; a request whose TTFT budget the
// first model's measured TTFT is over falls back to the next, and the
// response names the model that served it, the tier and why it fell back.
func TestTierFallsBackOverBudget(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("tiers:\n  chat: {models: [tiny, small]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl := startCluster(t, clusterOpts{prefill: 2, decode: 2, worker: func(wo *workerrun.Options) {
		if strings.HasSuffix(wo.ID, "-1") {
			wo.Engine.Preset = "small"
		}
	}, edit: func(o *coordinator.Options) {
		o.PolicyFile = policy
	}})
	waitFor(t, 10*time.Second, func() error {
		if n := len(cl.c.Models()); n != 2 {
			return fmt.Errorf("%d models served, want 2", n)
		}
		return nil
	})
	var ids []string
	for _, m := range getModels(t, cl.url)["data"].([]any) {
		ids = append(ids, m.(map[string]any)["id"].(string))
	}
	if strings.Join(ids, ",") != "small,tiny,chat" {
		t.Errorf("/v1/models lists %v, want the two models and the tier", ids)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sent := 0
	send := func(header ...string) (model string, budget map[string]any) {
		t.Helper()
		// ignore_eos: a reply whose first token is the random-weight
		// model's end has no TTFT, and the chooser learns nothing from it.
		data, _ := json.Marshal(map[string]any{"model": "chat", "prompt": "The quick brown fox", "max_tokens": 4, "ignore_eos": true})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, cl.url+"/v1/completions", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Model   string         `json:"model"`
			PDServe map[string]any `json:"pdserve"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, %v", resp.StatusCode, err)
		}
		// The coordinator observes a request after its response ends:
		// wait until it is counted (and so learnt by the tiers), as the
		// next request's choice depends on it.
		sent++
		waitFor(t, 10*time.Second, func() error {
			if got := counter(t, cl, "pdserve_requests_total", "status", "ok"); got < float64(sent) {
				return fmt.Errorf("%v requests observed, want %d", got, sent)
			}
			return nil
		})
		return body.Model, body.PDServe
	}

	model, b := send()
	if model != "tiny" || b["tier"] != "chat" || b["tier_fallback"] != nil || !strings.HasSuffix(b["decode_worker"].(string), "-0") {
		t.Errorf("no budget: model %q, budget %v; want tiny, tier chat, no fallback", model, b)
	}
	// tiny has served one request: its predicted TTFT is far over a
	// budget of a microsecond; small, never measured, is tried.
	model, b = send(frontend.HeaderTTFTBudget, "0.001")
	if model != "small" || b["tier"] != "chat" || b["tier_fallback"] != "over_budget" || !strings.HasSuffix(b["decode_worker"].(string), "-1") {
		t.Errorf("budget 1 µs: model %q, budget %v; want small after tiny over budget", model, b)
	}
	if passed := fmt.Sprint(b["tier_passed"]); passed != "[tiny]" {
		t.Errorf("budget 1 µs: tier_passed %s, want [tiny] (counted in tiny's demand)", passed)
	}
	if p, _ := b["predicted_ttft_ms"].(float64); p != 0 {
		t.Errorf("small's prediction %v ms, want none (unmeasured)", p)
	}
	if got := counter(t, cl, "pdserve_tier_fallbacks_total", "reason", "over_budget"); got != 1 {
		t.Errorf("pdserve_tier_fallbacks_total{reason=over_budget} = %v, want 1", got)
	}
	if got := counter(t, cl, "pdserve_tier_ttft_budget_total", "outcome", "over"); got != 1 {
		t.Errorf("pdserve_tier_ttft_budget_total{outcome=over} = %v, want 1", got)
	}
	// Both measured and both over: the faster serves, with a prediction.
	_, b = send(frontend.HeaderTTFTBudget, "0.001")
	if p, _ := b["predicted_ttft_ms"].(float64); p <= 0 {
		t.Errorf("both measured: predicted_ttft_ms %v, want > 0", b["predicted_ttft_ms"])
	}
	// A served model's name still names the model.
	if model, b = send(); model != "tiny" {
		t.Errorf("again without a budget: %q", model)
	}
	_ = b
}
