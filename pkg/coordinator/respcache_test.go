package coordinator_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/coordinator"
)

// TestResponseCacheOptions: a policy edit of the entries (what the
// deprecated --response-cache-entries does) overrides the policy file's
// and keeps its ttl; a negative count is refused, naming the key.
func TestResponseCacheOptions(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("response_cache: {entries: 3, ttl: 90s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := coordinator.DefaultOptions()
	o.PolicyFile = policy
	edit(&o, func(p *config.Policy) { p.ResponseCache.Entries = 50 })
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if rc := o.Policy.ResponseCache; rc.Entries != 50 || rc.TTL != 90*time.Second {
		t.Errorf("response cache %+v, want 50 entries, ttl 90s", rc)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	edit(&o, func(p *config.Policy) { p.ResponseCache.Entries = -1 })
	if err := o.Complete(); err == nil || !strings.Contains(err.Error(), "response_cache: entries") {
		t.Errorf("Complete = %v, want an error about response_cache entries", err)
	}
}

// TestResponseCacheEndToEnd: through a standalone disaggregated cluster
// a repeated greedy request is a hit with the tokens of the miss and no
// worker in its budget; an unseeded sampled one is never looked up.
func TestResponseCacheEndToEnd(t *testing.T) {
	cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) { edit(o, func(p *config.Policy) { p.ResponseCache.Entries = 8 }) }})
	ctx := context.Background()
	greedy := request{Prompt: "the cache replays this", MaxTokens: 12, IgnoreEOS: true, Stream: true}
	miss := complete(ctx, t, cl.url, greedy)
	hit := complete(ctx, t, cl.url, greedy)
	if miss.Budget["cache"] != "miss" || hit.Budget["cache"] != "hit" {
		t.Fatalf("cache %v then %v, want miss then hit", miss.Budget["cache"], hit.Budget["cache"])
	}
	if diff := cmp.Diff(miss.Tokens, hit.Tokens); diff != "" || miss.Text != hit.Text || miss.Finish != hit.Finish {
		t.Errorf("hit differs from miss: tokens (-miss +hit):\n%s\ntext %q vs %q, finish %q vs %q", diff, miss.Text, hit.Text, miss.Finish, hit.Finish)
	}
	if hit.Budget["decode_worker"] != "" || hit.Budget["prefill_worker"] != "" || miss.Budget["decode_worker"] == "" {
		t.Errorf("workers: miss %v/%v, hit %v/%v", miss.Budget["prefill_worker"], miss.Budget["decode_worker"], hit.Budget["prefill_worker"], hit.Budget["decode_worker"])
	}
	sampled := request{Prompt: "the cache replays this", MaxTokens: 4, Temperature: 0.9}
	for range 2 {
		if r := complete(ctx, t, cl.url, sampled); r.Budget["cache"] != nil {
			t.Errorf("unseeded sampled request: cache %v, want none", r.Budget["cache"])
		}
	}
}
