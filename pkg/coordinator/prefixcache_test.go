package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// With prefix caches on both pools, a second prompt sharing a long prefix
// with the first is prefilled only past the cached blocks (the prefill
// worker's hit), its decode worker receives only the KV it lacks (the
// decode worker's hit, and fewer KV bytes), and the tokens stay the
// engine's, bit-exact; colocated workers use their cache too.
func TestPrefixCacheEndToEnd(t *testing.T) {
	cache := func(wo *workerrun.Options) {
		wo.Prefill.PrefixCache.MaxTokens = 4096
		wo.Decode.PrefixCache.MaxTokens = 4096
	}
	shared := strings.Repeat("a shared system prompt. ", 8) // 192 bytes: 12 blocks of 16
	first, second := shared+"first question?", shared+"another one!"
	ref := newReference(t)
	for _, mode := range []string{coordinator.ModeDisaggregated, coordinator.ModeColocated} {
		t.Run(mode, func(t *testing.T) {
			cl := startCluster(t, clusterOpts{mode: mode, worker: cache})
			ctx := context.Background()
			for _, p := range []string{first, first} {
				// The first twice: the decode side caches at the end of a
				// request, the prefill side when the prompt is prefilled.
				complete(ctx, t, cl.url, request{Prompt: p, MaxTokens: 4, IgnoreEOS: true})
			}
			res := complete(ctx, t, cl.url, request{Prompt: second, MaxTokens: 6, IgnoreEOS: true})
			if diff := cmp.Diff(ref.generate(t, promptIDs(second), 6, engine.Sampling{}, true), res.Tokens); diff != "" {
				t.Errorf("tokens (-engine alone +served with caches):\n%s", diff)
			}
			// Disaggregated: the prefill worker's hit; colocated: the
			// worker's own local prefill's.
			if hit, _ := res.Budget["prefix_hit_tokens"].(float64); hit != 192 {
				t.Errorf("prefix hit %v tokens, want the 192 shared ones", hit)
			}
			if mode == coordinator.ModeDisaggregated {
				if dhit, _ := res.Budget["decode_prefix_hit_tokens"].(float64); dhit != 192 {
					t.Errorf("decode prefix hit %v tokens, want 192", dhit)
				}
				raw, _ := res.Budget["kv_bytes_raw"].(float64)
				full := float64(len(promptIDs(second))) * 256 // tiny: 2 layers × 2 × 2 KV heads × 16 × 2 bytes
				if raw <= 0 || raw >= full {
					t.Errorf("KV bytes sent %v, want only the suffix's (under %v for the whole prompt)", raw, full)
				}
			}
		})
	}
}

