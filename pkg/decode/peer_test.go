package decode

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/internal/workertest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefill"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// holder is a prefill worker whose prefix cache holds prompts for decode
// workers to pull, and the decode worker its prompts' KV goes to.
type holder struct {
	s      *prefill.Server
	addr   string
	client pdservev1.PrefillServiceClient
	sink   *testWorker
}

// newHolder starts a prefill worker with a prefix cache on eng, sending
// its KV to a decode worker on sinkEng.
func newHolder(t testing.TB, eng, sinkEng engine.Engine) *holder {
	t.Helper()
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	t.Cleanup(func() { _ = d.Close() }) // after the Server stopped
	o := prefill.DefaultOptions()
	o.ChunkTokens, o.MaxBatchTokens = 16, 64
	o.PrefixCache = prefixcache.Options{MaxTokens: 1 << 12, MaxEntries: 4, BlockTokens: 16}
	s, err := prefill.New(eng, d, o, zaptest.NewLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	sv := workertest.Serve(t, workertest.Server{Register: s.Register, Run: s.Run, Stop: s.Stop}, true)
	sink := smallOptions()
	sink.PrefixCache.MaxTokens = 0
	return &holder{s: s, addr: sv.Addr, client: pdservev1.NewPrefillServiceClient(sv.Conn), sink: newWorkerOn(t, sinkEng, sink, true)}
}

// hold prefills p on the holder, its KV sent to the sink, which
// generates one token: the holder's prefix cache then holds p's blocks.
func (h *holder) hold(t testing.TB, id string, p []int32) {
	t.Helper()
	ctx := testCtx(t)
	if _, err := h.sink.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + 1)}); err != nil {
		t.Fatal(err)
	}
	stream, err := h.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: id, PromptTokens: p, DecodeAddr: h.sink.addr})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("prefill %s on the holder: %v", id, err)
		}
	}
	gs, err := h.sink.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: 1, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(gs); err != nil {
		t.Fatalf("generate %s on the sink: %v", id, err)
	}
}

// peer names the holder as holding tokens of a prompt.
func (h *holder) peer(tokens int) *pdservev1.PeerPrefix {
	return &pdservev1.PeerPrefix{Addr: h.addr, Id: "holder", Role: "prefill", Tokens: int32(tokens)}
}

// newPuller starts a decode worker on eng with a prefix cache and a
// dialer to pull prefixes with; always makes every pull worth it.
func newPuller(t testing.TB, eng engine.Engine, o Options, always bool) *testWorker {
	t.Helper()
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	t.Cleanup(func() { _ = d.Close() }) // after the Server stopped
	return newWorkerOn(t, eng, o, true, func(s *Server) {
		WithDialer(d)(s)
		s.peers.Always = always
	})
}

// hits is what a local prefill's first event reports of its prefix.
type hits struct {
	prefix, peer int32
	peerLoad     int64
}

// generatePeer runs one local-prefill Generate call naming peer and
// returns its tokens and prefix hits.
func generatePeer(t testing.TB, w *testWorker, id string, p []int32, maxTokens int, peer *pdservev1.PeerPrefix) ([]int32, hits) {
	t.Helper()
	stream, err := w.client.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: int32(maxTokens),
		LocalPrefill: true, IgnoreEos: true, Peer: peer})
	if err != nil {
		t.Fatal(err)
	}
	var toks []int32
	var h hits
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return toks, h
		}
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		toks = append(toks, ev.GetTokens()...)
		if ev.GetHit().GetTokens() > 0 {
			h = hits{prefix: ev.GetHit().GetTokens(), peer: ev.GetHit().GetPeerTokens(), peerLoad: ev.GetHit().GetPeerLoadNanos()}
		}
	}
}

