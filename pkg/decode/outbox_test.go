package decode

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Tokens a slow reader gets together keep the largest batch they were
// made in, and the next event reports its own steps' batches only: a
// request's first token made in a batch of 4 is not reported as made
// alone because the reader took it with the tokens of later, smaller
// steps (the coordinator's budget keeps the largest batch_size).
func TestOutboxBatchOfCoalescedTokens(t *testing.T) {
	o := newOutbox(1, 1<<20)
	type ev struct {
		Tokens []int32
		Batch  int32
	}
	take := func() []ev {
		t.Helper()
		out, _, err := o.take()
		if err != nil {
			t.Fatal(err)
		}
		var evs []ev
		for _, r := range out {
			evs = append(evs, ev{r.GetTokens(), r.GetBatchSize()})
		}
		return evs
	}
	for i, b := range []int{4, 4, 2, 1} {
		if !o.Token(0, int32(10+i), nil, b) {
			t.Fatal("outbox refused a token")
		}
	}
	if diff := cmp.Diff([]ev{{[]int32{10, 11, 12, 13}, 4}}, take()); diff != "" {
		t.Errorf("four steps' tokens taken together (-want +got):\n%s", diff)
	}
	o.Token(0, 14, nil, 1)
	if diff := cmp.Diff([]ev{{[]int32{14}, 1}}, take()); diff != "" {
		t.Errorf("the next step's token (-want +got):\n%s", diff)
	}
	o.finish("length", nil)
	if diff := cmp.Diff([]ev{{nil, 1}}, take()); diff != "" {
		t.Errorf("the finish (-want +got):\n%s", diff)
	}
}
