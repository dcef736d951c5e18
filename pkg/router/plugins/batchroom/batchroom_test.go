package batchroom

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestFilter(t *testing.T) {
	c := func(id string, batch, maxBatch int) framework.Candidate {
		return framework.Candidate{Worker: framework.Worker{ID: id, MaxBatch: maxBatch}, Load: framework.Load{RunningBatch: batch}}
	}
	tests := []struct {
		name string
		in   []framework.Candidate
		want []string
	}{
		{"none", nil, nil},
		{"all have room", []framework.Candidate{c("a", 3, 4), c("b", 0, 4)}, []string{"a", "b"}},
		{"drops the full ones", []framework.Candidate{c("a", 4, 4), c("b", 1, 4), c("c", 9, 4), c("d", 7, 8)}, []string{"b", "d"}},
		{"unknown limit has room", []framework.Candidate{c("a", 64, 0), c("b", 2, 2)}, []string{"a"}},
		{"all full: all pass", []framework.Candidate{c("a", 4, 4), c("b", 5, 2)}, []string{"a", "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range (&Filter{}).Filter(&framework.Input{}, tc.in) {
				got = append(got, c.Worker.ID)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Filter (-want +got):\n%s", diff)
			}
		})
	}
}
