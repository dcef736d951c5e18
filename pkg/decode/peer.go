package decode

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// ExportPrefix implements kvtransfer.PullSource (with BlockTokens): a
// peer worker's pull of a prefix this worker's prefix cache holds in any
// tier (prefixcache.Export, the engine lock taken a layer at a time).
func (s *Server) ExportPrefix(_ context.Context, hashes []kv.Hash, minBlocks, maxBlocks int) (kvtransfer.PrefixKV, error) {
	lock := func() func() {
		s.run.LockEngine()
		return s.run.UnlockEngine
	}
	x, err := s.cache.Export(s.eng, lock, hashes, minBlocks, maxBlocks)
	return kvtransfer.PrefixKV{Tokens: x.Tokens, Tier: x.Tier, Layers: x.Layers}, err
}

// PeerPullCost is the time this worker takes to pull a token of a
// cached prefix from a peer over the time its local prefill takes to
// compute it (kvtransfer.PullPricer.CostRatio), for its heartbeat: 0
// when it does not pull (no prefix cache, no dialer, --peer-link-gbps 0)
// or has measured no local-prefill step.
func (s *Server) PeerPullCost() float64 {
	if s.cache == nil || s.dialer == nil {
		return 0
	}
	return s.peers.CostRatio(int64(s.spec.KVBytesPerToken()))
}

// peerLoad is what of a local prompt's prefix a sequence started from a
// peer's pull: tokens, and the pull's and import's time.
type peerLoad struct {
	tokens int
	took   time.Duration
}

// pullPlan is a pull a local prefill's Generate call makes before its
// sequence is ready.
type pullPlan struct {
	peer      *pdservev1.PeerPrefix
	hashes    []kv.Hash
	own       int           // blocks the worker's tiers hold
	maxBlocks int           // blocks the prompt may take from a cache
	giveUp    time.Duration // 0: no limit but the call's
}

// planPull decides whether local-prefill call p pulls its prompt's
// prefix from p.peer, as a prefill worker does (kvtransfer.PullPricer):
// when the peer holds more of it than any tier of this worker's cache
// (PeerDepth) and the link model says the pull is faster than computing
// the blocks this worker lacks. It returns nil when it does not pull
// (counted as skipped when only the price said no). No lock is held.
func (s *Server) planPull(p genParams) *pullPlan {
	peer := p.peer
	if peer == nil || s.cache == nil || s.dialer == nil || !s.peers.On() || peer.GetAddr() == "" {
		return nil
	}
	maxHit := s.cache.MaxHitBlocks(len(p.prompt))
	bt := s.cache.BlockTokens()
	want := min(int(peer.GetTokens())/bt, maxHit)
	if want <= 0 {
		return nil
	}
	own := s.cache.PeerDepth(p.hashes, maxHit)
	if want <= own {
		return nil
	}
	worth, giveUp := s.peers.Price(peer.GetAddr(), own, want, bt, int64(s.spec.KVBytesPerToken()))
	if !worth {
		s.cache.NotePullSkipped()
		return nil
	}
	return &pullPlan{peer: peer, hashes: p.hashes, own: own, maxBlocks: maxHit, giveUp: giveUp}
}

// pullPrefix pulls plan's prefix of request id's prompt from its peer,
// given up after plan.giveUp (the time computing it would take) or when
// ctx ends. It returns nil when the pull failed (logged and counted: the
// prompt is computed, with the same tokens). No lock is held: it is
// network I/O.
func (s *Server) pullPrefix(ctx context.Context, id string, plan *pullPlan) *prefixcache.Pulled {
	peer := plan.peer
	if plan.giveUp > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, plan.giveUp)
		defer cancel()
	}
	ctx = grpcauth.CredentialContext(ctx, peer.GetCredential())
	t0 := s.now()
	p, err := s.dialer.Pull(ctx, kvtransfer.PullRequest{
		RequestID: id, Addr: peer.GetAddr(), ID: peer.GetId(), Role: peer.GetRole(),
		Hashes: plan.hashes, BlockTokens: s.cache.BlockTokens(), MinBlocks: plan.own + 1, MaxBlocks: plan.maxBlocks, Spec: s.spec,
		TokenBytes: s.tokenBytes, // the engine's payload: scaled down on sim
	})
	if err == nil && p.Tokens == 0 {
		err = errors.New("the peer no longer holds the prefix")
	}
	if err != nil {
		s.cache.NotePull(nil, err)
		s.log.Info("peer pull failed; computing the prefix", zap.String("request_id", id),
			zap.String("peer", peer.GetId()), zap.Int("own_blocks", plan.own), zap.Error(err))
		return nil
	}
	s.peers.ObservePull(peer.GetAddr(), int64(p.Tokens)*int64(s.spec.KVBytesPerToken()), p.Took)
	out := &prefixcache.Pulled{Tokens: p.Tokens, Layers: p.Layers, Tier: p.Tier, Took: s.now().Sub(t0)}
	s.cache.NotePull(out, nil)
	return out
}

// pullDone ends root q's pull with pulled (nil: none) and hands q to the
// runner (readyLocked), which imports pulled when the sequence starts
// (forkCachedLocked). A request that ended meanwhile drops it.
func (s *Server) pullDone(q *sequence, pulled *prefixcache.Pulled) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q.pulling = false
	if q.done {
		return
	}
	s.rn.mu.Lock()
	q.pulled = pulled
	s.rn.mu.Unlock()
	s.readyLocked(q)
}
