package prefixcache_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// tieredCache returns a cache of one engine entry, a host tier of 64
// tokens and a disk tier in dir, on eng.
func tieredCache(t *testing.T, eng engine.Engine, dir string, hostBytes int64) *prefixcache.Cache {
	t.Helper()
	o := prefixcache.Options{MaxTokens: 1 << 12, MaxEntries: 1, BlockTokens: 16, HostBytes: hostBytes}
	if hostBytes > 0 {
		o.DiskDir, o.DiskBytes = dir, 1<<30
	}
	c, err := prefixcache.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestHandoverMovesHostAndDiskTiers: a role change's Handover carries the
// host and disk tiers along with the engine tier. The new role's cache
// hits the prompt held in host memory and the one held on disk (token-
// and KV-exact against a cold run), the disk entry's file renamed into
// its own directory; the old cache's Drain removes nothing of them, and
// the new one's removes it all. A cache without a host tier drops the
// handed tiers, files included. (Before, only the engine tier moved: the
// new cache missed both prompts.)
func TestHandoverMovesHostAndDiskTiers(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	vocab := int32(min(eng.Spec().Vocab, 250))
	hostBytes := int64(64 * eng.Spec().KVBytesPerToken())
	dir := t.TempDir()

	// fill leaves base (4 blocks) on disk, p2 (2 blocks) in host memory
	// and p3 in the engine.
	fill := func(c *prefixcache.Cache, seed int32) (base, p2, p3 []int32) {
		t.Helper()
		base = tokens(nil, 70, 0, seed, vocab)
		p2, p3 = tokens(nil, 40, 0, seed+1, vocab), tokens(nil, 40, 0, seed+2, vocab)
		for i, p := range [][]int32{base, p2, p3} {
			seq := engine.SeqID(int(seed)*10 + i + 1)
			run(t, eng, seq, p, 0, 0)
			if err := c.Free(eng, c.Insert(seq, c.Hashes(0, p), len(p))); err != nil {
				t.Fatal(err)
			}
		}
		if st := c.Stats(); st.Disk.Entries != 1 || st.Host.Entries != 1 || st.Entries != 1 {
			t.Fatalf("filled: engine %d, host %+v, disk %+v; want one entry each", st.Entries, st.Host, st.Disk)
		}
		return base, p2, p3
	}

	old := tieredCache(t, eng, dir, hostBytes)
	base, p2, p3 := fill(old, 1)
	oldDir := old.Host().Disk().Dir()
	h := old.Handover()
	if st := old.Stats(); st.Host.Entries != 0 || st.Disk.Entries != 0 {
		t.Errorf("old cache after the handover: host %+v, disk %+v; want both empty", st.Host, st.Disk)
	}
	// The old role stops: its Drain must leave the handed files.
	for _, s := range old.Drain() {
		eng.Free(s)
	}
	if _, err := os.Stat(oldDir); err != nil {
		t.Fatalf("the old cache's Drain removed the handed disk tier: %v", err)
	}

	nc := tieredCache(t, eng, dir, hostBytes)
	for _, s := range nc.Adopt(h) {
		eng.Free(s)
	}
	st := nc.Stats()
	if st.Host.Adopted != 1 || st.Host.Entries != 1 || st.Disk.Adopted != 1 || st.Disk.Entries != 1 || st.Entries != 1 {
		t.Fatalf("new cache: engine %d, host %+v, disk %+v; want one entry each, adopted", st.Entries, st.Host, st.Disk)
	}
	newDir := nc.Host().Disk().Dir()
	if files, _ := os.ReadDir(newDir); len(files) != 1 {
		t.Errorf("new disk tier directory holds %d files, want 1 (the renamed entry)", len(files))
	}
	if _, err := os.Stat(oldDir); !os.IsNotExist(err) {
		t.Errorf("the handed directory is still there after Adopt (%v)", err)
	}
	if n := nc.Match(nc.Hashes(0, p3)); n != 2 {
		t.Errorf("engine tier matches %d blocks of p3, want 2", n)
	}

	seq := engine.SeqID(100)
	// p2 from the host tier.
	hashes, maxHit := nc.Hashes(0, p2), nc.MaxHitBlocks(len(p2))
	if !nc.HostDeeper(hashes, maxHit, nil) {
		t.Fatal("HostDeeper = false for p2, held in the handed host tier")
	}
	ld, err := nc.Host().Load(eng, seq, hashes, maxHit, nil)
	if err != nil || ld.Tokens != 32 {
		t.Fatalf("host load of p2: %+v, %v; want 32 tokens", ld, err)
	}
	matchesCold(t, eng, seq, seq+1, p2, ld.Tokens, true, "a load from the handed host tier")
	// base from the disk tier.
	hashes, maxHit = nc.Hashes(0, base), nc.MaxHitBlocks(len(base))
	r := nc.ReadDisk(context.Background(), hashes, maxHit)
	if !nc.HostDeeper(hashes, maxHit, r) {
		t.Fatal("HostDeeper = false for base, held in the handed disk tier")
	}
	ld, err = nc.Host().Load(eng, seq+2, hashes, maxHit, r)
	if err != nil || ld.Tokens != 64 {
		t.Fatalf("disk load of base: %+v, %v; want 64 tokens", ld, err)
	}
	matchesCold(t, eng, seq+2, seq+3, base, ld.Tokens, true, "a load from the handed disk tier")
	if st := nc.Stats(); st.Host.Hits != 1 || st.Disk.Hits != 1 {
		t.Errorf("hits: host %+v, disk %+v; want one each", st.Host, st.Disk)
	}

	for _, s := range nc.Drain() {
		eng.Free(s)
	}
	if _, err := os.Stat(newDir); !os.IsNotExist(err) {
		t.Errorf("the new cache's Drain left its directory (%v)", err)
	}

	// A new role without a host tier drops what is handed, files too.
	old = tieredCache(t, eng, dir, hostBytes)
	fill(old, 5)
	h = old.Handover()
	for _, s := range old.Drain() {
		eng.Free(s)
	}
	bare := tieredCache(t, eng, dir, 0)
	for _, s := range bare.Adopt(h) {
		eng.Free(s)
	}
	if st := bare.Stats(); st.Host.Entries != 0 || st.Entries != 1 {
		t.Errorf("cache without a host tier: engine %d, host %+v; want the engine entry only", st.Entries, st.Host)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "pdserve-kv-*")); len(left) != 0 {
		t.Errorf("disk tier directories left after a cache without tiers adopted: %v", left)
	}
	for _, s := range bare.Drain() {
		eng.Free(s)
	}
}
