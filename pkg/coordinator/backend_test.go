package coordinator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/wire"
)

// decodeUntilEOG is a decode worker that generates scripted after
// generated_tokens and, without ignore_eos, ends with "stop" at the first
// id of eog (streamed as the last token), as a real worker does; with
// remote KV and none generated it does not stream the first token (the
// prefill worker's FirstToken), but ends on it all the same. split
// sends each token in an event of its own and the finish in another, as a
// worker's outbox may.
func decodeUntilEOG(split bool, eog ...int32) func(context.Context, *pdservev1.GenerateRequest, func(*pdservev1.GenerateResponse) error) error {
	return func(_ context.Context, req *pdservev1.GenerateRequest, send func(*pdservev1.GenerateResponse) error) error {
		out, finish := scripted[len(req.GetGeneratedTokens()):], "length"
		if !req.GetIgnoreEos() {
			for i, t := range out {
				if eogSet(eog)[t] {
					out, finish = out[:i+1], "stop"
					break
				}
			}
		}
		if len(req.GetGeneratedTokens()) == 0 && !req.GetLocalPrefill() {
			out = out[1:]
		}
		if !split {
			return send(&pdservev1.GenerateResponse{Tokens: out, Finish: wire.FinishReason(finish)})
		}
		for i := range out {
			if err := send(&pdservev1.GenerateResponse{Tokens: out[i : i+1]}); err != nil {
				return err
			}
		}
		return send(&pdservev1.GenerateResponse{Finish: wire.FinishReason(finish)})
	}
}

// Every end-of-generation id of the model ends a request as EOS does:
// the client never sees the ending token, the prefill worker's first token
// is not sent ahead when it is one, and ignore_eos generates past them.
func TestEOGEndsRequests(t *testing.T) {
	tests := []struct {
		name       string
		eog        []int32 // the coordinator's end-of-generation ids
		workerEOG  []int32 // the decode worker's (nil: the same)
		policy     string
		ignoreEOS  bool
		split      bool
		want       []int32
		wantFinish string
	}{
		{name: "extra eog mid-output", eog: []int32{-1, 99, 9}, want: []int32{7, 8}, wantFinish: "stop"},
		{name: "eog in an event of its own, finish in the next", eog: []int32{9}, split: true, want: []int32{7, 8}, wantFinish: "stop"},
		{name: "first token is an eog", eog: []int32{7}, want: []int32{}, wantFinish: "stop"},
		{name: "first token is an eog, finish apart", eog: []int32{7}, split: true, want: []int32{}, wantFinish: "stop"},
		{name: "first token is an eog, policy decode", eog: []int32{7}, policy: PolicyDecode, want: []int32{}, wantFinish: "stop"},
		{name: "ignore_eos", eog: []int32{7, 9}, ignoreEOS: true, split: true, want: scripted, wantFinish: "length"},
		{name: "no eog in the output", eog: []int32{257}, want: scripted, wantFinish: "length"},
		// A worker that does not end on an id the coordinator takes for
		// one: the id is output like any other, nothing is lost.
		{name: "worker goes on past it", eog: []int32{9}, workerEOG: []int32{}, split: true, want: scripted, wantFinish: "length"},
		{name: "worker goes on past a first token", eog: []int32{7}, workerEOG: []int32{}, split: true, want: scripted, wantFinish: "length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			workerEOG := tc.workerEOG
			if workerEOG == nil {
				workerEOG = tc.eog
			}
			pre := &fakePrefill{prefill: func(_ int, _ *pdservev1.PrefillRequest, send func(*pdservev1.PrefillResponse) error) error {
				return prefilled(send) // first token scripted[0]
			}}
			tb := newTestBackend(t, pre, &fakeDecode{generate: decodeUntilEOG(tc.split, workerEOG...)})
			tb.b.eog = eogSet(tc.eog)
			if tc.policy != "" {
				tb.b.policy = tc.policy
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			tr := &budget.Trace{RequestID: "req-1", Arrival: time.Now(), PromptTokens: 3}
			req := &frontend.Request{ID: "req-1", Prompt: []int32{1, 2, 3}, MaxTokens: len(scripted), IgnoreEOS: tc.ignoreEOS, Trace: tr, N: 1, Logprobs: -1, PromptLogprobs: -1}
			got := []int32{}
			finishes, err := tb.b.Complete(ctx, req, func(o frontend.Output) error {
				toks := o.Tokens
				if len(toks) == 0 {
					t.Error("emit called without tokens")
				}
				got = append(got, toks...)
				return nil
			})
			if err != nil {
				t.Fatalf("request failed: %v", err)
			}
			finish := strings.Join(finishes, ",")
			if diff := cmp.Diff(tc.want, got); diff != "" || finish != tc.wantFinish {
				t.Errorf("finish %q, want %q; tokens (-want +got):\n%s", finish, tc.wantFinish, diff)
			}
		})
	}
}

func TestEOGSet(t *testing.T) {
	want := map[int32]bool{0: true, 2: true, 257: true}
	if diff := cmp.Diff(want, eogSet([]int32{257, -1, 2, 0, 2})); diff != "" {
		t.Errorf("eogSet (-want +got):\n%s", diff)
	}
}
