package prefixcache_test

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// BenchmarkHostTierMultiTurnLlamaCpp replays a multi-turn chat workload
// on llama.cpp (a random-weight llama of 4 layers, 512 wide, f16 KV, 2
// threads): sessions take turns, each turn's prompt its previous turn's
// plus a new message, and an engine tier of one entry, so that every
// turn's previous one was evicted by another session's. With the host
// tier ("host") a turn loads its previous prompt's blocks from host RAM;
// without ("recompute") it computes the whole prompt. Every turn's tokens
// must equal those of the other mode's run (a cold run: nothing cached).
// Reported per turn after the first: prefill-ms (load and prefill, wall
// time), hit-tokens.
func BenchmarkHostTierMultiTurnLlamaCpp(b *testing.B) {
	lib, vocab := repotest.Llama(b)
	path := filepath.Join(b.TempDir(), "bench-llama.gguf")
	if err := gguf.WriteRandom(path, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 4, Hidden: 512, Heads: 8, KVHeads: 4, FFN: 1536, Context: 4096, Type: gguf.F16, Seed: 11}); err != nil {
		b.Fatal(err)
	}
	eng, err := llamacpp.New(llamacpp.Options{LibDir: lib, Model: path, CtxSize: 16384, MaxSeqs: 8, Threads: 2})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	if err := eng.Transferable(); err != nil {
		b.Skipf("llama.cpp KV export unavailable: %v", err)
	}
	const sessions, turns, msg = 3, 4, 300
	// prompts[s][k]: session s's prompt at turn k.
	prompts := make([][][]int32, sessions)
	for s := range prompts {
		var p []int32
		for k := range turns {
			p = append(slices.Clone(p), tokens(nil, msg, 0, int32(100*s+k), 250)...)
			prompts[s] = append(prompts[s], p)
		}
	}
	outs := map[string][][]int32{}
	for _, mode := range []string{"recompute", "host"} {
		b.Run(mode, func(b *testing.B) {
			var host int64
			if mode == "host" {
				host = 1 << 30
			}
			var took time.Duration
			var hit, measured int
			var got [][]int32
			for range b.N {
				c, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 14, MaxEntries: 1, BlockTokens: 16, HostBytes: host})
				if err != nil {
					b.Fatal(err)
				}
				got = got[:0]
				seq := engine.SeqID(0)
				for k := range turns {
					for s := range sessions {
						p := prompts[s][k]
						seq++
						hashes := c.Hashes(0, p)
						maxHit := c.MaxHitBlocks(len(p))
						t0 := time.Now()
						n := 0
						if c.HostDeeper(hashes, maxHit, nil) {
							ld, err := c.Host().Load(eng, seq, hashes, maxHit, nil)
							if err != nil {
								b.Fatal(err)
							}
							n = ld.Tokens
						} else if h := c.Acquire(hashes, maxHit); h.Tokens > 0 {
							if err := eng.Fork(h.Seq, seq, h.Tokens); err != nil {
								b.Fatal(err)
							}
							n = h.Tokens
							c.Release(h)
						}
						toks := run(b, eng, seq, p, n, 3)
						if k > 0 {
							took += time.Since(t0)
							hit += n
							measured++
						}
						got = append(got, toks)
						if err := c.Free(eng, c.Insert(seq, hashes, len(p))); err != nil {
							b.Fatal(err)
						}
					}
				}
				if err := c.Free(eng, c.Drain()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(took.Microseconds())/1e3/float64(measured), "prefill-ms/turn")
			b.ReportMetric(float64(hit)/float64(measured), "hit-tokens/turn")
			outs[mode] = slices.Clone(got)
			if want, ok := outs["recompute"]; ok && mode == "host" {
				for i := range got {
					if !slices.Equal(got[i], want[i]) {
						b.Fatalf("turn %d: tokens %v with the host tier, %v recomputed", i, got[i], want[i])
					}
				}
			}
		})
	}
}
