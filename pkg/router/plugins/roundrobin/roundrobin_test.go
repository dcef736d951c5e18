package roundrobin

import (
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func candidates(ids ...string) []framework.Candidate {
	cs := make([]framework.Candidate, len(ids))
	for i, id := range ids {
		cs[i].Worker.ID = id
	}
	return cs
}

func TestPick(t *testing.T) {
	tests := []struct {
		name  string
		calls [][]string // candidate ids of each call
		want  []string   // id picked by each call
	}{
		{"one", [][]string{{"a"}, {"a"}}, []string{"a", "a"}},
		{"cycles in id order", [][]string{{"c", "a", "b"}, {"c", "a", "b"}, {"c", "a", "b"}, {"c", "a", "b"}},
			[]string{"a", "b", "c", "a"}},
		{"order of candidates does not matter", [][]string{{"a", "b", "c"}, {"c", "b", "a"}, {"b", "a", "c"}},
			[]string{"a", "b", "c"}},
		{"filtered worker is skipped", [][]string{{"a", "b", "c"}, {"a", "c"}, {"a", "b", "c"}},
			[]string{"a", "c", "a"}},
		{"joining worker takes its turn", [][]string{{"a", "c"}, {"a", "b", "c"}, {"a", "b", "c"}},
			[]string{"a", "b", "c"}},
		{"last picked left", [][]string{{"a", "b", "c"}, {"a", "b", "c"}, {"a", "c"}},
			[]string{"a", "b", "c"}},
		{"wraps past the largest id", [][]string{{"b", "c"}, {"b", "c"}, {"a", "b"}},
			[]string{"b", "c", "a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p Picker
			var got []string
			for _, ids := range tc.calls {
				cs := candidates(ids...)
				// Totals favour the last candidate: they must not matter.
				totals := make([]float64, len(cs))
				totals[len(totals)-1] = 1
				got = append(got, cs[p.Pick(&framework.Input{}, cs, totals)].Worker.ID)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("picks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPickSameID(t *testing.T) {
	var p Picker
	if got := p.Pick(&framework.Input{}, candidates("x", "x"), []float64{0, 1}); got != 0 {
		t.Errorf("Pick = %d, want 0 (earliest of equal ids)", got)
	}
}

// TestPickConcurrent: concurrent calls share the turn, so n·k calls over
// n workers pick each exactly k times.
func TestPickConcurrent(t *testing.T) {
	const workers, rounds = 4, 250
	var p Picker
	ids := []string{"w0", "w1", "w2", "w3"}
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				cs := candidates(ids...)
				id := cs[p.Pick(&framework.Input{}, cs, make([]float64, len(cs)))].Worker.ID
				mu.Lock()
				counts[id]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	want := map[string]int{"w0": rounds, "w1": rounds, "w2": rounds, "w3": rounds}
	if diff := cmp.Diff(want, counts); diff != "" {
		t.Errorf("picks per worker (-want +got):\n%s", diff)
	}
}
