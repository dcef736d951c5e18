package modelmatch

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestFilter(t *testing.T) {
	cs := func() []framework.Candidate {
		return []framework.Candidate{
			{Worker: framework.Worker{ID: "any"}},
			{Worker: framework.Worker{ID: "a", Model: "alpha"}},
			{Worker: framework.Worker{ID: "b", Model: "beta"}},
		}
	}
	tests := []struct {
		model string
		want  []string
	}{
		{"", []string{"any", "a", "b"}},
		{"alpha", []string{"any", "a"}},
		{"beta", []string{"any", "b"}},
		{"gamma", []string{"any"}},
	}
	for _, tc := range tests {
		t.Run(tc.model, func(t *testing.T) {
			var got []string
			for _, c := range (&Filter{}).Filter(&framework.Input{Request: framework.Request{Model: tc.model}}, cs()) {
				got = append(got, c.Worker.ID)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Filter (-want +got):\n%s", diff)
			}
		})
	}
}
