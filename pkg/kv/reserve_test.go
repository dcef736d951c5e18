package kv

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestReservations(t *testing.T) {
	p := newTestPool(t, 8, 16)
	r := NewReservations(p)

	ids, err := r.Reserve("a", 40) // 3 blocks
	if err != nil {
		t.Fatalf("Reserve(a, 40): %v", err)
	}
	if len(ids) != 3 || r.Tokens("a") != 48 {
		t.Errorf("Reserve(a, 40) gave %d blocks, %d tokens; want 3, 48", len(ids), r.Tokens("a"))
	}
	if _, err := r.Reserve("a", 1); !errors.Is(err, ErrDuplicateReservation) {
		t.Errorf("second Reserve(a) = %v, want ErrDuplicateReservation", err)
	}
	if _, err := r.Reserve("b", 6*16); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("Reserve(b, 6 blocks) with 5 free = %v, want ErrPoolExhausted", err)
	}
	if _, ok := r.Blocks("b"); ok {
		t.Error("a failed reservation was recorded")
	}
	checkAccounting(t, p, 5)

	added, err := r.Grow("a", 48) // already holds it
	if err != nil || len(added) != 0 {
		t.Errorf("Grow(a, 48) = %v, %v; want none, nil", added, err)
	}
	added, err = r.Grow("a", 49)
	if err != nil || len(added) != 1 {
		t.Fatalf("Grow(a, 49) = %v, %v; want one block", added, err)
	}
	if _, err := r.Grow("a", 1000); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("Grow(a, 1000) = %v, want ErrPoolExhausted", err)
	}
	got, _ := r.Blocks("a")
	if diff := cmp.Diff(append(ids, added...), got); diff != "" {
		t.Errorf("Blocks(a) (-want +got):\n%s", diff)
	}
	if _, err := r.Grow("zz", 1); !errors.Is(err, ErrUnknownReservation) {
		t.Errorf("Grow(zz) = %v, want ErrUnknownReservation", err)
	}

	empty, err := r.Reserve("c", 0)
	if err != nil || len(empty) != 0 || r.Len() != 2 {
		t.Errorf("Reserve(c, 0) = %v, %v, Len %d", empty, err, r.Len())
	}
	if _, err := r.Reserve("d", -1); err == nil {
		t.Error("Reserve(d, -1) succeeded")
	}

	for _, id := range []string{"a", "c"} {
		if err := r.Release(id); err != nil {
			t.Errorf("Release(%s): %v", id, err)
		}
	}
	if err := r.Release("a"); !errors.Is(err, ErrUnknownReservation) {
		t.Errorf("second Release(a) = %v, want ErrUnknownReservation", err)
	}
	checkAccounting(t, p, 8)
	if r.Len() != 0 {
		t.Errorf("Len() = %d after releasing all", r.Len())
	}
}

func TestReservationsReclaimCachedPrefixes(t *testing.T) {
	p := newTestPool(t, 4, 2)
	c := NewPrefixCache(p)
	_, ids := cachePrompt(t, c, []int32{1, 1, 2, 2, 3, 3})
	if err := c.Release(ids); err != nil {
		t.Fatal(err)
	}
	r := NewReservations(c)
	if _, err := r.Reserve("x", 8); err != nil { // 1 free + 3 evictable
		t.Fatalf("Reserve over a cache with evictable blocks: %v", err)
	}
	if c.Len() != 0 {
		t.Errorf("cache kept %d entries", c.Len())
	}
	if err := r.Release("x"); err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, p, 4)
}