// TestPrefixHitAtReserveDecidesLocal: the router routes on an estimate of
// the decode worker's cache, which lags (here its heartbeats come every
// 3 s, so for the two requests it still shows the empty cache of its
// first one). When the
// decode worker's Reserve answers a real hit that leaves fewer uncached
// tokens than routing.local_prefill_below_tokens, the prompt prefills there instead
// of crossing to a prefill worker: mode "local", the decode worker's own
// hit in the budget, the router's local_reserved count (and no predicted
// hit), and the engine's tokens.
func TestPrefixHitAtReserveDecidesLocal(t *testing.T) {
	shared := strings.Repeat("a shared system prompt. ", 8) // 192 bytes: 12 blocks of 16
	first, second := shared+"first question?", shared+"another one!"
	// The router must not know the decode worker holds the first prompt:
	// no recent prompts (router.Config.RecentTTL) either.
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("routing:\n  recent_prompt_ms: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl := startCluster(t, clusterOpts{
		edit: func(o *coordinator.Options) {
			o.HeartbeatTTL, o.PolicyFile = 30*time.Second, policy
			edit(o, func(p *config.Policy) { p.Routing.LocalPrefillBelowTokens = 32 })
		},
		worker: func(wo *workerrun.Options) {
			wo.Prefill.PrefixCache.MaxTokens = 4096
			wo.Decode.PrefixCache.MaxTokens = 4096
			if wo.Role == control.RoleDecode {
				// Heartbeat digests, not KV events: the estimate lags.
				wo.HeartbeatInterval, wo.KVEvents = 3*time.Second, false
			}
		},
	})
	ctx := context.Background()
	if res := complete(ctx, t, cl.url, request{Prompt: first, MaxTokens: 4, IgnoreEOS: true}); res.Budget["mode"] != coordinator.ModeDisaggregated {
		t.Fatalf("first request: mode %v, want %s (nothing cached)", res.Budget["mode"], coordinator.ModeDisaggregated)
	}
	// The prefill worker's cache of the first prompt reaches the router
	// (its KV events are on): the router's estimate for the second prompt
	// is that worker's 192-token hit.
	last := uint64(clusterHashKey.Blocks(0, promptIDs(first), prefixcache.DefaultBlockTokens)[11])
	waitFor(t, 10*time.Second, func() error {
		for _, w := range cl.c.Workers() {
			if v := cl.c.KVIndex().Blocks(w.ID()); v != nil && v.Has(last) {
				return nil
			}
		}
		return errors.New("the prefill worker's cache of the first prompt is not indexed")
	})
	res := complete(ctx, t, cl.url, request{Prompt: second, MaxTokens: 6, IgnoreEOS: true})
	if diff := cmp.Diff(newReference(t).generate(t, promptIDs(second), 6, engine.Sampling{}, true), res.Tokens); diff != "" {
		t.Errorf("tokens (-engine alone +served):\n%s", diff)
	}
	if res.Budget["mode"] != "local" {
		t.Errorf("second request: mode %v, want local (Reserve's hit leaves %d uncached tokens)", res.Budget["mode"], len(promptIDs(second))-192)
	}
	if hit, _ := res.Budget["prefix_hit_tokens"].(float64); hit != 192 {
		t.Errorf("prefix hit %v tokens, want the 192 shared ones (the decode worker's local prefill)", hit)
	}
	if err := testutil.GatherAndCompare(cl.c.Registry(), strings.NewReader(`
# HELP pdserve_router_decisions_total Requests routed, by where their prompt prefills: remote, local_short (few uncached tokens), local_busy (prefill pool busy), local_reserved (few uncached tokens by the decode worker's Reserve, routed remote on the estimate), local (colocated or required), decode_only (recovery).
# TYPE pdserve_router_decisions_total counter
pdserve_router_decisions_total{placement="local_reserved"} 1
pdserve_router_decisions_total{placement="remote"} 2
`), "pdserve_router_decisions_total"); err != nil {
		t.Error(err)
	}
	// The router's estimate was of the prefill worker's cache (which
	// holds the first prompt too): the decode worker's hit it did not
	// see coming counts as not predicted.
	if p := unlabelled(t, cl.c.Registry(), "pdserve_prefix_hit_tokens_predicted_total"); p != 0 {
		t.Errorf("predicted prefix hit tokens %v, want 0", p)
	}
}

// The router predicts the prefix hits from the workers' KV events (their
// heartbeats carry no digest): once the first prompt's blocks are in the
// coordinator's index, the second prompt's hit is predicted in full.
func TestKVEventsPredictHits(t *testing.T) {
	cl := startCluster(t, clusterOpts{worker: func(wo *workerrun.Options) {
		wo.Prefill.PrefixCache.MaxTokens = 4096
		wo.Decode.PrefixCache.MaxTokens = 4096
	}})
	shared := strings.Repeat("a shared system prompt. ", 8) // 12 blocks of 16
	first, second := shared+"first question?", shared+"another one!"
	ctx := context.Background()
	complete(ctx, t, cl.url, request{Prompt: first, MaxTokens: 4, IgnoreEOS: true})
	last := uint64(clusterHashKey.Blocks(0, promptIDs(first), prefixcache.DefaultBlockTokens)[11])
	waitFor(t, 10*time.Second, func() error {
		for _, w := range cl.c.Workers() {
			if v := cl.c.KVIndex().Blocks(w.ID()); v == nil || !v.Has(last) {
				return fmt.Errorf("%s's cache of the first prompt not indexed", w.ID())
			}
		}
		return nil
	})
	res := complete(ctx, t, cl.url, request{Prompt: second, MaxTokens: 4, IgnoreEOS: true})
	if hit, _ := res.Budget["prefix_hit_tokens"].(float64); hit != 192 {
		t.Errorf("prefix hit %v tokens, want the 192 shared ones", hit)
	}
	hit, predicted := unlabelled(t, cl.c.Registry(), "pdserve_prefix_hit_tokens_total"), unlabelled(t, cl.c.Registry(), "pdserve_prefix_hit_tokens_predicted_total")
	if hit != 192 || predicted != hit {
		t.Errorf("prefix hit tokens %v, predicted %v; want 192 hit, all predicted", hit, predicted)
	}
}

// unlabelled returns the value of a gathered counter without labels.
func unlabelled(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}
