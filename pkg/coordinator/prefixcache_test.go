package coordinator_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine"
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
