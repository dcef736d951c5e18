package decode

import (
	"context"

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

// puller is the worker's side of its local prefills' peer pulls.
func (s *Server) puller() peerpull.Puller {
	return peerpull.Puller{Cache: s.cache, Pricer: s.peers, Dialer: s.dialer, Spec: s.spec, Log: s.log, Now: s.now}
}

// planPull decides whether local-prefill call p pulls its prompt's
// prefix from p.peer, as a prefill worker does (peerpull). Nil: it
// does not. No lock is held.
func (s *Server) planPull(p genParams) *peerpull.Plan {
	if s.cache == nil || p.peer == nil {
		return nil
	}
	return s.puller().Plan(p.peer, len(p.prompt), p.hashes)
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
	defer s.mu.Unlock()
	q.pulling = false
	if q.done || q.join == nil {
		return
	}
	q.join.Pulled = pulled
	s.handLocked(q)
}
