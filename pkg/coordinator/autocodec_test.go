package coordinator_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine"
)

// With --codec auto the prefill worker picks a lossless codec per
// transfer; the budget names it with the reason, and the tokens stay the
// engine's, bit-exact.
func TestAutoCodecEndToEnd(t *testing.T) {
	cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) { o.Codec = "auto" }})
	p := strings.Repeat("a prompt long enough to carry some KV. ", 4)
	res := complete(context.Background(), t, cl.url, request{Prompt: p, MaxTokens: 5, IgnoreEOS: true})
	if diff := cmp.Diff(newReference(t).generate(t, promptIDs(p), 5, engine.Sampling{}, true), res.Tokens); diff != "" {
		t.Errorf("tokens (-engine alone +served):\n%s", diff)
	}
	c, _ := res.Budget["codec"].(string)
	reason, _ := res.Budget["codec_reason"].(string)
	if !slices.Contains([]string{"none", "s2", "zstd", "bf16"}, c) || !strings.HasPrefix(reason, c) {
		t.Errorf("budget codec %q, codec_reason %q: want a lossless codec and the reason of its choice", c, reason)
	}
}
