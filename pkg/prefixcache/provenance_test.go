package prefixcache_test

import (
	"context"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// blockSet is an Observer that keeps the blocks it was told of.
type blockSet map[kv.Hash]bool

func (s blockSet) Stored(h kv.Hash)  { s[h] = true }
func (s blockSet) Removed(h kv.Hash) { delete(s, h) }

// TestSourceTagFollowsEntry: an entry inserted with a peer's tag hands
// it to a fork (Hit.Source) and to the host tier (HostLoad.Source), is
// never written to the disk tier (its files hold no provenance), and
// DropSource removes it from the engine and host tiers, reported to the
// observer, while the worker's own entries stay. Without the tag the
// purge would find nothing (Purged 0) and the peer's blocks would stay
// advertised.
func TestSourceTagFollowsEntry(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", Seed: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	kvTok := int64(eng.Spec().KVBytesPerToken())
	c, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 12, MaxEntries: 2, BlockTokens: 16,
		HostBytes: 48 * kvTok, DiskDir: t.TempDir(), DiskBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	obs := blockSet{}
	c.SetObserver(obs)
	prefill := func(seq engine.SeqID, p []int32) {
		if _, err := eng.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: p, Last: true}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	pulled, own := tokens(nil, 33, 0, 1, 250), tokens(nil, 33, 0, 2, 250)
	ph, oh := c.Hashes(0, pulled), c.Hashes(0, own)
	prefill(1, pulled)
	prefill(2, own)
	if err := c.Free(eng, c.InsertFrom(1, ph, 33, "peer-a")); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(eng, c.Insert(2, oh, 33)); err != nil {
		t.Fatal(err)
	}
	if hit := c.Acquire(oh, 2); hit.Tokens != 32 || hit.Source != "" {
		t.Errorf("own entry's hit %+v: want 32 tokens, no source", hit)
	} else {
		c.Release(hit)
	}
	hit := c.Acquire(ph, 2)
	if hit.Tokens != 32 || hit.Source != "peer-a" {
		t.Fatalf("hit %+v: want 32 tokens from peer-a", hit)
	}
	c.Release(hit)

	// Both go down to the host tier (its budget holds one 32-token
	// entry), the own one first: it goes on to the disk tier when the
	// pulled one comes.
	if err := c.Free(eng, c.Shrink(1<<20, 2)); err != nil {
		t.Fatal(err)
	}
	ld, err := c.Host().Load(eng, 10, ph, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng.Free(10)
	if st := c.Stats(); ld.Tokens != 32 || ld.Source != "peer-a" || st.Host.Entries != 1 || c.Host().Disk().Match(oh) != 2 {
		t.Fatalf("host load %+v, host %d entries: want peer-a's 32 tokens from the host tier, the own entry on disk", ld, st.Host.Entries)
	}

	// The peer's KV, pulled again, is in both tiers; the purge drops both.
	prefill(3, pulled)
	if err := c.Free(eng, c.InsertFrom(3, ph, 33, "peer-a")); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(eng, c.DropSource("peer-a")); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Peer.Purged != 2 || st.Entries != 0 || st.Host.Entries != 0 || c.Host().Match(ph) != 0 || c.Match(ph) != 0 {
		t.Errorf("after DropSource: %+v; want peer-a's engine and host entries gone (2 purged)", st)
	}
	if c.Host().Disk().Match(oh) != 2 {
		t.Error("the own entry left the disk tier")
	}
	for _, h := range ph {
		if obs[h] {
			t.Errorf("block %x of peer-a's entry is still advertised", h)
		}
	}

	// A peer's entry the host tier evicts is not written to disk.
	prefill(4, pulled)
	if err := c.Free(eng, c.InsertFrom(4, ph, 33, "peer-a")); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(eng, c.Shrink(1<<20, 1)); err != nil {
		t.Fatal(err)
	}
	own2 := tokens(nil, 33, 0, 3, 250)
	prefill(5, own2)
	if err := c.Free(eng, c.Insert(5, c.Hashes(0, own2), 33)); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(eng, c.Shrink(1<<20, 1)); err != nil {
		t.Fatal(err)
	}
	if d := c.Host().Disk(); c.Host().Match(ph) != 0 || d.Match(ph) != 0 || d.Match(c.Hashes(0, own2)) != 0 || c.Host().Match(c.Hashes(0, own2)) != 2 {
		t.Errorf("host tier holds %d blocks of the peer's entry, disk %d: want it dropped, not written", c.Host().Match(ph), d.Match(ph))
	}
	if c.DropSource("") != nil {
		t.Error("DropSource of the empty source dropped something")
	}
}