// pullBitExact: decode workers whose caches lack a prefix that a peer
// prefill worker holds pull it for their local prefills, block-aligned or
// not: the tokens are cold's (the run without any cache), the pulled
// blocks are the prefix hit and the peer hit, and the prompt is the
// puller's own afterwards. Each case starts from a new puller.
func pullBitExact(t *testing.T, newEng func() engine.Engine, o Options, cold func(p []int32, maxTokens int) []int32, cases []struct{ n, shared int }) {
	h := newHolder(t, newEng(), newEng())
	base := prompt(70, 3)
	h.hold(t, "base", base)
	for i, tc := range cases {
		p := sharing(base, tc.n, tc.shared, int32(i+5))
		// The holder has 4 blocks of base; a hit leaves a token to compute.
		want := 16 * min(tc.shared/16, (tc.n-1)/16, 4)
		id := fmt.Sprintf("p%d-%d-%d", i, tc.n, tc.shared)
		w := newPuller(t, newEng(), o, true)
		wantToks := cold(p, 6)
		toks, got := generatePeer(t, w, id, p, 6, h.peer(64))
		if diff := cmp.Diff(wantToks, toks); diff != "" {
			t.Errorf("%s: tokens (-cold +pulled prefix):\n%s", id, diff)
		}
		if got.peer != int32(want) || got.prefix != got.peer || got.peerLoad <= 0 {
			t.Errorf("%s: hits %+v: want %d peer hit tokens, all of the prefix hit, and a load time", id, got, want)
		}
		if st := w.s.Stats().PrefixCache.Peer; st.Pulls != 1 || st.HitTokens != uint64(want) || st.PullFailures != 0 || st.Verified != 1 || st.Rejected != 0 {
			t.Errorf("%s: puller's peer stats %+v, want 1 pull of %d tokens, verified by the spot check", id, st, want)
		}
		// Pulled once, the prompt is the puller's own now.
		toks, got = generatePeer(t, w, id+"-again", p, 6, h.peer(64))
		if got.peer != 0 || int(got.prefix) != (tc.n-1)/16*16 {
			t.Errorf("%s again: hits %+v, want %d from its own cache", id, got, (tc.n-1)/16*16)
		}
		if diff := cmp.Diff(wantToks, toks); diff != "" {
			t.Errorf("%s again: tokens (-cold +cached):\n%s", id, diff)
		}
	}
	if st := h.s.Stats().PrefixCache.Peer; st.Exports != uint64(len(cases)) {
		t.Errorf("holder's peer stats %+v: want %d exports", st, len(cases))
	}
}

// TestPeerPullLocalBitExact is pullBitExact on the reference engine,
// against the engine alone.
func TestPeerPullLocalBitExact(t *testing.T) {
	cold := func(p []int32, n int) []int32 { return reference(t, p, n, engine.Sampling{}) }
	pullBitExact(t, func() engine.Engine { return newEngine(t) }, cachedOptions(1024, 16), cold,
		[]struct{ n, shared int }{{70, 70}, {60, 48}, {50, 40}, {90, 70}})
}

