package decode

import (
	"context"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/peerpull"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// ExportPrefix implements kvtransfer.PullSource (with BlockTokens): a
// peer worker's pull of a prefix this worker's prefix cache holds in any
// tier (prefixcache.Export, the batch's engine held still a layer at a
// time: Batch.LockEngine).
func (s *Server) ExportPrefix(_ context.Context, hashes []kv.Hash, minBlocks, maxBlocks int) (kvtransfer.PrefixKV, error) {
	lock := func() func() {
		s.b.LockEngine()
		return s.b.UnlockEngine
	}
	x, err := s.cache.Export(s.eng, lock, hashes, minBlocks, maxBlocks)
	return kvtransfer.PrefixKV{Tokens: x.Tokens, Tier: x.Tier, Layers: x.Layers}, err
}

// PeerPullCost is the time this worker takes to pull a token of a
// cached prefix from a peer over the time its local prefill takes to
// compute it, for its heartbeat: 0 when it does not pull (no prefix
// cache, no dialer, --peer-link-gbps 0) or has measured no local-prefill
// step.
func (s *Server) PeerPullCost() float64 { return s.puller().CostRatio() }

// puller is the worker's side of its local prefills' peer pulls,
// spot-checked on its engine (Options.PeerPullVerifyBlocks), as a
// prefill worker's are: the same peerpull.Puller.
func (s *Server) puller() peerpull.Puller {
	return peerpull.Puller{
		Cache: s.cache, Pricer: s.peers, Dialer: s.dialer, Spec: s.spec, Log: s.log, Now: s.now,
		Check:      &peerpull.Check{Blocks: s.o.PeerPullVerifyBlocks, Engine: s.eng, Lock: s.lockEngine},
		Trust:      &s.trust,
		Distrusted: s.purgeSource,
	}
}

// lockEngine holds the batch's engine still (its loop waits at the next
// step) and returns the release.
func (s *Server) lockEngine() func() {
	s.b.LockEngine()
	return s.b.UnlockEngine
}

// purgeSource drops what the prefix cache holds from peer, which failed a
// spot check: the entries tagged with it in the engine and host tiers
// (pinned ones stay until the bounds evict them). Their engine sequences
// go to the batch to free (batch.Reclaimed), and the pool blocks charged
// for them go back. The caller holds no lock.
func (s *Server) purgeSource(peer string) {
	seqs := s.cache.DropSource(peer)
	s.mu.Lock()
	s.handReclaimed(seqs)
	s.chargeCacheLocked()
	s.unlock()
	s.log.Warn("peer untrusted: dropped the prefix cache entries pulled from it", zap.String("peer", peer), zap.Int("engine_entries", len(seqs)))
}

// UntrustedPeers returns how many peers failed a spot check of the KV
// pulled from them (no longer pulled from), for metrics.
func (s *Server) UntrustedPeers() int { return s.trust.Untrusted() }

// planPull decides whether local-prefill call p pulls its prompt's
// prefix from p.peer, as a prefill worker does (peerpull), with the
// prompt for the pull's spot check. Nil: it does not. No lock is held.
func (s *Server) planPull(p genParams) *peerpull.Plan {
	if s.cache == nil || p.peer == nil {
		return nil
	}
	return s.puller().PlanPrompt(p.peer, p.prompt, p.hashes)
}

// pullPrefix pulls plan's prefix of request id's prompt (nil when the
// pull failed: logged and counted, the prompt computed). No lock is
// held: it is network I/O.
func (s *Server) pullPrefix(ctx context.Context, id string, plan *peerpull.Plan) *prefixcache.Pulled {
	return s.puller().Pull(ctx, id, plan, s.tokenBytes) // the engine's payload: scaled down on sim
}

// pullDone ends q's pull with pulled (nil: none) and hands q to the
// batch (handLocked), which imports pulled when the sequence starts. A
// request that ended meanwhile drops it.
func (s *Server) pullDone(q *sequence, pulled *prefixcache.Pulled) {
	s.mu.Lock()
	defer s.unlock()
	q.pulling = false
	if q.done || q.join == nil {
		return
	}
	q.join.Pulled = pulled
	s.handLocked(q)
}
