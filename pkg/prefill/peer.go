package prefill

import (
	"context"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/peerpull"
	"github.com/pdserve/pdserve/pkg/prefill/batch"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// PeerPullCost is the time this worker takes to pull a token of a
// cached prefix from a peer over the time it takes to compute it, for
// its heartbeat (control.Heartbeat.PeerPullCost): 0 when it does not
// pull or has measured no step.
func (s *Server) PeerPullCost() float64 { return s.puller().CostRatio() }

// puller is the worker's side of peer pulls, spot-checked on its engine
// (Options.PeerPullVerifyBlocks).
func (s *Server) puller() peerpull.Puller {
	return peerpull.Puller{
		Cache: s.cache, Pricer: s.peers, Dialer: s.dialer, Spec: s.spec, Log: s.log, Now: s.now,
		Check:      &peerpull.Check{Blocks: s.o.PeerPullVerifyBlocks, Engine: s.eng, Lock: s.lockEngine},
		Trust:      &s.trust,
		Distrusted: s.purgeSource,
	}
}

// lockEngine takes the engine lock (the batch's steps wait) and returns
// its release.
func (s *Server) lockEngine() func() {
	s.b.LockEngine()
	return s.b.UnlockEngine
}

// purgeSource has the batch drop what the prefix cache holds from peer,
// which failed a spot check: the entries tagged with it in the engine and
// host tiers (pinned ones stay until the bounds evict them), before it
// takes any request posted later.
func (s *Server) purgeSource(peer string) { s.b.Post(batch.Purge(peer)) }

// UntrustedPeers returns how many peers failed a spot check of the KV
// pulled from them (no longer pulled from), for metrics.
func (s *Server) UntrustedPeers() int { return s.trust.Untrusted() }

// ExportPrefix implements kvtransfer.PullSource: a peer's pull of a
// prefix this worker's cache holds in any tier (prefixcache.Export, the
// engine lock taken a layer at a time).
func (s *Server) ExportPrefix(_ context.Context, hashes []kv.Hash, minBlocks, maxBlocks int) (kvtransfer.PrefixKV, error) {
	x, err := s.cache.Export(s.eng, s.lockEngine, hashes, minBlocks, maxBlocks)
	// The entry it pinned is unpinned now: a request waiting for the
	// engine memory it held may start.
	s.sig.Wake()
	return kvtransfer.PrefixKV{Tokens: x.Tokens, Tier: x.Tier, Layers: x.Layers}, err
}

// pullPrefix pulls the prefix of req's prompt that req.peer holds, when
// the peer holds more of it than this worker's cache in any tier and the
// link model says the pull is faster than computing it (peerpull). It
// returns nil when it does not pull, or the pull failed (logged and
// counted: the prompt is computed, with the same tokens).
func (s *Server) pullPrefix(ctx context.Context, req *pdservev1.PrefillRequest, hashes []kv.Hash) *prefixcache.Pulled {
	prompt := req.GetPromptTokens()
	if s.cache == nil || req.GetPeer() == nil {
		return nil
	}
	pl := s.puller()
	plan := pl.PlanPrompt(req.GetPeer(), prompt, hashes)
	if plan == nil {
		return nil
	}
	s.mu.Lock()
	tb := s.tokenBytes // the engine's payload: scaled down on sim
	s.mu.Unlock()
	return pl.Pull(ctx, req.GetRequestId(), plan, tb)
}
