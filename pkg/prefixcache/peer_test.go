package prefixcache_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// noLock is Export's engine lock where the test is the only caller.
func noLock() func() { return func() {} }

// peerRoundTrip caches a prompt in a holder's cache and moves it from its
// engine tier to its host tier and on to its disk tier; at each stage a
// puller (another engine of the same model, with an empty cache) loads
// what the holder exports for prompts sharing its prefix, block-aligned
// or not, and its tokens (and, when kvExact, its KV) equal its own cold
// run's.
func peerRoundTrip(t *testing.T, holder, puller engine.Engine, kvExact bool) {
	vocab := int32(min(holder.Spec().Vocab, 250))
	hc, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 12, MaxEntries: 1, BlockTokens: 16,
		HostBytes: int64(64 * holder.Spec().KVBytesPerToken()), DiskDir: t.TempDir(), DiskBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 12, MaxEntries: 8, BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	base := tokens(nil, 70, 0, 1, vocab)
	seq, pseq := engine.SeqID(0), engine.SeqID(100)
	cache := func(p []int32) {
		t.Helper()
		seq++
		run(t, holder, seq, p, 0, 0)
		if err := hc.Free(holder, hc.Insert(seq, hc.Hashes(0, p), len(p))); err != nil {
			t.Fatal(err)
		}
	}
	cache(base)
	for stage, tier := range []string{prefixcache.TierEngine, prefixcache.TierHost, prefixcache.TierDisk} {
		if stage > 0 {
			cache(tokens(nil, 40, 0, int32(10+stage), vocab)) // base moves one tier down
		}
		for _, tc := range []struct{ n, shared, want int }{{70, 70, 64}, {60, 48, 48}, {50, 40, 32}, {30, 10, 0}} {
			t.Run(fmt.Sprintf("%s/n%d-shared%d", tier, tc.n, tc.shared), func(t *testing.T) {
				p := tokens(base, tc.n, tc.shared, int32(tc.n+tc.shared), vocab)
				hashes, maxHit := pc.Hashes(0, p), pc.MaxHitBlocks(len(p))
				x, err := hc.Export(holder, noLock, hashes, 1, maxHit)
				if err != nil {
					t.Fatal(err)
				}
				if x.Tokens != tc.want || (tc.want > 0 && x.Tier != tier) {
					t.Fatalf("Export = %d tokens from %q, want %d from %q", x.Tokens, x.Tier, tc.want, tier)
				}
				if x.Tokens == 0 {
					return
				}
				// min blocks beyond what is held: nothing.
				if y, _ := hc.Export(holder, noLock, hashes, tc.want/16+1, maxHit); y.Tokens != 0 {
					t.Errorf("Export with min blocks %d = %d tokens, want none", tc.want/16+1, y.Tokens)
				}
				pseq++
				warm := pseq
				got, _, err := pc.LoadPulled(puller, warm, &prefixcache.Pulled{Tokens: x.Tokens, Layers: x.Layers, Tier: x.Tier}, maxHit)
				if err != nil || got != tc.want {
					t.Fatalf("LoadPulled = %d, %v; want %d tokens", got, err, tc.want)
				}
				pseq++
				matchesCold(t, puller, warm, pseq, p, got, kvExact, "a pull from the "+tier+" tier")
			})
		}
	}
	st := hc.Stats()
	if st.Peer.Exports != 9 || st.Lookups != 0 || st.Hits != 0 || st.Host.Lookups != 0 || st.Disk.Lookups != 0 {
		t.Errorf("holder stats %+v: want 9 exports and none of its own lookups", st)
	}
	if pst := pc.Stats().Peer; pst.HitTokens != 3*(64+48+32) {
		t.Errorf("puller peer stats %+v: want %d hit tokens", pst, 3*(64+48+32))
	}
	if err := hc.Free(holder, hc.Drain()); err != nil {
		t.Fatal(err)
	}
}

