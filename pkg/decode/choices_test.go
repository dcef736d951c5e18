package decode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/wire"
)

// choicesResult is what a Generate call of several choices streamed.
type choicesResult struct {
	tokens  map[int][]int32
	lps     map[int][]engine.TokenLogprob
	reasons map[int]string
	prompt  []engine.TokenLogprob
}

func collectChoices(t *testing.T, stream interface {
	Recv() (*pdservev1.GenerateResponse, error)
}) choicesResult {
	t.Helper()
	r := choicesResult{tokens: map[int][]int32{}, lps: map[int][]engine.TokenLogprob{}, reasons: map[int]string{}}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return r
		}
		if err != nil {
			t.Fatal(err)
		}
		i := int(ev.GetIndex())
		if r.reasons[i] != "" && len(ev.GetTokens()) > 0 {
			t.Errorf("choice %d got tokens after its finish", i)
		}
		r.tokens[i] = append(r.tokens[i], ev.GetTokens()...)
		r.lps[i] = append(r.lps[i], wire.FromTokenLogprobs(ev.GetLogprobs())...)
		if f := wire.FromFinishReason(ev.GetFinish()); f != "" {
			r.reasons[i] = f
		}
		if pl := ev.GetPromptLogprobs(); len(pl) > 0 {
			if r.prompt != nil {
				t.Error("prompt logprobs sent twice")
			}
			r.prompt = wire.FromTokenLogprobs(pl)
		}
	}
}

// referenceRun generates like reference and also returns the
// log-probability of each token with top alternatives, from the engine's
// own logits. Penalties, when set in s, are counted here.
func referenceRun(t *testing.T, prompt []int32, maxTokens int, s engine.Sampling, top int) ([]int32, []engine.TokenLogprob) {
	t.Helper()
	e := newEngine(t)
	ctx := context.Background()
	if s.Penalties != nil {
		s.Penalties = &engine.Penalties{Presence: s.Penalties.Presence, Frequency: s.Penalties.Frequency}
	}
	out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: prompt, Sampling: s, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var toks []int32
	var lps []engine.TokenLogprob
	for {
		o := out[0]
		toks = append(toks, o.Token)
		lps = append(lps, engine.Logprob(o.Logits, o.Token, top))
		s.Penalties.Add(o.Token)
		if len(toks) == maxTokens {
			return toks, lps
		}
		if out, err = e.Decode(ctx, []engine.DecodeItem{{Seq: 1, Token: o.Token, Sampling: s}}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestChoicesShareThePrompt(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	p := prompt(19, 7)
	const n, max = 3, 7
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{
		RequestId: "r", PromptTokens: p, MaxTokens: max, LocalPrefill: true, IgnoreEos: true,
		Sampling: &pdservev1.Sampling{Temperature: 0.9, Seed: 42}, N: n,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := collectChoices(t, stream)
	distinct := map[string]bool{}
	for i := range n {
		// Choice i samples with seed 42+i from the one prompt's KV.
		want, _ := referenceRun(t, p, max, engine.Sampling{Temperature: 0.9, Seed: 42 + uint64(i)}, 0)
		if diff := cmp.Diff(want, got.tokens[i]); diff != "" {
			t.Errorf("choice %d (-engine alone with seed %d +worker):\n%s", i, 42+i, diff)
		}
		if got.reasons[i] != FinishLength {
			t.Errorf("choice %d finish %q, want length", i, got.reasons[i])
		}
		distinct[fmt.Sprint(got.tokens[i])] = true
	}
	if len(distinct) < 2 {
		t.Errorf("all %d sampled choices are equal: %v", n, got.tokens)
	}
	poll.WaitFor(t, "blocks free", func() bool {
		st := w.s.Stats()
		return st.KVBlocksFree == st.KVBlocksTotal && st.Requests == 0 && st.Running == 0
	})
}

func TestRemoteChoicesFork(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	p := prompt(21, 8)
	const n, max = 2, 6
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: int32(len(p) + max), Sequences: n, PromptTokens: int32(len(p))}); err != nil {
		t.Fatal(err)
	}
	pushKV(t, w.addr, "r", p, 8)
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "r", PromptTokens: p, MaxTokens: max, IgnoreEos: true, N: n})
	if err != nil {
		t.Fatal(err)
	}
	got := collectChoices(t, stream)
	// Greedy: every choice is the engine's one greedy continuation.
	want, _ := referenceRun(t, p, max, engine.Sampling{}, 0)
	for i := range n {
		w := want
		if i == 0 {
			w = want[1:] // position 0 is the prefill worker's to carry
		}
		if diff := cmp.Diff(w, got.tokens[i]); diff != "" {
			t.Errorf("choice %d (-engine alone +worker):\n%s", i, diff)
		}
	}
	poll.WaitFor(t, "blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == st.KVBlocksTotal && st.Requests == 0 })
}

func TestLogprobsAndPenalties(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	p := prompt(13, 9)
	const max, top = 8, 3
	for _, tc := range []struct {
		name     string
		sampling engine.Sampling
	}{
		{"greedy", engine.Sampling{}},
		{"sampled", engine.Sampling{Temperature: 0.7, TopP: 0.9, Seed: 5}},
		{"frequency penalty", engine.Sampling{Penalties: &engine.Penalties{Frequency: 2}}},
		{"presence penalty", engine.Sampling{Temperature: 0.5, Seed: 3, Penalties: &engine.Penalties{Presence: -1.5, Frequency: 0.5}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, wantLP := referenceRun(t, p, max, tc.sampling, top)
			stream, err := w.client.Generate(testCtx(t), &pdservev1.GenerateRequest{
				RequestId: tc.name, PromptTokens: p, MaxTokens: max, LocalPrefill: true, IgnoreEos: true,
				Sampling: wire.Sampling(tc.sampling), Logprobs: wire.Logprobs(top),
			})
			if err != nil {
				t.Fatal(err)
			}
			got := collectChoices(t, stream)
			if diff := cmp.Diff(want, got.tokens[0]); diff != "" {
				t.Errorf("tokens (-engine alone +worker):\n%s", diff)
			}
			if diff := cmp.Diff(wantLP, got.lps[0], cmpopts.EquateApprox(0, 1e-6)); diff != "" {
				t.Errorf("logprobs (-engine alone +worker):\n%s", diff)
			}
		})
	}
	t.Run("penalties change greedy output", func(t *testing.T) {
		plain, _ := referenceRun(t, p, 16, engine.Sampling{}, 0)
		pen, _ := referenceRun(t, p, 16, engine.Sampling{Penalties: &engine.Penalties{Frequency: 2, Presence: 2}}, 0)
		if cmp.Equal(plain, pen) {
			t.Fatalf("penalties left the greedy output %v as it was: the test checks nothing", plain)
		}
	})
}

func TestPromptLogprobs(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	p := prompt(20, 10) // 3 chunks of 8: rows cross chunk boundaries
	const top = 2
	stream, err := w.client.Generate(testCtx(t), &pdservev1.GenerateRequest{
		RequestId: "echo", PromptTokens: p, MaxTokens: 1, LocalPrefill: true, IgnoreEos: true,
		PromptLogprobs: wire.Logprobs(top),
	})
	if err != nil {
		t.Fatal(err)
	}
	got := collectChoices(t, stream)
	// The log-probability of prompt token k is that of the engine's
	// distribution after a prefill of the first k tokens.
	e := newEngine(t)
	var want []engine.TokenLogprob
	for k := 1; k < len(p); k++ {
		out, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: engine.SeqID(k), Tokens: p[:k], Last: true}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, engine.Logprob(out[0].Logits, p[k], top))
		e.Free(engine.SeqID(k))
	}
	if diff := cmp.Diff(want, got.prompt, cmpopts.EquateApprox(0, 1e-4)); diff != "" {
		t.Errorf("prompt logprobs (-prefix prefills +worker):\n%s", diff)
	}
	if len(got.tokens[0]) != 1 {
		t.Errorf("got %d tokens, want 1", len(got.tokens[0]))
	}
}

