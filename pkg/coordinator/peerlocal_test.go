package coordinator_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// TestPeerPullLocalEndToEnd: a long prompt is prefilled on the prefill
// worker, which caches it; the decode worker that took it drains. The
// next prompt sharing its prefix is short enough to prefill locally on
// the other decode worker, whose cache lacks it, and the coordinator names
// the prefill worker as its peer: the decode worker pulls the prefix from
// the prefill worker's cache instead of computing it. The budget reports
// the hit as pulled, the metrics split it as tier peer, and the tokens are
// the engine's alone.
func TestPeerPullLocalEndToEnd(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	// Fewer than 256 uncached tokens prefill on the decode worker.
	if err := os.WriteFile(policy, []byte("routing: {local_prefill_below_tokens: 256}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl := startCluster(t, clusterOpts{decode: 2, edit: func(o *coordinator.Options) { o.PolicyFile = policy },
		worker: func(wo *workerrun.Options) {
			wo.Prefill.PrefixCache.MaxTokens = 4096
			wo.Decode.PrefixCache.MaxTokens = 4096
		}})
	shared := strings.Repeat("a shared system prompt. ", 8) // 12 blocks of 16
	first, second := shared+strings.Repeat("a long first question? ", 6), shared+"another one!"
	ctx := context.Background()
	res := complete(ctx, t, cl.url, request{Prompt: first, MaxTokens: 4, IgnoreEOS: true})
	prefillID, _ := res.Budget["prefill_worker"].(string)
	holder, _ := res.Budget["decode_worker"].(string)
	if prefillID == "" || holder == "" {
		t.Fatalf("first prompt's budget %v: want it prefilled on the prefill worker", res.Budget)
	}
	last := uint64(clusterHashKey.Blocks(0, promptIDs(first), prefixcache.DefaultBlockTokens)[11])
	waitFor(t, 10*time.Second, func() error {
		for _, id := range []string{prefillID, holder} {
			if v := cl.c.KVIndex().Blocks(id); v == nil || !v.Has(last) {
				return fmt.Errorf("%s's cache of the first prompt not indexed", id)
			}
		}
		return nil
	})
	// The decode worker that holds the prefix drains: the second prompt
	// goes to the other one, which holds none of it.
	for _, w := range cl.c.Workers() {
		if w.ID() == holder {
			w.Drain()
		}
	}
	waitFor(t, 10*time.Second, func() error {
		if hb, ok := cl.c.Membership().Get(holder); !ok || !hb.Draining {
			return fmt.Errorf("the coordinator has not heard %s drain", holder)
		}
		return nil
	})
	res = complete(ctx, t, cl.url, request{Prompt: second, MaxTokens: 6, IgnoreEOS: true})
	if w, _ := res.Budget["decode_worker"].(string); w == holder || w == "" {
		t.Fatalf("second prompt decoded on %q, want the other decode worker than %s", w, holder)
	}
	if mode, _ := res.Budget["mode"].(string); mode != "local" {
		t.Fatalf("second prompt's mode %q, want local (budget %v)", mode, res.Budget)
	}
	checkPulled(t, cl, res, second, prefillID, 192)
}
