package main

import (
	"testing"

	"github.com/pdserve/pdserve/pkg/workload"
)

// TestRepeatRequests: about the fraction asked become exact repeats of
// earlier requests, the same on every run of a seed.
func TestRepeatRequests(t *testing.T) {
	load := func() []workload.Request {
		wl, err := workload.Random(workload.RandomOptions{InputLen: 16, OutputLen: 4}, 1000, 1, workload.Synth{})
		if err != nil {
			t.Fatal(err)
		}
		return wl.Requests
	}
	a, b := load(), load()
	na, nb := repeatRequests(a, 0.2, 9), repeatRequests(b, 0.2, 9)
	if na != nb || na < 150 || na > 250 {
		t.Fatalf("%d and %d repeats of 1000 at 0.2", na, nb)
	}
	seen := map[string]bool{}
	dups := 0
	for i := range a {
		pa, ia := a[i].Body()
		pb, ib := b[i].Body()
		if pa != pb || len(ia) != len(ib) || a[i].OutputLen != b[i].OutputLen {
			t.Fatalf("request %d differs between runs of one seed", i)
		}
		k := pa + string(rune(len(ia))) + string(rune(a[i].OutputLen))
		for _, id := range ia {
			k += string(rune(id))
		}
		if seen[k] {
			dups++
		}
		seen[k] = true
	}
	if dups != na {
		t.Errorf("%d exact repeats in the bodies, want %d", dups, na)
	}
	if n := repeatRequests(load(), 0, 9); n != 0 {
		t.Errorf("fraction 0: %d repeats", n)
	}
}
