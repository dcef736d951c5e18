package batching

import (
	"slices"
	"testing"

	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// order starts every request of prios (in order of joining) one by one,
// as a batch with room for one at a time does, and returns the indexes
// in the order they started.
func order(prios []vocab.Priority, overtakes int) []int {
	type req struct {
		i int
		w Waiter
	}
	var waiting []*req
	for i, p := range prios {
		waiting = append(waiting, &req{i: i, w: Waiter{Priority: p}})
	}
	w := func(r *req) *Waiter { return &r.w }
	var out []int
	for len(waiting) > 0 {
		i := Next(waiting, w, overtakes)
		Started(waiting, i, w)
		out = append(out, waiting[i].i)
		waiting = slices.Delete(waiting, i, i+1)
	}
	return out
}

// TestNextOrder: interactive requests start before batch ones, FCFS
// within a priority, and a batch request is passed by at most overtakes
// later interactive ones; overtakes 0 is FCFS. Fails on FCFS (the
// interactive request 2 would start third), and on strict priority (the
// batch requests would start last).
func TestNextOrder(t *testing.T) {
	I, B := vocab.PriorityInteractive, vocab.PriorityBatch
	for _, tc := range []struct {
		name      string
		prios     []vocab.Priority
		overtakes int
		want      []int
	}{
		{"interactive first", []vocab.Priority{B, B, I, I}, 8, []int{2, 3, 0, 1}},
		{"fcfs within a priority", []vocab.Priority{I, B, I, B, I}, 8, []int{0, 2, 4, 1, 3}},
		{"batch starts after two overtakes", []vocab.Priority{B, I, I, I, I, B, I}, 2, []int{1, 2, 0, 3, 4, 6, 5}},
		{"fcfs without priorities", []vocab.Priority{B, I, B, I}, 0, []int{0, 1, 2, 3}},
		{"empty", nil, 8, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := order(tc.prios, tc.overtakes); !slices.Equal(got, tc.want) {
				t.Errorf("start order %v, want %v", got, tc.want)
			}
		})
	}
}