func TestChoicesValidation(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	p := prompt(5, 1)
	for _, tc := range []struct {
		name string
		req  *pdservev1.GenerateRequest
	}{
		{"n over the batch", &pdservev1.GenerateRequest{RequestId: "a", PromptTokens: p, MaxTokens: 2, LocalPrefill: true, N: 9}},
		{"generated choices of the wrong count", &pdservev1.GenerateRequest{RequestId: "b", PromptTokens: p, MaxTokens: 4, LocalPrefill: true, N: 3,
			GeneratedChoices: []*pdservev1.Generated{{Tokens: []int32{1}}}}},
		{"prompt logprobs with remote kv", &pdservev1.GenerateRequest{RequestId: "c", PromptTokens: p, MaxTokens: 2, PromptLogprobs: wire.Logprobs(1)}},
		{"too many alternatives", &pdservev1.GenerateRequest{RequestId: "d", PromptTokens: p, MaxTokens: 2, LocalPrefill: true, Logprobs: wire.Logprobs(21)}},
		{"penalty out of range", &pdservev1.GenerateRequest{RequestId: "e", PromptTokens: p, MaxTokens: 2, LocalPrefill: true, Sampling: &pdservev1.Sampling{PresencePenalty: 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := w.client.Generate(ctx, tc.req)
			if err == nil {
				_, err = stream.Recv()
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("err %v, want InvalidArgument", err)
			}
		})
	}
}

// With remote KV the first token and its log-probability came with the
// commit and are not streamed (the prefill worker carries them to the
// caller); the rest are the worker's own.
func TestRemoteLogprobs(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	p := prompt(10, 2)
	const max, top = 4, 2
	want, wantLP := referenceRun(t, p, max, engine.Sampling{}, top)
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: int32(len(p) + max)}); err != nil {
		t.Fatal(err)
	}
	pushKVLogprob(t, w.addr, "r", p, 8, wire.TokenLogprob(wantLP[0]))
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "r", PromptTokens: p, MaxTokens: max, IgnoreEos: true, Logprobs: wire.Logprobs(top)})
	if err != nil {
		t.Fatal(err)
	}
	got := collectChoices(t, stream)
	if diff := cmp.Diff(want[1:], got.tokens[0]); diff != "" {
		t.Errorf("tokens (-engine alone +worker):\n%s", diff)
	}
	if diff := cmp.Diff(wantLP[1:], got.lps[0], cmpopts.EquateApprox(0, 1e-6)); diff != "" {
		t.Errorf("logprobs (-engine alone +worker):\n%s", diff)
	}
}
