package prefill

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// poisoner is a peer that serves a real worker's cached prefixes with
// their KV changed: every byte of every layer flipped (all blocks), or,
// with block ≥ 0, only that block's rows.
type poisoner struct {
	src   *Server
	block int // -1: every block

	mu    sync.Mutex
	pulls int // pulls asked for
}

func (p *poisoner) BlockTokens() int { return p.src.BlockTokens() }

func (p *poisoner) ExportPrefix(ctx context.Context, hashes []kv.Hash, minBlocks, maxBlocks int) (kvtransfer.PrefixKV, error) {
	p.mu.Lock()
	p.pulls++
	p.mu.Unlock()
	x, err := p.src.ExportPrefix(ctx, hashes, minBlocks, maxBlocks)
	if err != nil || x.Tokens == 0 {
		return x, err
	}
	bt := p.src.BlockTokens()
	out := kvtransfer.PrefixKV{Tokens: x.Tokens, Tier: x.Tier, Layers: make([][]byte, len(x.Layers))}
	for l, data := range x.Layers {
		d := append([]byte(nil), data...)
		row := len(d) / (2 * x.Tokens)
		for i := range d {
			tok := (i / row) % x.Tokens // K rows, then V rows
			if p.block < 0 || tok/bt == p.block {
				d[i] ^= 0x5a
			}
		}
		out.Layers[l] = d
	}
	return out, nil
}

func (p *poisoner) served() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pulls
}

// servePoisoner serves p's pulls on a loopback gRPC server and returns
// its address.
func servePoisoner(t *testing.T, p *poisoner) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(kvtransfer.GRPCServerOptions()...)
	kvtransfer.Register(g, nil, engine.BF16, kvtransfer.WithPullSource(p))
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Serve(lis) })
	t.Cleanup(func() { g.Stop(); wg.Wait() })
	return lis.Addr().String()
}

// peerNamed sets a Prefill request's peer: the worker id at addr holding
// tokens of its prompt.
func peerNamed(id, addr string, tokens int) func(*pdservev1.PrefillRequest) {
	return func(r *pdservev1.PrefillRequest) {
		r.Peer = &pdservev1.PeerPrefix{Addr: addr, Id: id, Role: "prefill", Tokens: int32(tokens)}
	}
}

// TestPoisonedPullCaught: with the default spot check, a peer that sends
// a prompt's KV changed (all of it, or one block of it, the first or a
// middle one, which the check's recomputed last block depends on) is
// caught: the client's first token and the KV pushed to the decode
// worker are the engine's alone, bit for bit (prefillOne), the pulled KV
// is neither used nor cached, the rejection is counted, and the peer is
// not pulled from again. On code without the check the poisoned KV is
// used: prefillOne's bit-exact comparison fails.
func TestPoisonedPullCaught(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	holder := newWorker(t, cachedOptions(1<<12, 8), true)
	base := prompt(70, 3)
	prefillOne(t, holder, f, addr, "base", base, 0)
	for _, block := range []int{-1, 0, 2} {
		bad := &poisoner{src: holder.s, block: block}
		badAddr := servePoisoner(t, bad)
		w := newWorker(t, cachedOptions(1<<12, 8), true)
		w.s.peers.Always = true
		ev, _ := prefillOne(t, w, f, addr, "p1", base, 0, peerNamed("evil", badAddr, 64))
		if ev.first.GetHit().GetPeerTokens() != 0 || ev.first.GetHit().GetTokens() != 0 {
			t.Errorf("block %d: %+v, want the prompt computed here", block, ev.first)
		}
		st := w.s.Stats().PrefixCache.Peer
		if bad.served() != 1 || st.Rejected != 1 || st.Verified != 0 || st.CheckTokens != 16 || st.HitTokens != 0 {
			t.Errorf("block %d: %d pulls served, peer stats %+v: want 1 pull, rejected after 16 tokens recomputed", block, bad.served(), st)
		}
		if w.s.UntrustedPeers() != 1 {
			t.Errorf("block %d: %d untrusted peers, want 1", block, w.s.UntrustedPeers())
		}
		// The peer is not asked again, also for a prompt of which it
		// claims more than this worker holds; the prompt computed here
		// is this worker's own now.
		ev, _ = prefillOne(t, w, f, addr, "p2", sharing(base, 90, 70, 5), 0, peerNamed("evil", badAddr, 80))
		if bad.served() != 1 || ev.first.GetHit().GetPeerTokens() != 0 || ev.first.GetHit().GetTokens() != 64 {
			t.Errorf("block %d: again: %d pulls served, %+v: want no pull and 64 tokens of its own", block, bad.served(), ev.first)
		}
	}
}

