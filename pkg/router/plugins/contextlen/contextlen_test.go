package contextlen

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

func TestFilter(t *testing.T) {
	cs := func() []framework.Candidate {
		return []framework.Candidate{
			{Worker: framework.Worker{ID: "unknown"}},
			{Worker: framework.Worker{ID: "tiny", MaxSeqLen: 1}},
			{Worker: framework.Worker{ID: "mid", MaxSeqLen: 2048}},
			{Worker: framework.Worker{ID: "big", MaxSeqLen: 8192}},
		}
	}
	tests := []struct {
		seq  int
		want []string
	}{
		{0, []string{"unknown", "tiny", "mid", "big"}},
		{1, []string{"unknown", "tiny", "mid", "big"}},
		{2, []string{"unknown", "mid", "big"}},
		{2048, []string{"unknown", "mid", "big"}},
		{2049, []string{"unknown", "big"}},
		{9000, []string{"unknown"}},
	}
	for _, tc := range tests {
		var got []string
		for _, c := range (&Filter{}).Filter(&framework.Input{Request: framework.Request{SeqTokens: tc.seq}}, cs()) {
			got = append(got, c.Worker.ID)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("SeqTokens %d (-want +got):\n%s", tc.seq, diff)
		}
	}
}
