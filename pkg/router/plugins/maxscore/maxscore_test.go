package maxscore

import (
	"testing"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestPick(t *testing.T) {
	tests := []struct {
		name   string
		ids    []string
		totals []float64
		want   int
	}{
		{"one", []string{"a"}, []float64{0}, 0},
		{"highest", []string{"a", "b", "c"}, []float64{0.1, 0.9, 0.5}, 1},
		{"tie: lowest id", []string{"c", "b", "a"}, []float64{1, 2, 2}, 2},
		{"tie: lowest id first", []string{"a", "b"}, []float64{2, 2}, 0},
		{"same id: earliest", []string{"x", "x"}, []float64{1, 1}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := make([]framework.Candidate, len(tc.ids))
			for i, id := range tc.ids {
				cs[i].Worker.ID = id
			}
			if got := (&Picker{}).Pick(&framework.Input{}, cs, tc.totals); got != tc.want {
				t.Errorf("Pick = %d, want %d", got, tc.want)
			}
		})
	}
}
