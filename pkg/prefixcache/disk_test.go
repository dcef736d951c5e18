package prefixcache_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// diskRoundTrip caches a prompt, evicts it from the engine tier to the
// host tier and from there (a budget of one such prompt) to the disk
// tier, and runs prompts sharing its prefix, block-aligned or not: each
// loads the shared whole blocks from disk, and its tokens (and, when
// kvExact, its KV) equal a cold run's. Drain removes the tier's files.
func diskRoundTrip(t *testing.T, eng engine.Engine, kvExact bool) {
	vocab := int32(min(eng.Spec().Vocab, 250))
	c, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 12, MaxEntries: 1, BlockTokens: 16,
		HostBytes: int64(64 * eng.Spec().KVBytesPerToken()), DiskDir: t.TempDir(), DiskBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	free := func(seqs []engine.SeqID) {
		t.Helper()
		if err := c.Free(eng, seqs); err != nil {
			t.Fatal(err)
		}
	}
	base := tokens(nil, 70, 0, 1, vocab)
	for i, p := range [][]int32{base, tokens(nil, 40, 0, 2, vocab), tokens(nil, 40, 0, 3, vocab)} {
		seq := engine.SeqID(i + 1)
		run(t, eng, seq, p, 0, 0)
		free(c.Insert(seq, c.Hashes(0, p), len(p)))
	}
	st := c.Stats()
	if st.Disk.Spills != 1 || st.Disk.Entries != 1 || st.Disk.Blocks != 4 || st.Host.Evictions != 1 {
		t.Fatalf("after base left the host tier: host %+v, disk %+v; want base on disk", st.Host, st.Disk)
	}
	if files, _ := os.ReadDir(c.Host().Disk().Dir()); len(files) != 1 {
		t.Fatalf("disk tier directory holds %d files, want 1", len(files))
	}
	seq := engine.SeqID(10)
	for _, tc := range []struct{ n, shared, want int }{{70, 70, 64}, {60, 48, 48}, {50, 40, 32}, {64, 64, 48}} {
		t.Run(fmt.Sprintf("n%d-shared%d", tc.n, tc.shared), func(t *testing.T) {
			p := tokens(base, tc.n, tc.shared, int32(tc.n+tc.shared), vocab)
			hashes, maxHit := c.Hashes(0, p), c.MaxHitBlocks(len(p))
			if c.HostDeeper(hashes, maxHit, nil) {
				t.Fatal("HostDeeper = true with the prefix on disk only, not read")
			}
			// Read off the engine lock, imported under it.
			r := c.ReadDisk(context.Background(), hashes, maxHit)
			if !c.HostDeeper(hashes, maxHit, r) {
				t.Fatal("HostDeeper = false with the prefix read from disk")
			}
			seq++
			warm := seq
			ld, err := c.Host().Load(eng, warm, hashes, maxHit, r)
			if err != nil {
				t.Fatal(err)
			}
			if ld.Tokens != tc.want {
				t.Fatalf("Load = %+v, want %d tokens", ld, tc.want)
			}
			seq++
			matchesCold(t, eng, warm, seq, p, ld.Tokens, kvExact, "a disk load")
		})
	}
	if st := c.Stats(); st.Disk.Hits != 4 || st.Disk.HitTokens != 64+48+32+48 || st.Host.Hits != 0 {
		t.Errorf("after the loads: host %+v, disk %+v; want 4 disk hits of 192 tokens", st.Host, st.Disk)
	}
	dir := c.Host().Disk().Dir()
	free(c.Drain())
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("disk tier directory after Drain: %v, want it removed", err)
	}
}

func TestDiskTierRef(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	diskRoundTrip(t, eng, true)
}

// TestDiskTierSim: the sim engine's host-tier entries are snapshots
// (Snapshotter); those the host tier evicts are written to disk as the
// bytes ExportKV would return, and load back token-exact.
func TestDiskTierSim(t *testing.T) {
	eng, err := sim.New(sim.Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 1e-6, PayloadScale: 1.0 / 16})
	if err != nil {
		t.Fatal(err)
	}
	diskRoundTrip(t, eng, true)
}