// TestUnverifiedPullNotReexported: with the spot check off, a poisoned
// pull serves its own request (the client asked for no check), but the
// puller neither caches it nor advertises its blocks (the KV events'
// list, AppendBlocks, and the heartbeat digest stay empty), so a third
// worker that pulls the prompt from the puller gets nothing and computes
// the right KV. On code that cached pulled KV as its own, the puller
// advertised the blocks and served the poison to the third worker
// (prefillOne's bit-exact comparison fails).
func TestUnverifiedPullNotReexported(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	holder := newWorker(t, cachedOptions(1<<12, 8), true)
	base := prompt(70, 3)
	prefillOne(t, holder, f, addr, "base", base, 0)
	bad := &poisoner{src: holder.s, block: -1}
	badAddr := servePoisoner(t, bad)

	o := cachedOptions(1<<12, 8)
	o.PeerPullVerifyBlocks = 0
	mid := newWorker(t, o, true)
	mid.s.peers.Always = true
	stream, err := mid.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: "mid", PromptTokens: base, DecodeAddr: addr, Peer: &pdservev1.PeerPrefix{Addr: badAddr, Id: "evil", Role: "prefill", Tokens: 64}})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := collect(stream)
	if err != nil {
		t.Fatal(err)
	}
	if ev.first.GetHit().GetPeerTokens() != 64 || bad.served() != 1 {
		t.Fatalf("unchecked pull: %+v, %d pulls served: want 64 tokens pulled", ev.first, bad.served())
	}
	st := mid.s.Stats().PrefixCache
	if st.Entries != 0 || st.Peer.Unverified != 1 || st.Peer.Verified != 0 || st.Peer.CheckTokens != 0 {
		t.Errorf("puller's cache %+v: want no entry, 1 unverified pull, no check", st)
	}
	// The push says so, and the decode worker caches none of it.
	if got, _ := f.get("mid"); got.prov != pdservev1.KVProvenance_KV_PROVENANCE_PULLED_UNVERIFIED {
		t.Errorf("push of unverified pulled KV committed with provenance %v, want PULLED_UNVERIFIED", got.prov)
	}
	if bl := mid.s.PrefixBlocks().AppendBlocks(nil, nil); len(bl) != 0 {
		t.Errorf("puller advertises %d blocks of unverified KV, want none", len(bl))
	}
	if d := mid.s.PrefixDigest(64); len(d) != 0 {
		t.Errorf("puller's heartbeat digest holds %d blocks of unverified KV, want none", len(d))
	}

	third := newWorker(t, cachedOptions(1<<12, 8), true)
	third.s.peers.Always = true
	ev, _ = prefillOne(t, third, f, addr, "third", base, 0, peerNamed("mid", mid.addr, 64))
	if ev.first.GetHit().GetPeerTokens() != 0 {
		t.Errorf("third worker: %+v, want nothing pulled from the puller", ev.first)
	}
	if st := mid.s.Stats().PrefixCache.Peer; st.Exports != 0 {
		t.Errorf("puller exported %d prefixes, want none", st.Exports)
	}
}

// TestVerifiedPullTaggedAndPurged: a pull that passes the spot check is
// cached, tagged with its peer, and served on to a third worker; when
// the same peer later sends poisoned KV, the entries pulled from it
// before are dropped too (counted as purged), while the worker's own
// entries stay. Without the tag nothing could tell them apart: the
// purge count stays 0 and the old entry stays cached.
func TestVerifiedPullTaggedAndPurged(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	holder := newWorker(t, cachedOptions(1<<12, 8), true)
	base, other := prompt(70, 3), prompt(70, 11)
	prefillOne(t, holder, f, addr, "base", base, 0)
	prefillOne(t, holder, f, addr, "other", other, 0)

	w := newWorker(t, cachedOptions(1<<12, 8), true)
	w.s.peers.Always = true
	prefillOne(t, w, f, addr, "own", prompt(50, 7), 0)
	if ev, _ := prefillOne(t, w, f, addr, "pulled", base, 0, peerNamed("holder", holder.addr, 64)); ev.first.GetHit().GetPeerTokens() != 64 {
		t.Fatalf("honest pull: %+v, want 64 tokens pulled", ev.first)
	}
	if st := w.s.Stats().PrefixCache; st.Entries != 2 || st.Peer.Verified != 1 {
		t.Fatalf("after a verified pull: %+v, want 2 entries, 1 verified pull", st)
	}
	for id, want := range map[string]pdservev1.KVProvenance{"own": pdservev1.KVProvenance_KV_PROVENANCE_COMPUTED, "pulled": pdservev1.KVProvenance_KV_PROVENANCE_PULLED_VERIFIED} {
		if got, _ := f.get(id); got.prov != want {
			t.Errorf("push of %s committed with provenance %v, want %v", id, got.prov, want)
		}
	}
	third := newWorker(t, cachedOptions(1<<12, 8), true)
	third.s.peers.Always = true
	if ev, _ := prefillOne(t, third, f, addr, "third", base, 0, peerNamed("w", w.addr, 64)); ev.first.GetHit().GetPeerTokens() != 64 {
		t.Errorf("a verified pull served on: %+v, want 64 tokens pulled", ev.first)
	}

	// The same identity turns: its next pull is poisoned.
	bad := &poisoner{src: holder.s, block: -1}
	badAddr := servePoisoner(t, bad)
	prefillOne(t, w, f, addr, "poisoned", other, 0, peerNamed("holder", badAddr, 64))
	st := w.s.Stats().PrefixCache
	if st.Peer.Rejected != 1 || st.Peer.Purged != 1 {
		t.Errorf("after the poisoned pull: peer stats %+v, want 1 rejected and 1 entry purged", st.Peer)
	}
	// Left: the worker's own prompt and the poisoned one, computed here.
	if st.Entries != 2 || w.s.cache.Match(w.s.cache.Hashes(0, base)) != 0 {
		t.Errorf("after the purge: %d entries, base matches %d blocks: want 2 entries and base gone", st.Entries, w.s.cache.Match(w.s.cache.Hashes(0, base)))
	}
}
