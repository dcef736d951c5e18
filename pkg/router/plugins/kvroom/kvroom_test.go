package kvroom

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestFilter(t *testing.T) {
	c := func(id string, free int) framework.Candidate {
		return framework.Candidate{Worker: framework.Worker{ID: id}, Load: framework.Load{KVBlocksFree: free}}
	}
	tests := []struct {
		name   string
		blocks int
		in     []framework.Candidate
		want   []string
	}{
		{"none", 4, nil, nil},
		{"all have room", 4, []framework.Candidate{c("a", 4), c("b", 9)}, []string{"a", "b"}},
		{"drops those without", 4, []framework.Candidate{c("a", 3), c("b", 4), c("c", -2), c("d", 5)}, []string{"b", "d"}},
		{"none has room: all pass, Reserve decides", 10, []framework.Candidate{c("a", 3), c("b", -1)}, []string{"a", "b"}},
		{"zero-block request", 0, []framework.Candidate{c("a", 0), c("b", -1)}, []string{"a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range (&Filter{}).Filter(&framework.Input{Blocks: tc.blocks}, tc.in) {
				got = append(got, c.Worker.ID)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Filter (-want +got):\n%s", diff)
			}
		})
	}
}
