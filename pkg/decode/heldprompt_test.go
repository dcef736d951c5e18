package decode

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/engine"
)

// TestReservedPrompt: a reservation shown the prompt keeps it
// (prompt_held), so the Generate call may omit it, remote KV or local
// prefill; one that carries a different prompt is refused, and without
// a held prompt an empty one still is.
func TestReservedPrompt(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	p := prompt(21, 12)
	other := prompt(21, 13)
	want := reference(t, p, 5, engine.Sampling{})
	reserve := func(t *testing.T, id string, shown []int32) bool {
		t.Helper()
		res, err := w.client.Reserve(testCtx(t), &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + 5), Prompt: shown})
		if err != nil {
			t.Fatal(err)
		}
		return res.GetPromptHeld()
	}
	generate := func(t *testing.T, req *pdservev1.GenerateRequest) (result, error) {
		t.Helper()
		req.MaxTokens, req.IgnoreEos = 5, true
		stream, err := w.client.Generate(testCtx(t), req)
		if err != nil {
			return result{}, err
		}
		return collect(stream)
	}
	t.Run("remote KV", func(t *testing.T) {
		if !reserve(t, "remote", p) {
			t.Fatal("Reserve shown the prompt: prompt_held false")
		}
		pushKV(t, w.addr, "remote", p, 8)
		got, err := generate(t, &pdservev1.GenerateRequest{RequestId: "remote"})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want[1:], got.tokens); diff != "" {
			t.Errorf("tokens (-engine alone +worker):\n%s", diff)
		}
	})
	t.Run("local prefill", func(t *testing.T) {
		reserve(t, "local", p)
		got, err := generate(t, &pdservev1.GenerateRequest{RequestId: "local", LocalPrefill: true})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got.tokens); diff != "" {
			t.Errorf("tokens (-engine alone +worker):\n%s", diff)
		}
	})
	t.Run("both, the same", func(t *testing.T) {
		reserve(t, "same", p)
		got, err := generate(t, &pdservev1.GenerateRequest{RequestId: "same", PromptTokens: p, LocalPrefill: true})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got.tokens); diff != "" {
			t.Errorf("tokens (-engine alone +worker):\n%s", diff)
		}
	})
	t.Run("both, different", func(t *testing.T) {
		reserve(t, "differ", p)
		_, err := generate(t, &pdservev1.GenerateRequest{RequestId: "differ", PromptTokens: other, LocalPrefill: true})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("Generate with another prompt than the reserved one: %v, want InvalidArgument", err)
		}
		w.client.Cancel(testCtx(t), &pdservev1.CancelRequest{RequestId: "differ"})
	})
	t.Run("not shown", func(t *testing.T) {
		if reserve(t, "unshown", nil) {
			t.Fatal("Reserve not shown the prompt: prompt_held true")
		}
		_, err := generate(t, &pdservev1.GenerateRequest{RequestId: "unshown", LocalPrefill: true})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("Generate without a prompt, none held: %v, want InvalidArgument", err)
		}
		w.client.Cancel(testCtx(t), &pdservev1.CancelRequest{RequestId: "unshown"})
	})
	poll.WaitFor(t, "blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == st.KVBlocksTotal && st.Requests == 0 })
}
