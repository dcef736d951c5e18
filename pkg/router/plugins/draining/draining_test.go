package draining

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestFilter(t *testing.T) {
	tests := []struct {
		name string
		in   []framework.Candidate
		want []string
	}{
		{"none", nil, nil},
		{"keeps order", []framework.Candidate{{Worker: framework.Worker{ID: "b"}}, {Worker: framework.Worker{ID: "a"}}}, []string{"b", "a"}},
		{"drops draining", []framework.Candidate{{Worker: framework.Worker{ID: "a", Draining: true}}, {Worker: framework.Worker{ID: "b"}}}, []string{"b"}},
		{"all draining", []framework.Candidate{{Worker: framework.Worker{ID: "a", Draining: true}}}, nil},
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
