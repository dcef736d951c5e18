package batchload

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestScore(t *testing.T) {
	tests := []struct {
		name  string
		batch []int
		want  []float64
	}{
		{"idle", []int{0, 0}, []float64{1, 1}},
		{"relative to the largest", []int{0, 2, 8}, []float64{1, 0.75, 0}},
		{"equal", []int{3, 3}, []float64{0, 0}},
		{"negative counts as 0", []int{-1, 4}, []float64{1, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := make([]framework.Candidate, len(tc.batch))
			for i, b := range tc.batch {
				cs[i].Load.RunningBatch = b
			}
			got := make([]float64, len(cs))
			(&Scorer{}).Score(&framework.Input{}, cs, got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Score (-want +got):\n%s", diff)
			}
		})
	}
}