func TestDiskTierLlamaCpp(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	path := filepath.Join(t.TempDir(), "tiny-llama.gguf")
	if err := gguf.WriteRandom(path, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 1024, Type: gguf.F32, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	eng, err := llamacpp.New(llamacpp.Options{LibDir: lib, Model: path, CtxSize: 1024, MaxSeqs: 8, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	if err := eng.Transferable(); err != nil {
		t.Skipf("llama.cpp KV export unavailable: %v", err)
	}
	diskRoundTrip(t, eng, false)
}

// TestDiskTierOptions: a disk budget needs a directory and a host tier;
// a negative one is refused.
func TestDiskTierOptions(t *testing.T) {
	base := prefixcache.Options{MaxTokens: 64, MaxEntries: 1, BlockTokens: 16, HostBytes: 1 << 20}
	for _, tc := range []struct {
		name string
		edit func(*prefixcache.Options)
	}{
		{"no directory", func(o *prefixcache.Options) { o.DiskBytes = 1 << 20 }},
		{"no host tier", func(o *prefixcache.Options) { o.DiskBytes, o.DiskDir, o.HostBytes = 1<<20, t.TempDir(), 0 }},
		{"negative", func(o *prefixcache.Options) { o.DiskBytes, o.DiskDir = -1, t.TempDir() }},
	} {
		o := base
		tc.edit(&o)
		if _, err := prefixcache.New(o); err == nil {
			t.Errorf("%s: New accepted %+v", tc.name, o)
		}
	}
	c, err := prefixcache.New(base)
	if err != nil || c.Host().Disk() != nil {
		t.Errorf("no disk budget: disk tier %v, %v; want none", c.Host().Disk(), err)
	}
}

// TestDiskTierObserver: replaying the disk tier's reports (writes,
// supersessions, evictions, Drain) gives its AppendBlocks list, as the
// host tier's do: the worker's disk-tier KV events.
func TestDiskTierObserver(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 256})
	if err != nil {
		t.Fatal(err)
	}
	perToken := int64(eng.Spec().KVBytesPerToken())
	// One entry in the engine, 64 tokens on the host, 100 on disk: each
	// prompt pushes the one before it down a tier.
	c, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 10, MaxEntries: 1, BlockTokens: 16,
		HostBytes: 64 * perToken, DiskDir: t.TempDir(), DiskBytes: 100 * perToken})
	if err != nil {
		t.Fatal(err)
	}
	obs := setObserver{}
	disk := c.Host().Disk()
	disk.SetObserver(obs)
	check := func(when string) {
		t.Helper()
		marked := false
		got := disk.AppendBlocks(nil, func() { marked = true })
		want := make([]uint64, 0, len(obs))
		for h := range obs {
			want = append(want, uint64(h))
		}
		slices.Sort(got)
		slices.Sort(want)
		if !marked || !slices.Equal(got, want) {
			t.Errorf("%s: AppendBlocks %v (marked %v), replayed reports %v", when, got, marked, want)
		}
	}
	base := tokens(nil, 64, 0, 1, 250)
	prompts := [][]int32{base[:33], tokens(nil, 50, 0, 2, 250), base, tokens(base, 60, 40, 3, 250),
		tokens(nil, 40, 0, 4, 250), tokens(nil, 50, 0, 5, 250), tokens(nil, 40, 0, 6, 250)}
	for i, p := range prompts {
		seq := engine.SeqID(i + 1)
		run(t, eng, seq, p, 0, 0)
		if err := c.Free(eng, c.Insert(seq, c.Hashes(0, p), len(p))); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("after prompt %d", i))
	}
	if st := c.Stats().Disk; st.Spills < 3 || st.Superseded == 0 || st.Evictions == 0 || len(obs) == 0 {
		t.Errorf("disk stats %+v, %d blocks reported: want writes, a supersession and an eviction", st, len(obs))
	}
	if err := c.Free(eng, c.Drain()); err != nil {
		t.Fatal(err)
	}
	check("after Drain")
	if len(obs) != 0 {
		t.Errorf("after Drain: %d blocks reported held, want none", len(obs))
	}
	var off *prefixcache.Disk
	off.SetObserver(obs)
	calls := 0
	if got := off.AppendBlocks(nil, func() { calls++ }); got != nil || calls != 1 {
		t.Errorf("nil tier AppendBlocks = %v, mark calls %d; want nil and a call", got, calls)
	}
}
