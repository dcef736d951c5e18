package queuedtokens

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestScore(t *testing.T) {
	tests := []struct {
		name   string
		queued []int
		want   []float64
	}{
		{"one", []int{500}, []float64{0}},
		{"all empty", []int{0, 0}, []float64{1, 1}},
		{"relative to the longest", []int{0, 100, 400}, []float64{1, 0.75, 0}},
		{"negative estimates count as empty", []int{-10, 10}, []float64{1, 0}},
		{"all negative", []int{-10, -20}, []float64{1, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := make([]framework.Candidate, len(tc.queued))
			for i, q := range tc.queued {
				cs[i].Load.QueuedPrefillTokens = q
			}
			got := make([]float64, len(cs))
			(&Scorer{}).Score(&framework.Input{}, cs, got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Score (-want +got):\n%s", diff)
			}
		})
	}
}
