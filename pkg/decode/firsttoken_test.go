package decode

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/wire"
)

// firstResult is what a Generate call streamed, by choice.
type firstResult struct {
	tokens  map[int][]int32
	reasons map[int]string
}

func collectFirst(t *testing.T, stream interface {
	Recv() (*pdservev1.GenerateResponse, error)
}) firstResult {
	t.Helper()
	r := firstResult{tokens: map[int][]int32{}, reasons: map[int]string{}}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return r
		}
		if err != nil {
			t.Fatal(err)
		}
		i := int(ev.GetIndex())
		r.tokens[i] = append(r.tokens[i], ev.GetTokens()...)
		if f := wire.FromFinishReason(ev.GetFinish()); f != "" {
			r.reasons[i] = f
		}
	}
}

// TestFirstTokenNotStreamed: with remote KV the worker continues from
// the prefill worker's first token (the KV commit's) but never streams
// it, since the prefill worker carried it to the caller: choice 0 starts
// at position 1, and its finish comes also when the first token ends
// it. The deprecated first_token_from_prefill, which a coordinator sets
// for workers of the previous release, changes nothing; a recovery
// streams after generated_tokens.
func TestFirstTokenNotStreamed(t *testing.T) {
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
	}{
		{name: "remote", max: 6, want: want[1:], wantReason: FinishLength},
		{name: "with the old field", max: 6, flag: true, want: want[1:], wantReason: FinishLength},
		{name: "one token", max: 1, want: nil, wantReason: FinishLength},
		{name: "the first token stops", max: 6, stop: want[:1], want: nil, wantReason: FinishStop},
		{name: "two choices", max: 6, n: 2, want: want[1:], wantReason: FinishLength},
		{name: "recovery", max: 6, generated: want[:2], want: want[2:], wantReason: FinishLength},
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
			got := collectFirst(t, stream)
			if diff := cmp.Diff(tc.want, got.tokens[0]); diff != "" {
				t.Errorf("choice 0's tokens (-want +got):\n%s", diff)
			}
			if got.reasons[0] != tc.wantReason {
				t.Errorf("choice 0's finish %q, want %q", got.reasons[0], tc.wantReason)
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

// TestLocalPrefillStreamsFirstToken: with local_prefill no prefill
// worker carries the first token, so the worker streams it, whatever the
// deprecated first_token_from_prefill says (a worker of the previous
// release refused that pair).
func TestLocalPrefillStreamsFirstToken(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	p := prompt(9, 1)
	want := reference(t, p, 3, engine.Sampling{})
	stream, err := w.client.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: "l", PromptTokens: p, MaxTokens: 3, IgnoreEos: true,
		LocalPrefill: true, FirstTokenFromPrefill: true})
	if err != nil {
		t.Fatal(err)
	}
	got := collectFirst(t, stream)
	if diff := cmp.Diff(want, got.tokens[0]); diff != "" {
		t.Errorf("tokens (-want +got):\n%s", diff)
	}
	poll.WaitFor(t, "blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == st.KVBlocksTotal && st.Requests == 0 })
}
