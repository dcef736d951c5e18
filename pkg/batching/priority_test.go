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
		p vocab.Priority
	}
	var waiting []req
	for i, p := range prios {
		waiting = append(waiting, req{i: i, p: p})
	}
	prio := func(r req) vocab.Priority { return r.p }
	o := &Order{Overtakes: overtakes}
	var out []int
	for len(waiting) > 0 {
		i := Next(o, waiting, prio)
		Started(o, waiting, i, prio)
		out = append(out, waiting[i].i)
		waiting = slices.Delete(waiting, i, i+1)
	}
	return out
}

// TestNextOrder: interactive requests start before older batch ones, at
// most overtakes in a row; then the oldest starts; FCFS within a
// priority; overtakes 0 is FCFS. Fails on FCFS (the interactive request
// 2 would start third), on strict priority (the batch requests would
// start last), and on aging each batch request on its own passes (in
// "one batch request per overtakes", b0..b3 would all start after i4 and
// i5).
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
		{"one batch request per overtakes", []vocab.Priority{B, B, B, B, I, I, I, I, I, I}, 2, []int{4, 5, 0, 6, 7, 1, 8, 9, 2, 3}},
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