// TestPeerPullLocalSim is pullBitExact on the performance-model engine
// with its KV payload scaled down (1/1024 of the model's true size),
// against a decode worker without a cache.
func TestPeerPullLocalSim(t *testing.T) {
	newSim := func() engine.Engine {
		eng, err := sim.New(sim.Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 1e-6, PayloadScale: 1.0 / 1024, Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	o := cachedOptions(1024, 16)
	cold := func(p []int32, n int) []int32 {
		c := o
		c.PrefixCache.MaxTokens = 0
		w := newWorkerOn(t, newSim(), c, true)
		toks, _ := generatePeer(t, w, "cold", p, n, nil)
		return toks
	}
	pullBitExact(t, newSim, o, cold, []struct{ n, shared int }{{60, 48}, {50, 40}})
}

// TestPeerPullLocalLlamaCpp is pullBitExact on llama.cpp (a tiny random
// model), against a decode worker without a cache.
func TestPeerPullLocalLlamaCpp(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	path := filepath.Join(t.TempDir(), "tiny-llama.gguf")
	if err := gguf.WriteRandom(path, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 1024, Type: gguf.F32, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	newLlama := func() engine.Engine {
		eng, err := llamacpp.New(llamacpp.Options{LibDir: lib, Model: path, CtxSize: 1024, MaxSeqs: 8, Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() })
		return eng
	}
	probe := newLlama().(*llamacpp.Engine)
	if err := probe.Transferable(); err != nil {
		t.Skipf("llama.cpp KV export unavailable: %v", err)
	}
	o := cachedOptions(512, 4)
	o.MaxBatch = 2
	cold := func(p []int32, n int) []int32 {
		c := o
		c.PrefixCache.MaxTokens = 0
		w := newWorkerOn(t, newLlama(), c, true)
		toks, _ := generatePeer(t, w, "cold", p, n, nil)
		return toks
	}
	pullBitExact(t, newLlama, o, cold, []struct{ n, shared int }{{60, 48}, {50, 40}})
}

// TestPeerPullLocalNotWorthIt: a peer that holds no more than the
// worker's own cache, a pull priced slower than computing, pulls turned
// off (--peer-link-gbps 0), a worker without a dialer and a request for
// prompt logprobs pull nothing; only the priced pull counts as skipped.
func TestPeerPullLocalNotWorthIt(t *testing.T) {
	h := newHolder(t, newEngine(t), newEngine(t))
	base := prompt(70, 3)
	h.hold(t, "base", base)

	own := newPuller(t, newEngine(t), cachedOptions(1024, 16), true)
	generateLocal(t, own, "own-base", base, 4)
	if _, got := generatePeer(t, own, "own", base, 4, h.peer(64)); got.peer != 0 || got.prefix != 64 {
		t.Errorf("a prefix the worker holds: hits %+v, want its own 64 and no pull", got)
	}

	slow := newPuller(t, newEngine(t), cachedOptions(1024, 16), false)
	slow.s.peers.Gbps = 1e-9                         // a link that takes ages
	generateLocal(t, slow, "warm", prompt(40, 9), 2) // its prefill throughput is measured
	want := reference(t, base, 4, engine.Sampling{})
	toks, got := generatePeer(t, slow, "slow", base, 4, h.peer(64))
	if got.peer != 0 || got.prefix != 0 {
		t.Errorf("a pull slower than computing: hits %+v, want none", got)
	}
	if diff := cmp.Diff(want, toks); diff != "" {
		t.Errorf("slow: tokens (-engine alone +worker):\n%s", diff)
	}
	if st := slow.s.Stats().PrefixCache.Peer; st.PullsSkipped != 1 || st.Pulls != 0 {
		t.Errorf("slow link peer stats %+v: want 1 skipped", st)
	}

	o := cachedOptions(1024, 16)
	o.PeerLinkGbps = 0
	off := newPuller(t, newEngine(t), o, true)
	nodial := newWorker(t, cachedOptions(1024, 16), true)
	for name, w := range map[string]*testWorker{"off": off, "no dialer": nodial} {
		if _, got := generatePeer(t, w, name, base, 4, h.peer(64)); got.peer != 0 || got.prefix != 0 {
			t.Errorf("%s: hits %+v, want no pull", name, got)
		}
		if st := w.s.Stats().PrefixCache.Peer; st != (prefixcache.PeerStats{}) {
			t.Errorf("%s: peer stats %+v, want none", name, st)
		}
	}

	logprobs := newPuller(t, newEngine(t), cachedOptions(1024, 16), true)
	stream, err := logprobs.client.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: "lp", PromptTokens: base, MaxTokens: 2,
		LocalPrefill: true, IgnoreEos: true, PromptLogprobs: &pdservev1.Logprobs{Enabled: true}, Peer: h.peer(64)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(stream); err != nil {
		t.Fatalf("prompt logprobs: %v", err)
	}
	if st := logprobs.s.Stats().PrefixCache.Peer; st != (prefixcache.PeerStats{}) {
		t.Errorf("prompt logprobs: peer stats %+v, want none", st)
	}
	if st := h.s.Stats().PrefixCache.Peer; st.Exports != 0 {
		t.Errorf("holder exported %d prefixes, want none", st.Exports)
	}
}

// dyingPeer answers a pull with its header, then fails as a worker that
// crashed mid-pull.
type dyingPeer struct {
	pdservev1.UnimplementedKVTransferServiceServer
	spec engine.ModelSpec
}

func (d dyingPeer) Pull(req *pdservev1.PullRequest, stream grpc.ServerStreamingServer[pdservev1.PullResponse]) error {
	if err := stream.Send(&pdservev1.PullResponse{Msg: &pdservev1.PullResponse_Header{Header: &pdservev1.PullHeader{
		Tokens: 32, Layers: int32(d.spec.Layers), TokenBytes: int32(d.spec.KVTokenBytes()), Tier: "engine",
	}}}); err != nil {
		return err
	}
	return status.Error(codes.Unavailable, "transport is closing")
}

// TestPeerPullLocalPeerDies: a peer that dies mid-pull, and one that is
// not there at all, leave the prompt computed here, with the engine's
// tokens, the failures counted.
func TestPeerPullLocalPeerDies(t *testing.T) {
	w := newPuller(t, newEngine(t), cachedOptions(1024, 16), true)
	dying := workertest.ServeKVTransfer(t, dyingPeer{spec: w.s.spec})
	goneAddr := workertest.GoneAddr(t)
	for i, addr := range []string{dying, goneAddr} {
		p := prompt(70, int32(3+i))
		peer := &pdservev1.PeerPrefix{Addr: addr, Id: "holder", Role: "prefill", Tokens: 64}
		toks, got := generatePeer(t, w, fmt.Sprintf("dies-%d", i), p, 4, peer)
		if got.peer != 0 || got.prefix != 0 {
			t.Errorf("peer %d: hits %+v, want the prompt computed", i, got)
		}
		if diff := cmp.Diff(reference(t, p, 4, engine.Sampling{}), toks); diff != "" {
			t.Errorf("peer %d: tokens (-engine alone +worker):\n%s", i, diff)
		}
	}
	if st := w.s.Stats().PrefixCache.Peer; st.PullFailures != 2 || st.Pulls != 0 {
		t.Errorf("peer stats %+v: want 2 failed pulls", st)
	}
}
