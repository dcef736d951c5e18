package prefixoverlap

import (
	"math"
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

// TestScoreDiskTier: blocks on the disk tier beyond the engine's and the
// host's cost DiskCost each, so that a worker holding a prefix in engine
// memory beats one holding it in host memory, which beats one holding it
// on disk, which beats one recomputing it.
func TestScoreDiskTier(t *testing.T) {
	in := &framework.Input{Request: framework.Request{PrefixHashes: make([]uint64, 10)}}
	cs := []framework.Candidate{
		{PrefixHitBlocks: 10}, // engine
		{HostHitBlocks: 10},   // host
		{DiskHitBlocks: 10},   // disk
		{},                    // recompute
		{PrefixHitBlocks: 2, HostHitBlocks: 5, DiskHitBlocks: 9}, // 2 free, 3 loaded, 4 read, 1 computed
		{PrefixHitBlocks: 6, HostHitBlocks: 4, DiskHitBlocks: 5}, // the lower tiers hold less than the engine
		{HostHitBlocks: 3, DiskHitBlocks: 12},                    // clamped
	}
	for _, tc := range []struct {
		name               string
		hostCost, diskCost float64
		want               []float64
	}{
		{"set", 0.1, 0.5, []float64{1, 0.9, 0.5, 0, 1 - (3*0.1+4*0.5+1)/10, 0.6, 1 - (3*0.1+7*0.5)/10}},
		{"defaults", 0, 0, []float64{1, 1 - DefaultHostCost, 1 - DefaultDiskCost, 0,
			1 - (3*DefaultHostCost+4*DefaultDiskCost+1)/10, 0.6, 1 - (3*DefaultHostCost+7*DefaultDiskCost)/10}},
		{"disk below host counts as host", 0.2, 0.1, []float64{1, 0.8, 0.8, 0, 1 - (3*0.2+4*0.2+1)/10, 0.6, 0.8}},
		{"slower than computing counts as computing", 0.1, 3, []float64{1, 0.9, 0, 0, 1 - (3*0.1+5)/10, 0.6, 1 - (3*0.1+7)/10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make([]float64, len(cs))
			(&Scorer{HostCost: tc.hostCost, DiskCost: tc.diskCost}).Score(in, cs, got)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("Score (-want +got):\n%s", diff)
			}
		})
	}
	// The defaults order the tiers strictly.
	got := make([]float64, len(cs))
	(&Scorer{}).Score(in, cs, got)
	if !(got[0] > got[1] && got[1] > got[2] && got[2] > got[3]) {
		t.Errorf("default costs: engine %v, host %v, disk %v, recompute %v: want engine > host > disk > recompute", got[0], got[1], got[2], got[3])
	}
}

func TestScorePeerPull(t *testing.T) {
	in := &framework.Input{Request: framework.Request{PrefixHashes: make([]uint64, 10)}}
	pulls := func(cost float64) framework.Worker { return framework.Worker{PeerPullCost: cost} }
	cs := []framework.Candidate{
		{Worker: pulls(0.2), PeerHitBlocks: 10},                    // pulls all 10
		{Worker: pulls(0.2), PrefixHitBlocks: 4, PeerHitBlocks: 8}, // pulls 8 (4 held, brought again), computes 2
		{Worker: pulls(0.2), PrefixHitBlocks: 8, PeerHitBlocks: 9}, // own engine 8 + 2 computed beats 9 pulled + 1
		{Worker: pulls(0), PeerHitBlocks: 10},                      // does not pull
		{Worker: pulls(0.2), HostHitBlocks: 10, PeerHitBlocks: 10}, // own host tier beats the pull
		{Worker: pulls(3), PeerHitBlocks: 10},                      // a pull slower than computing counts as computing
		{Worker: pulls(0.2), PeerHitBlocks: 12},                    // clamped
	}
	wantCost := []float64{2, 8*0.2 + 2, 2, 10, 10 * DefaultHostCost, 10, 2}
	wantServed := []int{10, 8, 8, 0, 10, 0, 10}
	got := make([]float64, len(cs))
	s := &Scorer{}
	s.Score(in, cs, got)
	for i, c := range cs {
		cost, served := s.Serve(c, 10)
		if math.Abs(cost-wantCost[i]) > 1e-12 || served != wantServed[i] {
			t.Errorf("candidate %d: Serve = %v, %d blocks; want %v, %d", i, cost, served, wantCost[i], wantServed[i])
		}
		if want := max(1-wantCost[i]/10, 0); math.Abs(got[i]-want) > 1e-12 {
			t.Errorf("candidate %d: score %v, want %v", i, got[i], want)
		}
	}
	if !(got[4] > got[0] && got[0] > got[3]) {
		t.Errorf("host tier %v, pull %v, recompute %v: want host > pull > recompute", got[4], got[0], got[3])
	}
}
