package prefill

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/workertest"
)

// withPeer sets a Prefill request's peer: the worker at addr holding
// tokens of its prompt.
func withPeer(addr string, tokens int) func(*pdservev1.PrefillRequest) {
	return func(r *pdservev1.PrefillRequest) {
		r.Peer = &pdservev1.PeerPrefix{Addr: addr, Id: "holder", Role: "prefill", Tokens: int32(tokens)}
	}
}

// TestPeerPullBitExact: a worker whose cache lacks a prefix that a peer
// prefill worker holds pulls it, block-aligned or not: the first token and
// the KV it sends are the engine's without a cache, bit for bit, the
// pulled blocks count as its prefix hit and its peer hit, and the pulled
// prefix is cached here afterwards.
func TestPeerPullBitExact(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	holder := newWorker(t, cachedOptions(1<<12, 8), true)
	puller := newWorker(t, cachedOptions(1<<12, 8), true)
	puller.s.peers.Always = true
	base := prompt(70, 3)
	prefillOne(t, holder, f, addr, "base", base, 0)
	for i, tc := range []struct{ n, shared int }{{70, 70}, {60, 48}, {50, 40}, {90, 70}} {
		p := sharing(base, tc.n, tc.shared, int32(i+5))
		want := wantHit(p, [][]int32{base})
		id := fmt.Sprintf("p%d-%d-%d", i, tc.n, tc.shared)
		// The puller's own cache holds nothing of base: each prompt
		// starts from a worker that has not seen it (a new puller).
		w := puller
		if i > 0 {
			w = newWorker(t, cachedOptions(1<<12, 8), true)
			w.s.peers.Always = true
		}
		ev, _ := prefillOne(t, w, f, addr, id, p, 0, withPeer(holder.addr, 64))
		if got := ev.first.GetHit().GetPeerTokens(); int(got) != want || ev.first.GetHit().GetTokens() != got || ev.first.GetHit().GetPeerLoadNanos() <= 0 {
			t.Errorf("%s: first token %+v: want %d peer hit tokens, all of the prefix hit, and a load time", id, ev.first, want)
		}
		st := w.s.Stats().PrefixCache.Peer
		if st.Pulls != 1 || st.HitTokens != uint64(want) || st.PullFailures != 0 {
			t.Errorf("%s: puller's peer stats %+v, want 1 pull of %d tokens", id, st, want)
		}
		// Pulled once, the prompt is the puller's own now: all of it
		// but the last token's block hits its own cache.
		if ev, _ := prefillOne(t, w, f, addr, id+"-again", p, 0, withPeer(holder.addr, 64)); ev.first.GetHit().GetPeerTokens() != 0 || int(ev.first.GetHit().GetTokens()) != (len(p)-1)/16*16 {
			t.Errorf("%s again: %+v, want %d hit tokens from its own cache", id, ev.first, (len(p)-1)/16*16)
		}
	}
	if st := holder.s.Stats().PrefixCache; st.Peer.Exports != 4 || st.Lookups != 1 {
		t.Errorf("holder's cache stats %+v: want 4 exports and only its own lookup", st)
	}
}

// TestPeerPullNotWorthIt: a peer that holds no more than the worker's own
// cache, a peer pull priced slower than computing, and pulls turned off
// (--peer-link-gbps 0) pull nothing.
func TestPeerPullNotWorthIt(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	holder := newWorker(t, cachedOptions(1<<12, 8), true)
	base := prompt(70, 3)
	prefillOne(t, holder, f, addr, "base", base, 0)

	own := newWorker(t, cachedOptions(1<<12, 8), true)
	own.s.peers.Always = true
	prefillOne(t, own, f, addr, "own-base", base, 0)
	if ev, _ := prefillOne(t, own, f, addr, "own", base, 0, withPeer(holder.addr, 64)); ev.first.GetHit().GetPeerTokens() != 0 || ev.first.GetHit().GetTokens() != 64 {
		t.Errorf("a prefix the worker holds: %+v, want its own hit and no pull", ev.first)
	}

	slow := newWorker(t, cachedOptions(1<<12, 8), true)
	slow.s.peers.Gbps = 1e-9                               // a link that takes ages
	prefillOne(t, slow, f, addr, "warm", prompt(40, 9), 0) // its throughput is measured
	if ev, _ := prefillOne(t, slow, f, addr, "slow", base, 0, withPeer(holder.addr, 64)); ev.first.GetHit().GetPeerTokens() != 0 || ev.first.GetHit().GetTokens() != 0 {
		t.Errorf("a pull slower than computing: %+v, want none", ev.first)
	}
	if st := slow.s.Stats().PrefixCache.Peer; st.PullsSkipped != 1 || st.Pulls != 0 {
		t.Errorf("slow link peer stats %+v: want 1 skipped", st)
	}

	o := cachedOptions(1<<12, 8)
	o.PeerLinkGbps = 0
	off := newWorker(t, o, true)
	if ev, _ := prefillOne(t, off, f, addr, "off", base, 0, withPeer(holder.addr, 64)); ev.first.GetHit().GetPeerTokens() != 0 {
		t.Errorf("pulls off: %+v, want no pull", ev.first)
	}
	if st := holder.s.Stats().PrefixCache.Peer; st.Exports != 0 {
		t.Errorf("holder exported %d prefixes, want none", st.Exports)
	}
}

// dyingPeer answers a pull with a header and one layer's frame, then
// fails as a worker that crashed mid-pull.
type dyingPeer struct {
	pdservev1.UnimplementedKVTransferServiceServer
	src *Server
}

func (d dyingPeer) Pull(req *pdservev1.PullRequest, stream grpc.ServerStreamingServer[pdservev1.PullResponse]) error {
	if err := stream.Send(&pdservev1.PullResponse{Msg: &pdservev1.PullResponse_Header{Header: &pdservev1.PullHeader{
		Tokens: 32, Layers: int32(d.src.spec.Layers), TokenBytes: int32(d.src.spec.KVTokenBytes()), Tier: "engine",
	}}}); err != nil {
		return err
	}
	time.Sleep(10 * time.Millisecond)
	return status.Error(codes.Unavailable, "transport is closing")
}

// TestPeerPullPeerDies: a peer that dies mid-pull, and one that is not
// there at all, leave the prompt computed here, with the same first token
// and KV (prefillOne checks them against the engine alone), the failures
// counted.
func TestPeerPullPeerDies(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	w := newWorker(t, cachedOptions(1<<12, 8), true)
	w.s.peers.Always = true
	dying := workertest.ServeKVTransfer(t, dyingPeer{src: w.s})
	goneAddr := workertest.GoneAddr(t)
	for i, peer := range []string{dying, goneAddr} {
		p := prompt(70, int32(3+i))
		if ev, _ := prefillOne(t, w, f, addr, fmt.Sprintf("dies-%d", i), p, 0, withPeer(peer, 64)); ev.first.GetHit().GetPeerTokens() != 0 || ev.first.GetHit().GetTokens() != 0 {
			t.Errorf("peer %d: %+v, want the prompt computed", i, ev.first)
		}
	}
	if st := w.s.Stats().PrefixCache.Peer; st.PullFailures != 2 || st.Pulls != 0 {
		t.Errorf("peer stats %+v: want 2 failed pulls", st)
	}
}
