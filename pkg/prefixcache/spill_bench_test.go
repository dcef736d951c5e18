package prefixcache_test

import (
	"context"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// BenchmarkHostSpillSim measures the CPU time one host-tier spill and one
// load take on the sim engine as the workers run it (h100/llama-3-8b, the
// default payload scale 1/1024) for a prompt of 22,528 tokens, the mean
// spilled entry of the Mooncake slice in loadtest/results/host-tier/: the
// time a worker's scheduler spends on them, under its engine lock.
func BenchmarkHostSpillSim(b *testing.B) {
	eng, err := sim.New(sim.Options{Profile: "../../loadtest/results/prefix-cache/h100-llama-3-8b-128k-tp1.json", TimeScale: 1e-9, PayloadScale: 1.0 / 1024})
	if err != nil {
		b.Fatal(err)
	}
	const n = 22528
	p := tokens(nil, n, 0, 5, 250)
	if _, err := eng.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil); err != nil {
		b.Fatal(err)
	}
	c, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 20, MaxEntries: 4, BlockTokens: 16, HostBytes: 1 << 50})
	if err != nil {
		b.Fatal(err)
	}
	hashes := c.Hashes(0, p)
	b.Run("spill", func(b *testing.B) {
		for i := range b.N {
			// A distinct first hash each time: the tier never holds it yet.
			hs := append([]kv.Hash{kv.Hash(uint64(i) + 1<<40)}, hashes[1:]...)
			if err := c.Host().Spill(eng, 1, hs); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("load", func(b *testing.B) {
		hs := append([]kv.Hash{kv.Hash(1 << 40)}, hashes[1:]...)
		for i := range b.N {
			seq := engine.SeqID(100 + i)
			if _, err := c.Host().Load(eng, seq, hs, len(hs), nil); err != nil {
				b.Fatal(err)
			}
			eng.Free(seq)
		}
	})
}
