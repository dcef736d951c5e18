package queuelimit

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestFilter(t *testing.T) {
	cs := func() []framework.Candidate {
		var out []framework.Candidate
		for _, q := range []struct {
			id string
			q  int
		}{{"a", 0}, {"b", 999}, {"c", 1000}, {"d", 5000}} {
			out = append(out, framework.Candidate{Worker: framework.Worker{ID: q.id}, Load: framework.Load{QueuedPrefillTokens: q.q}})
		}
		return out
	}
	tests := []struct {
		max  int
		want []string
	}{
		{0, []string{"a", "b", "c", "d"}},
		{-1, []string{"a", "b", "c", "d"}},
		{1000, []string{"a", "b"}},
		{1, []string{"a"}},
		{10000, []string{"a", "b", "c", "d"}},
	}
	for _, tc := range tests {
		var got []string
		for _, c := range (&Filter{Max: tc.max}).Filter(&framework.Input{}, cs()) {
			got = append(got, c.Worker.ID)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Max %d (-want +got):\n%s", tc.max, diff)
		}
	}
}
