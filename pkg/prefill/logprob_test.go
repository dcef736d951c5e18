package prefill

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/wire"
)

// The first token's log-probability goes to the coordinator (FirstToken)
// and with the KV to the decode worker (the commit), also on a Resend.
func TestFirstTokenLogprob(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	w := newWorker(t, smallOptions(), true)
	p := prompt(11, 3)
	const top = 4
	e := newEngine(t)
	out, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := engine.Logprob(out[0].Logits, out[0].Token, top)

	for _, tc := range []struct {
		name string
		lp   *pdservev1.Logprobs
	}{{"asked", wire.Logprobs(top)}, {"not asked", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := w.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: tc.name, PromptTokens: p, DecodeAddr: addr, Logprobs: tc.lp})
			if err != nil {
				t.Fatal(err)
			}
			ev, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := f.get(tc.name)
			if tc.lp == nil {
				if ev.first.GetLogprob() != nil || got.firstLP != nil {
					t.Fatalf("logprob sent unasked: %v, %v", ev.first.GetLogprob(), got.firstLP)
				}
				return
			}
			for where, m := range map[string]*pdservev1.TokenLogprob{"FirstToken": ev.first.GetLogprob(), "commit": got.firstLP} {
				if diff := cmp.Diff(want, wire.FromTokenLogprob(m), cmpopts.EquateApprox(0, 1e-6)); diff != "" || m == nil {
					t.Errorf("%s logprob (-engine +worker):\n%s", where, diff)
				}
			}
			if _, err := w.client.Resend(testCtx(t), &pdservev1.ResendRequest{RequestId: tc.name, DecodeAddr: addr}); err != nil {
				t.Fatal(err)
			}
			if again, _ := f.get(tc.name); again.firstLP == nil || again.firstLP.GetLogprob() != got.firstLP.GetLogprob() {
				t.Errorf("resent commit logprob %v, want %v", again.firstLP, got.firstLP)
			}
		})
	}
}
