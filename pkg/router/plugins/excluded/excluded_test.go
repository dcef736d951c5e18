package excluded

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestFilter(t *testing.T) {
	cs := func() []framework.Candidate {
		return []framework.Candidate{{Worker: framework.Worker{ID: "a"}}, {Worker: framework.Worker{ID: "b"}}, {Worker: framework.Worker{ID: "c"}}}
	}
	tests := []struct {
		name    string
		exclude map[string]bool
		want    []string
	}{
		{"nil exclude", nil, []string{"a", "b", "c"}},
		{"one", map[string]bool{"b": true}, []string{"a", "c"}},
		{"false entries do not exclude", map[string]bool{"a": false, "c": true}, []string{"a", "b"}},
		{"unknown ids", map[string]bool{"z": true}, []string{"a", "b", "c"}},
		{"all", map[string]bool{"a": true, "b": true, "c": true}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range (&Filter{}).Filter(&framework.Input{Exclude: tc.exclude}, cs()) {
				got = append(got, c.Worker.ID)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Filter (-want +got):\n%s", diff)
			}
		})
	}
}
