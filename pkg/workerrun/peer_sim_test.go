package workerrun

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/enginecfg"
)

// TestPeerPullSimScaledPayload: a prefill worker on the sim engine, whose
// KV payload is scaled down, pulls a prompt's prefix from another sim
// prefill worker's cache (PrefillRequest.peer): the pull is counted as
// the prompt's peer hit and the tokens are the engine's alone. Before
// PullRequest.TokenBytes every such pull failed its check against the
// model's true token size and the prefix was computed.
func TestPeerPullSimScaledPayload(t *testing.T) {
	url := startNATS(t)
	eo := enginecfg.Options{Engine: enginecfg.Sim, Profile: "h100/llama-3-8b/tp1", TimeScale: 0.001, PayloadScale: 1.0 / 1024, Seed: 3}
	var ws []*Worker
	for _, role := range []control.Role{control.RolePrefill, control.RolePrefill, control.RoleDecode} {
		o := testOptions(role, url)
		o.Engine = eo
		o.Prefill.PrefixCache.MaxTokens = 4096
		ws = append(ws, startWorker(t, o))
	}
	holder, puller, dw := ws[0], ws[1], ws[2]
	alone, err := enginebuild.Build(eo)
	if err != nil {
		t.Fatal(err)
	}
	p := prompt(80, 2)
	want := referenceOn(t, alone, p, 4)
	dc := pdservev1.NewDecodeServiceClient(dial(t, dw))
	run := func(id string, w *Worker, peer *pdservev1.PeerPrefix) *pdservev1.FirstToken {
		t.Helper()
		ctx := testCtx(t)
		if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + 4)}); err != nil {
			t.Fatal(err)
		}
		gen, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: 4, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		pre, err := pdservev1.NewPrefillServiceClient(dial(t, w)).Prefill(ctx, &pdservev1.PrefillRequest{
			RequestId: id, PromptTokens: p, DecodeAddr: dw.Addr(), Codec: "none", Peer: peer})
		if err != nil {
			t.Fatal(err)
		}
		first, _, err := readPrefill(pre)
		if err != nil {
			t.Fatalf("prefill %s: %v", id, err)
		}
		res, err := readGenerate(gen, 0)
		if err != nil {
			t.Fatalf("generate %s: %v", id, err)
		}
		// The decode stream starts after the prefill worker's first token.
		if diff := cmp.Diff(want, append([]int32{first.GetToken()}, res.tokens...)); diff != "" {
			t.Errorf("%s: tokens (-sim engine alone +disaggregated):\n%s", id, diff)
		}
		return first
	}
	run("cold", holder, nil)
	first := run("pulled", puller, &pdservev1.PeerPrefix{Addr: holder.Addr(), Id: holder.ID(), Role: string(control.RolePrefill), Tokens: 64})
	if first.GetHit().GetPeerTokens() != 64 || first.GetHit().GetTokens() != 64 {
		t.Errorf("pulled: first token %+v, want 64 peer hit tokens, all of the prefix hit", first)
	}
	// The decode worker offers the router a pull cost once it measured a
	// local prefill of its own (none before).
	if c := dw.heartbeat().PeerPullCost; c != 0 {
		t.Errorf("decode heartbeat's peer_pull_cost before a local prefill: %v, want 0", c)
	}
	ctx := testCtx(t)
	if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "local", Tokens: int32(len(p) + 4)}); err != nil {
		t.Fatal(err)
	}
	gen, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "local", PromptTokens: prompt(80, 7), MaxTokens: 4, IgnoreEos: true, LocalPrefill: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readGenerate(gen, 0); err != nil {
		t.Fatal(err)
	}
	if c := dw.heartbeat().PeerPullCost; !(c > 0) {
		t.Errorf("decode heartbeat's peer_pull_cost after a local prefill: %v, want > 0", c)
	}
}
