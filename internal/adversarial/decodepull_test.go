package adversarial

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/workertest"
	"github.com/pdserve/pdserve/pkg/decode"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// fakePeer is the fake worker of Trust III finding 2: it claims every
// prefix it is asked for and serves it as random (finite) bf16 KV.
type fakePeer struct {
	bt, tokenBytes int
	layers         int

	mu    sync.Mutex
	rng   *rand.Rand
	pulls int
}

func (p *fakePeer) BlockTokens() int { return p.bt }

func (p *fakePeer) ExportPrefix(_ context.Context, hashes []kv.Hash, minBlocks, maxBlocks int) (kvtransfer.PrefixKV, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pulls++
	n := min(len(hashes), maxBlocks) * p.bt
	out := kvtransfer.PrefixKV{Tokens: n, Tier: "engine", Layers: make([][]byte, p.layers)}
	for l := range out.Layers {
		d := make([]byte, n*p.tokenBytes)
		for i := 0; i+1 < len(d); i += 2 {
			binary.LittleEndian.PutUint16(d[i:], uint16(math.Float32bits(float32(p.rng.Float64()*2-1))>>16))
		}
		out.Layers[l] = d
	}
	return out, nil
}

func (p *fakePeer) served() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pulls
}

// decodeWorker is a decode worker (pkg/decode over loopback gRPC) with a
// prefix cache and a dialer to pull prefixes from peers.
type decodeWorker struct {
	s      *decode.Server
	addr   string
	client pdservev1.DecodeServiceClient
}

func startDecodeWorker(t *testing.T, verifyBlocks int) *decodeWorker {
	t.Helper()
	eng := workertest.Engine(t)
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	t.Cleanup(func() { _ = d.Close() }) // after the Server stopped
	o := decode.DefaultOptions()
	o.KVBlocks, o.BlockTokens, o.MaxBatch, o.ChunkTokens, o.MaxBatchTokens = 256, holderBT, 8, 16, 64
	o.PrefixCache = prefixcache.Options{MaxTokens: 1 << 12, MaxEntries: 8}
	o.PeerPullVerifyBlocks = verifyBlocks
	s, err := decode.New(eng, o, zaptest.NewLogger(t), nil, decode.WithDialer(d))
	if err != nil {
		t.Fatal(err)
	}
	sv := workertest.Serve(t, workertest.Server{Register: func(g grpc.ServiceRegistrar) { s.Register(g) }, Run: s.Run, Stop: s.Stop}, true, kvtransfer.GRPCServerOptions()...)
	return &decodeWorker{s: s, addr: sv.Addr, client: pdservev1.NewDecodeServiceClient(sv.Conn)}
}

// generate runs a local prefill of p (naming peer, nil: none) for 8
// tokens and returns them and the peer hit tokens it reported.
func (w *decodeWorker) generate(t *testing.T, id string, p []int32, peer *pdservev1.PeerPrefix) ([]int32, int32) {
	t.Helper()
	st, err := w.client.Generate(workertest.Ctx(t), &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: 8,
		LocalPrefill: true, IgnoreEos: true, Peer: peer})
	if err != nil {
		t.Fatal(err)
	}
	var toks []int32
	var peerHit int32
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return toks, peerHit
		}
		if err != nil {
			t.Fatalf("generate %s: %v", id, err)
		}
		toks = append(toks, ev.GetTokens()...)
		peerHit = max(peerHit, ev.GetHit().GetPeerTokens())
	}
}

// servePeer serves p's pulls on loopback and names it as holding tokens
// of a prompt.
func servePeer(t *testing.T, p kvtransfer.PullSource, tokens int) *pdservev1.PeerPrefix {
	t.Helper()
	srv := grpc.NewServer(kvtransfer.GRPCServerOptions()...)
	kvtransfer.Register(srv, nil, engine.BF16, kvtransfer.WithPullSource(p))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) })
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	addr := lis.Addr().String()
	return &pdservev1.PeerPrefix{Addr: addr, Id: "evil", Role: "decode", Tokens: int32(tokens)}
}

