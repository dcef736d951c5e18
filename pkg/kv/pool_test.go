package kv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func newTestPool(t *testing.T, blocks, tokens int) *Pool {
	t.Helper()
	p, err := NewPool(blocks, tokens)
	if err != nil {
		t.Fatalf("NewPool(%d, %d): %v", blocks, tokens, err)
	}
	return p
}

// checkAccounting fails the test when the pool's counts are not
// free/used/total = wantFree/total-wantFree/total.
func checkAccounting(t *testing.T, p *Pool, wantFree int) {
	t.Helper()
	if got := p.Free(); got != wantFree {
		t.Errorf("Free() = %d, want %d", got, wantFree)
	}
	if got, want := p.Used(), p.Total()-wantFree; got != want {
		t.Errorf("Used() = %d, want %d", got, want)
	}
}

func TestNewPoolRejectsBadSizes(t *testing.T) {
	for _, tc := range []struct{ blocks, tokens int }{{0, 16}, {-1, 16}, {8, 0}, {8, -4}, {1 << 31, 16}} {
		t.Run(fmt.Sprintf("%dx%d", tc.blocks, tc.tokens), func(t *testing.T) {
			if _, err := NewPool(tc.blocks, tc.tokens); err == nil {
				t.Errorf("NewPool(%d, %d) succeeded, want an error", tc.blocks, tc.tokens)
			}
		})
	}
}

func TestBlocksFor(t *testing.T) {
	p := newTestPool(t, 4, 16)
	for _, tc := range []struct{ tokens, want int }{{-5, 0}, {0, 0}, {1, 1}, {15, 1}, {16, 1}, {17, 2}, {32, 2}, {33, 3}} {
		if got := p.BlocksFor(tc.tokens); got != tc.want {
			t.Errorf("BlocksFor(%d) = %d, want %d", tc.tokens, got, tc.want)
		}
	}
	if got := p.BlockTokens(); got != 16 {
		t.Errorf("BlockTokens() = %d, want 16", got)
	}
}

func TestAllocateReleaseAccounting(t *testing.T) {
	p := newTestPool(t, 8, 16)
	checkAccounting(t, p, 8)

	a, err := p.Allocate(3)
	if err != nil {
		t.Fatalf("Allocate(3): %v", err)
	}
	if diff := cmp.Diff([]BlockID{0, 1, 2}, a); diff != "" {
		t.Errorf("first allocation of a fresh pool (-want +got):\n%s", diff)
	}
	checkAccounting(t, p, 5)

	b, err := p.Allocate(5)
	if err != nil {
		t.Fatalf("Allocate(5): %v", err)
	}
	checkAccounting(t, p, 0)
	seen := map[BlockID]bool{}
	for _, id := range append(append([]BlockID{}, a...), b...) {
		if seen[id] || id < 0 || int(id) >= p.Total() {
			t.Fatalf("block %d handed out twice or out of range: %v %v", id, a, b)
		}
		seen[id] = true
	}

	if err := p.Release(a); err != nil {
		t.Fatalf("Release(%v): %v", a, err)
	}
	checkAccounting(t, p, 3)
	if err := p.Release(b); err != nil {
		t.Fatalf("Release(%v): %v", b, err)
	}
	checkAccounting(t, p, 8)

	empty, err := p.Allocate(0)
	if err != nil || len(empty) != 0 {
		t.Errorf("Allocate(0) = %v, %v; want empty, nil", empty, err)
	}
	if _, err := p.Allocate(-1); err == nil {
		t.Error("Allocate(-1) succeeded, want an error")
	}
	checkAccounting(t, p, 8)
}

func TestAllocateExhaustedIsAllOrNothing(t *testing.T) {
	p := newTestPool(t, 4, 16)
	held, err := p.Allocate(3)
	if err != nil {
		t.Fatalf("Allocate(3): %v", err)
	}
	got, err := p.Allocate(2)
	if !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("Allocate(2) with 1 free = %v, %v; want ErrPoolExhausted", got, err)
	}
	for _, want := range []string{"allocate 2 blocks", "1 free of 4"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not state %q", err, want)
		}
	}
	checkAccounting(t, p, 1)
	if _, err := p.Allocate(1); err != nil {
		t.Errorf("Allocate(1) after a failed allocation: %v", err)
	}
	if _, err := p.Allocate(1 << 30); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("Allocate(1<<30) = %v, want ErrPoolExhausted", err)
	}
	if err := p.Release(held); err != nil {
		t.Fatal(err)
	}
}

func TestReleaseErrorsChangeNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release func(ids []BlockID) []BlockID // from the allocated ids
		want    error
	}{
		{"unknown negative", func(ids []BlockID) []BlockID { return []BlockID{ids[0], -1} }, ErrUnknownBlock},
		{"unknown too big", func(ids []BlockID) []BlockID { return []BlockID{ids[0], ids[1], 99} }, ErrUnknownBlock},
		{"free block", func(ids []BlockID) []BlockID { return []BlockID{ids[0], 5} }, ErrDoubleFree},
		{"listed twice with one ref", func(ids []BlockID) []BlockID { return []BlockID{ids[1], ids[0], ids[1]} }, ErrDoubleFree},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, 6, 4)
			ids, err := p.Allocate(2)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Release(tc.release(ids)); !errors.Is(err, tc.want) {
				t.Fatalf("Release = %v, want %v", err, tc.want)
			}
			checkAccounting(t, p, 4)
			for _, id := range ids {
				if got := p.refCount(id); got != 1 {
					t.Errorf("block %d holds %d refs after a failed release, want 1", id, got)
				}
			}
			if err := p.Release(ids); err != nil {
				t.Errorf("Release of the held blocks after the failure: %v", err)
			}
			checkAccounting(t, p, 6)
		})
	}
}

func TestDoubleRelease(t *testing.T) {
	p := newTestPool(t, 2, 4)
	ids, err := p.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ids); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ids); !errors.Is(err, ErrDoubleFree) {
		t.Errorf("second Release = %v, want ErrDoubleFree", err)
	}
	checkAccounting(t, p, 2)
}

func TestRetainSharesBlocks(t *testing.T) {
	p := newTestPool(t, 4, 4)
	ids, err := p.Allocate(2)
	if err != nil {
		t.Fatal(err)
	}
	// A second holder of the prefix, and a third of the first block only.
	if err := p.Retain(ids); err != nil {
		t.Fatal(err)
	}
	if err := p.Retain(ids[:1]); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ids); err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, p, 2)
	// Releasing a block listed twice drops two references.
	if err := p.Release([]BlockID{ids[0], ids[0], ids[1]}); err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, p, 4)

	// Retain of a free or unknown block fails and changes nothing.
	ids, err = p.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ids  []BlockID
		want error
	}{{[]BlockID{ids[0], 3}, ErrDoubleFree}, {[]BlockID{ids[0], 7}, ErrUnknownBlock}} {
		if err := p.Retain(tc.ids); !errors.Is(err, tc.want) {
			t.Errorf("Retain(%v) = %v, want %v", tc.ids, err, tc.want)
		}
	}
	if got := p.refCount(ids[0]); got != 1 {
		t.Errorf("refs after failed retains = %d, want 1", got)
	}
}

// TestPoolConcurrent hammers one pool from many goroutines and checks that
// no block is ever held by two owners at once and that everything returns.
func TestPoolConcurrent(t *testing.T) {
	const total, workers, rounds = 64, 8, 300
	p := newTestPool(t, total, 16)
	owner := make([]atomic.Int32, total) // 0 = nobody, else worker+1
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				ids, err := p.Allocate(1 + r.IntN(12))
				if errors.Is(err, ErrPoolExhausted) {
					continue
				}
				if err != nil {
					errc <- err
					return
				}
				for _, id := range ids {
					if !owner[id].CompareAndSwap(0, int32(w+1)) {
						errc <- fmt.Errorf("block %d handed to worker %d while held by %d", id, w+1, owner[id].Load())
						return
					}
				}
				if err := p.Retain(ids); err != nil {
					errc <- err
					return
				}
				if err := p.Release(ids); err != nil {
					errc <- err
					return
				}
				for _, id := range ids {
					owner[id].Store(0)
				}
				if err := p.Release(ids); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	checkAccounting(t, p, total)
}