func TestPeerExportRef(t *testing.T) {
	newRef := func() engine.Engine {
		eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 512})
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	peerRoundTrip(t, newRef(), newRef(), true)
}

// TestPeerExportSim: the sim engine's host tier holds snapshots; they are
// rendered for the peer.
func TestPeerExportSim(t *testing.T) {
	newSim := func() engine.Engine {
		eng, err := sim.New(sim.Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 1e-6, PayloadScale: 1.0 / 16})
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	peerRoundTrip(t, newSim(), newSim(), true)
}

func TestPeerExportLlamaCpp(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	path := filepath.Join(t.TempDir(), "tiny-llama.gguf")
	if err := gguf.WriteRandom(path, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 1024, Type: gguf.F32, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	newLlama := func() *llamacpp.Engine {
		eng, err := llamacpp.New(llamacpp.Options{LibDir: lib, Model: path, CtxSize: 1024, MaxSeqs: 8, Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() })
		return eng
	}
	holder, puller := newLlama(), newLlama()
	if err := holder.Transferable(); err != nil {
		t.Skipf("llama.cpp KV export unavailable: %v", err)
	}
	peerRoundTrip(t, holder, puller, false)
}

// TestPeerExportEngineLock: exporting the engine tier for a peer takes
// the engine lock once a layer on an engine that takes no snapshots,
// and once in all on a Snapshotter (sim), whose layers are rendered
// without it while the worker's steps go on (under -race: a step on
// another sequence runs in every gap the export leaves).
func TestPeerExportEngineLock(t *testing.T) {
	newRef := func() engine.Engine {
		eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 512})
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	newSim := func() engine.Engine {
		eng, err := sim.New(sim.Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 1e-6, PayloadScale: 1.0 / 16})
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	for _, tc := range []struct {
		name  string
		eng   engine.Engine
		locks func(layers int) int
	}{
		{"ref", newRef(), func(layers int) int { return layers }},
		{"sim", newSim(), func(int) int { return 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := tc.eng
			c, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 12, MaxEntries: 4, BlockTokens: 16})
			if err != nil {
				t.Fatal(err)
			}
			vocab := int32(min(eng.Spec().Vocab, 250))
			p := tokens(nil, 70, 0, 1, vocab)
			run(t, eng, 1, p, 0, 0)
			if err := c.Free(eng, c.Insert(1, c.Hashes(0, p), len(p))); err != nil {
				t.Fatal(err)
			}
			var (
				mu    sync.Mutex
				locks int
				stop  = make(chan struct{})
				done  = make(chan struct{})
			)
			go func() { // the worker's steps, under its engine lock
				defer close(done)
				other := tokens(nil, 20, 0, 9, vocab)
				for seq := engine.SeqID(10); ; seq++ {
					select {
					case <-stop:
						return
					default:
					}
					mu.Lock()
					if _, err := eng.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: other, Last: true}}, nil); err != nil {
						t.Error(err)
					}
					eng.Free(seq)
					mu.Unlock()
				}
			}()
			lock := func() func() {
				mu.Lock()
				locks++
				return mu.Unlock
			}
			x, err := c.Export(eng, lock, c.Hashes(0, p), 1, c.MaxHitBlocks(len(p)))
			close(stop)
			<-done
			if err != nil || x.Tokens != 64 || x.Tier != prefixcache.TierEngine {
				t.Fatalf("Export = %d tokens from %q, %v; want 64 from the engine tier", x.Tokens, x.Tier, err)
			}
			if want := tc.locks(eng.Spec().Layers); locks != want {
				t.Errorf("the engine lock was taken %d times, want %d", locks, want)
			}
			for l, b := range x.Layers {
				want, err := eng.ExportKV(1, l, 0, 64, nil)
				if err != nil || !bytes.Equal(b, want) {
					t.Fatalf("layer %d: the exported KV differs from ExportKV's (%v)", l, err)
				}
			}
		})
	}
}