// TestPoisoningPeerCaughtByDecodeWorker: a fake peer serves a decode
// worker's local prefill random KV for a prompt's 4 blocks. The decode
// worker's spot check (the default) catches it: the client's tokens are
// the engine's own (those of a worker that never pulled), the peer is
// distrusted and not asked again, and nothing poisoned stays cached: the
// same prompt again (tenant B's identical request), and a longer one
// built on it, get the engine's tokens from the worker's own cache.
// On code without the decode-side check the pulled KV was used and
// cached as the worker's own: the first request's tokens, and the later
// ones' forked from the cache, were the poison's.
func TestPoisoningPeerCaughtByDecodeWorker(t *testing.T) {
	base := prompt(70, 3)
	longer := append(slices.Clone(base), prompt(30, 9)...)
	clean := startDecodeWorker(t, 0)
	want, _ := clean.generate(t, "clean", base, nil)
	wantLonger, _ := clean.generate(t, "clean-longer", longer, nil)

	w := startDecodeWorker(t, 1)
	spec := workertest.Engine(t).Spec()
	bad := &fakePeer{bt: holderBT, tokenBytes: spec.KVTokenBytes(), layers: spec.Layers, rng: rand.New(rand.NewPCG(1, 2))}
	peer := servePeer(t, bad, 64)
	got, _ := w.generate(t, "a", base, peer)
	if !slices.Equal(got, want) {
		t.Errorf("tenant A's tokens %v, want the engine's %v: the poisoned KV was used", got, want)
	}
	st := w.s.Stats().PrefixCache.Peer
	if bad.served() != 1 || st.Rejected != 1 || st.Verified != 0 || st.HitTokens != 0 {
		t.Errorf("%d pulls served, peer stats %+v: want 1 pull, rejected, no hit", bad.served(), st)
	}
	if w.s.UntrustedPeers() != 1 {
		t.Errorf("%d untrusted peers, want 1", w.s.UntrustedPeers())
	}
	// The fake is not asked again; what the worker caches is its own.
	if got, hit := w.generate(t, "b", base, peer); !slices.Equal(got, want) || hit != 0 {
		t.Errorf("tenant B's identical prompt: tokens %v (peer hit %d), want %v and no pull", got, hit, want)
	}
	// The fake claims 6 blocks of the longer prompt, more than the 4 the
	// worker holds: a trusted peer would be pulled from.
	more := &pdservev1.PeerPrefix{Addr: peer.GetAddr(), Id: peer.GetId(), Role: peer.GetRole(), Tokens: 96}
	if got, hit := w.generate(t, "b-longer", longer, more); !slices.Equal(got, wantLonger) || hit != 0 {
		t.Errorf("a longer prompt on it: tokens %v (peer hit %d), want %v and no pull", got, hit, wantLonger)
	}
	if bad.served() != 1 {
		t.Errorf("the distrusted peer served %d pulls, want 1", bad.served())
	}
}

// TestUnverifiedPulledPushNotCached: a prefill worker pushes KV it
// marks as pulled from a peer without a check (KVCommit.provenance
// PULLED_UNVERIFIED). The decode worker serves the request with it, but
// neither caches nor advertises it: its prefix cache stays empty, its KV
// events' block list stays empty, and a later Reserve of the same prompt
// finds no prefix (prefix_hit_tokens 0). A push marked computed is
// cached (the control). On code without the provenance the decode worker
// cached the unverified push: the Reserve got a hit of 64 tokens.
func TestUnverifiedPulledPushNotCached(t *testing.T) {
	base := prompt(70, 3)
	for _, tc := range []struct {
		prov    pdservev1.KVProvenance
		wantHit int32
	}{
		{pdservev1.KVProvenance_KV_PROVENANCE_PULLED_UNVERIFIED, 0},
		{pdservev1.KVProvenance_KV_PROVENANCE_COMPUTED, 64},
	} {
		w := startDecodeWorker(t, 1)
		ctx := workertest.Ctx(t)
		if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "pushed", Tokens: int32(len(base) + 8), Prompt: base}); err != nil {
			t.Fatal(err)
		}
		push(t, w.addr, "pushed", base, tc.prov)
		st, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "pushed", PromptTokens: base, MaxTokens: 8, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			ev, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%v: generate: %v", tc.prov, err)
			}
			n += len(ev.GetTokens())
		}
		// max_tokens 8 less the push's first token, which the stream
		// does not carry.
		if n != 7 {
			t.Errorf("%v: %d tokens, want 7: the push serves its own request", tc.prov, n)
		}
		// The batch kept (or not) the prompt's sequence before it reported
		// the request's end, which ended the stream.
		r, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "again", Tokens: int32(len(base) + 8), Prompt: base})
		if err != nil {
			t.Fatal(err)
		}
		if hit := r.GetPrefixHitTokens(); hit != tc.wantHit {
			t.Errorf("%v: a later Reserve of the prompt hit %d tokens, want %d", tc.prov, hit, tc.wantHit)
		}
		if tc.wantHit == 0 {
			if bl := w.s.PrefixBlocks().AppendBlocks(nil, nil); len(bl) != 0 {
				t.Errorf("%v: the worker advertises %d blocks of unverified KV, want none", tc.prov, len(bl))
			}
			if got := w.s.Stats().PrefixCache.Peer.Unverified; got != 1 {
				t.Errorf("%v: %d unverified prompts counted, want 1", tc.prov, got)
			}
		}
	}
}

// push prefills p on an engine of its own and pushes its KV and first
// token to the decode worker at addr, as a prefill worker would, its
// commit marked with prov.
func push(t *testing.T, addr, id string, p []int32, prov pdservev1.KVProvenance) {
	t.Helper()
	e := workertest.Engine(t)
	ctx := workertest.Ctx(t)
	out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	defer d.Close()
	spec := e.Spec()
	snd, err := d.Open(ctx, addr, kvtransfer.StreamHeader{RequestID: id, Codec: "none", Layers: spec.Layers, Tokens: len(p), TokenBytes: spec.KVTokenBytes(), DType: spec.KVDType})
	if err != nil {
		t.Fatalf("open transfer: %v", err)
	}
	for l := range spec.Layers {
		raw, err := e.ExportKV(1, l, 0, len(p), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := snd.Send(l, 0, len(p), raw, 0); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	if _, err := snd.Commit(ctx, kvtransfer.Commit{FirstToken: out[0].Token, Provenance: prov}); err != nil {
		t.Fatalf("commit: %v", err)
	}
}
