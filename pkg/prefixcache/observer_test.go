package prefixcache

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
)

// replay is an Observer that applies each report to a set, and fails the
// test on a report that contradicts it (a store of a held hash, a removal
// of one not held).
type replay struct {
	t   *testing.T
	set map[kv.Hash]bool
	n   int // reports
}

func (r *replay) Stored(h kv.Hash) {
	if r.set[h] {
		r.t.Errorf("Stored(%x) of a block reported held already", h)
	}
	r.set[h] = true
	r.n++
}

func (r *replay) Removed(h kv.Hash) {
	if !r.set[h] {
		r.t.Errorf("Removed(%x) of a block not reported held", h)
	}
	delete(r.set, h)
	r.n++
}

func (r *replay) blocks() []uint64 {
	out := make([]uint64, 0, len(r.set))
	for h := range r.set {
		out = append(out, uint64(h))
	}
	slices.Sort(out)
	return out
}

// TestObserverReplaysCache drives a cache with random inserts, hits,
// evictions, trims, shrinks, reclaims and drains, and checks after each
// step that the observer's replay equals the cache's blocks.
func TestObserverReplaysCache(t *testing.T) {
	c := newCache(t, 96, 6)
	r := &replay{t: t, set: map[kv.Hash]bool{}}
	c.SetObserver(r)
	rng := rand.New(rand.NewPCG(1, 2))
	var pins []Hit
	seq := engine.SeqID(0)
	for step := range 2000 {
		switch op := rng.IntN(10); {
		case op < 5:
			// Prompts share up to 3 of 8 families' leading blocks, so
			// inserts supersede and overlap.
			n := 4 * (1 + rng.IntN(8))
			p := toks(n, 4*rng.IntN(4), int32(rng.IntN(8)+1))
			seq++
			c.Insert(seq, kv.HashBlocks(0, p, 4), n+rng.IntN(4))
		case op < 7:
			p := toks(32, 4*rng.IntN(4), int32(rng.IntN(8)+1))
			if h := c.Acquire(kv.HashBlocks(0, p, 4), 7); h.Tokens > 0 {
				pins = append(pins, h)
			}
		case op == 7 && len(pins) > 0:
			i := rng.IntN(len(pins))
			c.Release(pins[i])
			pins = slices.Delete(pins, i, i+1)
			c.Trim()
		case op == 8:
			c.Shrink(rng.IntN(40), rng.IntN(2))
		case op == 9 && rng.IntN(20) == 0:
			c.Drain()
		}
		got := c.AppendBlocks(nil, nil)
		slices.Sort(got)
		if diff := cmp.Diff(got, r.blocks(), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("step %d: replayed reports differ from the cache's blocks (-cache +replay):\n%s", step, diff)
		}
	}
	if r.n == 0 || c.Stats().Evictions == 0 || c.Stats().Superseded == 0 || c.Stats().Reclaims == 0 {
		t.Errorf("the run exercised too little: %d reports, stats %+v", r.n, c.Stats())
	}
}

// TestAppendBlocksMark checks that mark runs once, after the hashes were
// gathered, and that a nil cache still calls it.
func TestAppendBlocksMark(t *testing.T) {
	c := newCache(t, 64, 4)
	c.Insert(1, kv.HashBlocks(0, toks(16, 0, 1), 4), 16)
	calls := 0
	got := c.AppendBlocks([]uint64{42}, func() { calls++ })
	if calls != 1 || len(got) != 5 || got[0] != 42 {
		t.Errorf("AppendBlocks = %d hashes (first %d), mark called %d times; want 42 then 4 blocks, once", len(got), got[0], calls)
	}
	var off *Cache
	off.SetObserver(&replay{t: t})
	if got := off.AppendBlocks(nil, func() { calls++ }); got != nil || calls != 2 {
		t.Errorf("nil cache AppendBlocks = %v, mark calls %d; want nil and a call", got, calls)
	}
}
