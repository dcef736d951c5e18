package prefixoverlap

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

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

// TestScoreByTier: blocks in the host tier beyond the engine's cost
// HostCost of a recomputed block each, so that a worker holding a prefix
// in engine memory beats one holding it in host memory, which beats one
// recomputing it.
func TestScoreByTier(t *testing.T) {
	in := &framework.Input{Request: framework.Request{PrefixHashes: make([]uint64, 10)}}
	cs := []framework.Candidate{
		{PrefixHitBlocks: 8},                    // engine: 8 free, 2 computed
		{PrefixHitBlocks: 0, HostHitBlocks: 8},  // host: 8 loaded, 2 computed
		{PrefixHitBlocks: 4, HostHitBlocks: 10}, // 4 free, 6 loaded
		{PrefixHitBlocks: 6, HostHitBlocks: 3},  // the host holds less than the engine
		{HostHitBlocks: 12},                     // clamped
		{},
	}
	for _, tc := range []struct {
		hostCost float64
		want     []float64
	}{
		{0.5, []float64{0.8, 1 - (8*0.5+2)/10, 1 - 6*0.5/10, 0.6, 0.5, 0}},
		{0, []float64{0.8, 1 - (8*DefaultHostCost+2)/10, 1 - 6*DefaultHostCost/10, 0.6, 1 - DefaultHostCost, 0}},
		{3, []float64{0.8, 0, 0.4, 0.6, 0, 0}}, // slower than computing counts as computing
	} {
		got := make([]float64, len(cs))
		(&Scorer{HostCost: tc.hostCost}).Score(in, cs, got)
		if diff := cmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
			t.Errorf("host cost %v: Score (-want +got):\n%s", tc.hostCost, diff)
		}
		if tc.hostCost < 1 && (got[0] <= got[1] || got[1] <= got[5]) {
			t.Errorf("host cost %v: engine %v, host %v, recompute %v: want engine > host > recompute", tc.hostCost, got[0], got[1], got[5])
		}
	}
}
