package coordinator_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// TestPeerPullEndToEnd: the prefill worker that holds a prompt's prefix
// drains; the next prompt sharing it goes to the other prefill worker,
// whose cache lacks it, and the coordinator names the decode worker, which
// cached it at the first request's end, as its peer: the prefill worker
// pulls the prefix from the decode worker instead of computing it. The
// budget reports the hit as pulled, the metrics split it as tier peer,
// and the tokens are the engine's alone.
func TestPeerPullEndToEnd(t *testing.T) {
	cl := startCluster(t, clusterOpts{prefill: 2, worker: func(wo *workerrun.Options) {
		wo.Prefill.PrefixCache.MaxTokens = 4096
		wo.Decode.PrefixCache.MaxTokens = 4096
	}})
	shared := strings.Repeat("a shared system prompt. ", 8) // 12 blocks of 16
	first, second := shared+"first question?", shared+"another one!"
	ctx := context.Background()
	res := complete(ctx, t, cl.url, request{Prompt: first, MaxTokens: 4, IgnoreEOS: true})
	holder, _ := res.Budget["prefill_worker"].(string)
	last := uint64(clusterHashKey.Blocks(0, promptIDs(first), prefixcache.DefaultBlockTokens)[11])
	var decodeID string
	waitFor(t, 10*time.Second, func() error {
		for _, w := range cl.c.Workers() {
			if strings.HasPrefix(w.ID(), "decode") {
				decodeID = w.ID()
				if v := cl.c.KVIndex().Blocks(w.ID()); v == nil || !v.Has(last) {
					return fmt.Errorf("%s's cache of the first prompt not indexed", w.ID())
				}
			}
		}
		return nil
	})
	for _, w := range cl.c.Workers() {
		if w.ID() == holder {
			w.Drain()
		}
	}
	waitFor(t, 10*time.Second, func() error {
		for _, w := range cl.c.Workers() {
			if w.ID() == holder && !w.Draining() {
				return fmt.Errorf("%s not draining", holder)
			}
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond) // the coordinator hears of the drain
	res = complete(ctx, t, cl.url, request{Prompt: second, MaxTokens: 6, IgnoreEOS: true})
	if w, _ := res.Budget["prefill_worker"].(string); w == holder || w == "" {
		t.Fatalf("second prompt prefilled on %q, want the other prefill worker than %s", w, holder)
	}
	checkPulled(t, cl, res, second, decodeID, 192)
}

// checkPulled checks that res, prompt's completion of 6 tokens, has the
// engine's tokens alone, and that all of its want prefix hit tokens were
// pulled from peer, in the budget and in the coordinator's tier=peer
// counter.
func checkPulled(t *testing.T, cl *cluster, res result, prompt, peer string, want int) {
	t.Helper()
	if diff := cmp.Diff(newReference(t).generate(t, promptIDs(prompt), 6, engine.Sampling{}, true), res.Tokens); diff != "" {
		t.Errorf("tokens (-engine alone +served with a pulled prefix):\n%s", diff)
	}
	hit, _ := res.Budget["prefix_hit_tokens"].(float64)
	pulled, _ := res.Budget["peer_prefix_hit_tokens"].(float64)
	if hit != float64(want) || pulled != float64(want) {
		t.Errorf("prefix hit %v tokens, %v of them pulled from %s; want %d, all pulled", hit, pulled, peer, want)
	}
	if got := tierHits(t, cl, "peer"); got != float64(want) {
		t.Errorf("pdserve_prefix_tier_hit_tokens_total{tier=\"peer\"} = %v, want %d", got, want)
	}
}

// tierHits returns pdserve_prefix_tier_hit_tokens_total of tier.
func tierHits(t *testing.T, cl *cluster, tier string) float64 {
	t.Helper()
	mfs, err := cl.c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pdserve_prefix_tier_hit_tokens_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tier" && l.GetValue() == tier {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}
