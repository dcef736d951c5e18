package kvpressure

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestScore(t *testing.T) {
	type w struct{ free, total int }
	tests := []struct {
		name string
		ws   []w
		want []float64
	}{
		{"share of the total", []w{{50, 100}, {100, 100}, {0, 100}}, []float64{0.5, 1, 0}},
		{"share, not count: the emptier small worker wins", []w{{60, 100}, {200, 1000}}, []float64{0.6, 0.2}},
		{"negative estimate is 0", []w{{-5, 100}}, []float64{0}},
		{"free over total is clamped", []w{{150, 100}}, []float64{1}},
		{"no totals: relative to the most free", []w{{10, 0}, {30, 0}, {15, 0}}, []float64{1.0 / 3, 1, 0.5}},
		{"no totals, none free", []w{{0, 0}, {-3, 0}}, []float64{0, 0}},
		{"mixed", []w{{40, 0}, {10, 20}}, []float64{1, 0.5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := make([]framework.Candidate, len(tc.ws))
			for i, w := range tc.ws {
				cs[i].Load.KVBlocksFree, cs[i].Worker.KVBlocksTotal = w.free, w.total
			}
			got := make([]float64, len(cs))
			(&Scorer{}).Score(&framework.Input{}, cs, got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Score (-want +got):\n%s", diff)
			}
		})
	}
}
