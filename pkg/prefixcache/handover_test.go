package prefixcache

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
)

var sortU64 = cmpopts.SortSlices(func(a, b uint64) bool { return a < b })

// TestHandoverAdopt hands a cache's engine tier to another cache on the
// same engine: the unpinned entries leave the old one (its observer told
// of every block), the new one holds them with their provenance tags and
// recency, its bounds evict the least recently used, and a pinned entry
// stays where it is.
func TestHandoverAdopt(t *testing.T) {
	old := newCache(t, 100, 10)
	rep := &replay{t: t, set: map[kv.Hash]bool{}}
	old.SetObserver(rep)
	p1, p2, p3, p4 := toks(8, 0, 1), toks(12, 4, 2), toks(8, 0, 3), toks(8, 0, 4)
	h1, h2, h3, h4 := kv.HashBlocks(0, p1, 4), kv.HashBlocks(0, p2, 4), kv.HashBlocks(0, p3, 4), kv.HashBlocks(0, p4, 4)
	for _, in := range []struct {
		seq    engine.SeqID
		h      []kv.Hash
		source string
	}{{1, h1, ""}, {2, h2, "peer-a"}, {3, h3, ""}, {4, h4, ""}} {
		if free := old.InsertFrom(in.seq, in.h, len(in.h)*4, in.source); len(free) != 0 {
			t.Fatalf("insert %d freed %v", in.seq, free)
		}
	}
	pin := old.Acquire(h4, 2)       // a peer's export under way
	old.Release(old.Acquire(h1, 2)) // 1 most recent now

	h := old.Handover()
	type ent struct {
		Seq    engine.SeqID
		Tokens int
		Source string
	}
	var got []ent
	for _, e := range h.Entries {
		got = append(got, ent{e.Seq, e.Tokens, e.Source})
	}
	want := []ent{{1, 8, ""}, {3, 8, ""}, {2, 12, "peer-a"}} // most recent first; 4 is pinned
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("handed over (-want +got):\n%s", diff)
	}
	if h.MaxSeq() != 3 || h.BlockTokens != 4 {
		t.Errorf("MaxSeq %d, BlockTokens %d; want 3, 4", h.MaxSeq(), h.BlockTokens)
	}
	if st := old.Stats(); st.Entries != 1 || st.Tokens != 8 || old.Match(h2) != 0 {
		t.Errorf("old cache after the handover: %+v, match of a handed entry %d", st, old.Match(h2))
	}
	if diff := cmp.Diff(old.AppendBlocks(nil, nil), rep.blocks(), sortU64); diff != "" {
		t.Errorf("old cache's observer (-cache +observer):\n%s", diff)
	}
	old.Release(pin)

	// Two entries fit the new cache: the least recently used (2) goes.
	nc := newCache(t, 100, 2)
	nrep := &replay{t: t, set: map[kv.Hash]bool{}}
	nc.SetObserver(nrep)
	if free := nc.Adopt(h); !slices.Equal(free, []engine.SeqID{2}) {
		t.Errorf("Adopt freed %v, want [2] (the least recently used, beyond MaxEntries)", free)
	}
	st := nc.Stats()
	if st.Adopted != 3 || st.Inserts != 0 || st.Entries != 2 || st.Tokens != 16 {
		t.Errorf("new cache: %+v, want 3 adopted, 2 entries of 16 tokens", st)
	}
	if hit := nc.Acquire(h1, 2); hit.Seq != 1 || hit.Tokens != 8 {
		t.Errorf("hit of the handed entry: %+v, want seq 1, 8 tokens", hit)
	} else {
		nc.Release(hit)
	}
	if diff := cmp.Diff(nc.AppendBlocks(nil, nil), nrep.blocks(), sortU64); diff != "" {
		t.Errorf("new cache's observer (-cache +observer):\n%s", diff)
	}

	// The provenance tag goes along: a purge of the peer drops its entry.
	tagged := newCache(t, 100, 10)
	tagged.Adopt(Handover{BlockTokens: 4, Entries: []Handed{{Seq: 7, Hashes: h2, Tokens: 12, Source: "peer-a"}}})
	if hit := tagged.Acquire(h2, 2); hit.Source != "peer-a" {
		t.Errorf("adopted entry's source %q, want peer-a", hit.Source)
	} else {
		tagged.Release(hit)
	}
	if free := tagged.DropSource("peer-a"); !slices.Equal(free, []engine.SeqID{7}) {
		t.Errorf("DropSource after Adopt freed %v, want [7]", free)
	}
}

// TestAdoptRefusesOtherHashes: a cache of another block size or hash key
// (or none) adopts nothing and hands every sequence back to free.
func TestAdoptRefusesOtherHashes(t *testing.T) {
	src := newCache(t, 100, 10)
	src.Insert(1, kv.HashBlocks(0, toks(8, 0, 1), 4), 8)
	src.Insert(2, kv.HashBlocks(0, toks(8, 0, 2), 4), 8)
	h := src.Handover()
	key, err := kv.NewHashKey([]byte(strings.Repeat("k", kv.MinHashKeyBytes)))
	if err != nil {
		t.Fatal(err)
	}
	other8, err := New(Options{MaxTokens: 100, MaxEntries: 10, BlockTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	keyed, err := New(Options{MaxTokens: 100, MaxEntries: 10, BlockTokens: 4, HashKey: key})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*Cache{"block size": other8, "hash key": keyed, "off": nil} {
		free := c.Adopt(h)
		slices.Sort(free)
		if !slices.Equal(free, []engine.SeqID{1, 2}) || c.Stats().Entries != 0 {
			t.Errorf("%s: Adopt freed %v, holds %d entries; want [1 2] freed, none held", name, free, c.Stats().Entries)
		}
	}
}
