package decode

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/wire"
)

// omitResult is what a Generate call streamed, by choice, with the
// first_token_omitted marks.
type omitResult struct {
	tokens  map[int][]int32
	reasons map[int]string
	// marked counts the events that carry first_token_omitted;
	// markedFirst says the first event of choice 0 with tokens or a
	// finish did.
	marked      int
	markedFirst bool
}

func collectOmit(t *testing.T, stream interface {
	Recv() (*pdservev1.GenerateResponse, error)
}) omitResult {
	t.Helper()
	r := omitResult{tokens: map[int][]int32{}, reasons: map[int]string{}}
	seen0 := false
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return r
		}
		if err != nil {
			t.Fatal(err)
		}
		i := int(ev.GetIndex())
		if ev.GetFirstTokenOmitted() {
			r.marked++
			if i != 0 {
				t.Errorf("first_token_omitted on an event of choice %d", i)
			}
		}
		if i == 0 && !seen0 && (len(ev.GetTokens()) > 0 || wire.FromFinishReason(ev.GetFinish()) != "") {
			seen0, r.markedFirst = true, ev.GetFirstTokenOmitted()
		}
		r.tokens[i] = append(r.tokens[i], ev.GetTokens()...)
		if f := wire.FromFinishReason(ev.GetFinish()); f != "" {
			r.reasons[i] = f
		}
	}
}

// TestFirstTokenFromPrefill: with first_token_from_prefill the worker
// still continues from the prefill worker's first token but does not
// stream it: choice 0 starts at position 1, its first event says so, and
// its finish comes also when the first token ends it. Without the field
// (an old coordinator) position 0 is streamed and nothing is marked.
func TestFirstTokenFromPrefill(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	p := prompt(21, 11)
	want := reference(t, p, 6, engine.Sampling{})
	tests := []struct {
		name       string
		max        int
		n          int
		stop       []int32
		generated  []int32
		flag       bool
		want       []int32 // choice 0's stream
		wantReason string
		wantMarked bool
	}{
		{name: "omitted", max: 6, flag: true, want: want[1:], wantReason: FinishLength, wantMarked: true},
		{name: "without the field", max: 6, want: want, wantReason: FinishLength},
		{name: "one token", max: 1, flag: true, want: nil, wantReason: FinishLength, wantMarked: true},
		{name: "the first token stops", max: 6, flag: true, stop: want[:1], want: nil, wantReason: FinishStop, wantMarked: true},
		{name: "two choices", max: 6, n: 2, flag: true, want: want[1:], wantReason: FinishLength, wantMarked: true},
		{name: "recovery", max: 6, flag: true, generated: want[:2], want: want[2:], wantReason: FinishLength},
	}
	for k, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			id := fmt.Sprintf("r%d", k)
			n := max(tc.n, 1)
			if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + tc.max), Sequences: int32(n), PromptTokens: int32(len(p))}); err != nil {
				t.Fatal(err)
			}
			if first := pushKV(t, w.addr, id, p, 8); first != want[0] {
				t.Fatalf("first token %d, engine alone %d", first, want[0])
			}
			stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: int32(tc.max), IgnoreEos: true,
				N: int32(tc.n), StopTokens: tc.stop, GeneratedTokens: tc.generated, FirstTokenFromPrefill: tc.flag})
			if err != nil {
				t.Fatal(err)
			}
			got := collectOmit(t, stream)
			if diff := cmp.Diff(tc.want, got.tokens[0]); diff != "" {
				t.Errorf("choice 0's tokens (-want +got):\n%s", diff)
			}
			if got.reasons[0] != tc.wantReason {
				t.Errorf("choice 0's finish %q, want %q", got.reasons[0], tc.wantReason)
			}
			if got.markedFirst != tc.wantMarked || got.marked != map[bool]int{true: 1}[tc.wantMarked] {
				t.Errorf("first event of choice 0 marked %t, %d events marked; want marked %t, once", got.markedFirst, got.marked, tc.wantMarked)
			}
			for i := 1; i < n; i++ {
				// Greedy: every other choice is the whole continuation.
				if diff := cmp.Diff(want[:tc.max], got.tokens[i]); diff != "" {
					t.Errorf("choice %d's tokens (-want +got):\n%s", i, diff)
				}
			}
		})
	}
	poll.WaitFor(t, "blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == st.KVBlocksTotal && st.Requests == 0 })
}

// TestFirstTokenFromPrefillNeedsRemoteKV: the field with local_prefill
// (no prefill worker, no FirstToken) is refused.
func TestFirstTokenFromPrefillNeedsRemoteKV(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	stream, err := w.client.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: "l", PromptTokens: prompt(9, 1), MaxTokens: 3,
		LocalPrefill: true, FirstTokenFromPrefill: true})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Generate with first_token_from_prefill and local_prefill: %v, want InvalidArgument", err)
	}
}
