package prefixoverlap

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestScore(t *testing.T) {
	tests := []struct {
		name   string
		hashes int
		hits   []int
		want   []float64
	}{
		{"no hashes", 0, []int{0, 3}, []float64{0, 0}},
		{"fractions", 4, []int{0, 1, 2, 4}, []float64{0, 0.25, 0.5, 1}},
		{"out of range hits are clamped", 2, []int{-1, 5}, []float64{0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := &framework.Input{Request: framework.Request{PrefixHashes: make([]uint64, tc.hashes)}}
			cs := make([]framework.Candidate, len(tc.hits))
			for i, h := range tc.hits {
				cs[i].PrefixHitBlocks = h
			}
			got := make([]float64, len(cs))
			(&Scorer{}).Score(in, cs, got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Score (-want +got):\n%s", diff)
			}
		})
	}
}
