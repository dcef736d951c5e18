package batch

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestChunkSizes(t *testing.T) {
	tests := []struct {
		name          string
		decodes       int
		pending       []int
		budget, chunk int
		want          []int
	}{
		{"decode only", 3, nil, 16, 8, []int{}},
		{"chunk caps", 0, []int{20}, 64, 8, []int{8}},
		{"budget shared in order", 2, []int{10, 10, 10}, 16, 8, []int{8, 6, 0}},
		{"short tail", 1, []int{3, 20}, 16, 8, []int{3, 8}},
		{"decodes eat the budget", 16, []int{5}, 16, 8, []int{0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := chunkSizes(tc.decodes, tc.pending, tc.budget, tc.chunk)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("chunkSizes (-want +got):\n%s", diff)
			}
		})
	}
}
