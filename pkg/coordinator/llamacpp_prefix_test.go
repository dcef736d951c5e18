package coordinator_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// The workers' prefix caches on llama.cpp: a prompt sharing a long prefix
// with an earlier one is prefilled past the cached blocks on the prefill
// worker and sent without them to the decode worker, and its greedy
// tokens stay llama.cpp's own generation of the whole prompt.
func TestLlamacppPrefixCache(t *testing.T) {
	eo := llamaEngine(t)
	// Cache entries take llama.cpp sequence slots beside the running
	// batch's: 16 slots, a batch of 4.
	eo.MaxSeqs = 16
	m, err := llamacpp.LoadModel(eo.Model, llamacpp.LoadOptions{LibDir: eo.LlamaLib})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	shared := strings.Repeat("the same long system prompt, ", 12)
	first, second := shared+"then one question", shared+"and then another"
	ids := m.Tokenizer().Encode(second)
	want, err := m.GenerateReference(ids, 8, 1024, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	cl := startCluster(t, clusterOpts{mode: coordinator.ModeDisaggregated, edit: func(o *coordinator.Options) { o.Engine = eo },
		worker: func(wo *workerrun.Options) {
			wo.Prefill.PrefixCache.MaxTokens = 2048
			wo.Decode.PrefixCache.MaxTokens = 512 // of the 1024 cells of the context
			wo.Decode.MaxBatch = 4
		}})
	ctx := context.Background()
	for range 2 {
		complete(ctx, t, cl.url, request{Prompt: first, MaxTokens: 2, IgnoreEOS: true})
	}
	res := complete(ctx, t, cl.url, request{Prompt: second, MaxTokens: 8, IgnoreEOS: true})
	if diff := cmp.Diff(want, res.Tokens); diff != "" {
		t.Errorf("tokens (-llama.cpp on the whole prompt +pdserve from cached prefixes):\n%s", diff)
	}
	hit, _ := res.Budget["prefix_hit_tokens"].(float64)
	dhit, _ := res.Budget["decode_prefix_hit_tokens"].(float64)
	if hit < 16 || dhit < 16 || int(hit) >= len(ids) {
		t.Errorf("prefix hits: prefill %v, decode %v tokens of %d; want whole blocks of the shared prefix on both", hit, dhit, len(ids))
	}
}
