package prefill

import (
	"context"
	"errors"

	"go.uber.org/zap"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// PeerPullCost is the time this worker takes to pull a token of a
// cached prefix from a peer over the time it takes to compute it, for
// its heartbeat (control.Heartbeat.PeerPullCost): 0 when it does not
// pull or has measured no step.
func (s *Server) PeerPullCost() float64 {
	if s.cache == nil {
		return 0
	}
	return s.peers.CostRatio(int64(s.spec.KVBytesPerToken()))
}

// ExportPrefix implements kvtransfer.PullSource: a peer's pull of a
// prefix this worker's cache holds in any tier (prefixcache.Export, the
// engine lock taken a layer at a time).
func (s *Server) ExportPrefix(_ context.Context, hashes []kv.Hash, minBlocks, maxBlocks int) (kvtransfer.PrefixKV, error) {
	lock := func() func() {
		s.run.LockEngine()
		return s.run.UnlockEngine
	}
	x, err := s.cache.Export(s.fcfs.eng, lock, hashes, minBlocks, maxBlocks)
	return kvtransfer.PrefixKV{Tokens: x.Tokens, Tier: x.Tier, Layers: x.Layers}, err
}

// pullPrefix pulls the prefix of req's prompt that req.peer holds, when
// the peer holds more of it than this worker's cache in any tier and the
// link model says the pull is faster than computing it: its time is the
// pull's size (the model's true KV size) over the link to the peer (what
// past pulls from it achieved, or --peer-link-gbps), against the worker's
// measured prefill throughput; a pull that runs past the time computing
// would take is given up. It returns nil when it does not pull, or the
// pull failed (logged and counted: the prompt is computed, with the same
// tokens).
func (s *Server) pullPrefix(ctx context.Context, req *pdservev1.PrefillRequest) *prefixcache.Pulled {
	peer := req.GetPeer()
	if peer == nil || s.cache == nil || !s.peers.On() || peer.GetAddr() == "" {
		return nil
	}
	prompt := req.GetPromptTokens()
	maxHit := s.cache.MaxHitBlocks(len(prompt))
	bt := s.cache.BlockTokens()
	want := min(int(peer.GetTokens())/bt, maxHit)
	if want <= 0 || len(prompt) >= s.spec.MaxSeqLen {
		return nil
	}
	hashes := s.cache.Hashes(prompt)
	own := s.cache.PeerDepth(hashes, maxHit)
	if want <= own {
		return nil
	}
	tokens := (want - own) * bt
	worth, giveUp := s.peers.Price(peer.GetAddr(), own, want, bt, int64(s.spec.KVBytesPerToken()))
	if !worth {
		s.cache.NotePullSkipped()
		return nil
	}
	if giveUp > 0 {
		// Give up once the pull took what computing would have.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, giveUp)
		defer cancel()
	}
	ctx = grpcauth.CredentialContext(ctx, peer.GetCredential())
	s.mu.Lock()
	tb := s.tokenBytes // the engine's payload: scaled down on sim
	s.mu.Unlock()
	t0 := s.now()
	p, err := s.dialer.Pull(ctx, kvtransfer.PullRequest{
		RequestID: req.GetRequestId(), Addr: peer.GetAddr(), ID: peer.GetId(), Role: peer.GetRole(),
		Hashes: hashes, BlockTokens: bt, MinBlocks: own + 1, MaxBlocks: maxHit, Spec: s.spec, TokenBytes: tb,
	})
	if err == nil && p.Tokens == 0 {
		err = errors.New("the peer no longer holds the prefix")
	}
	if err != nil {
		s.cache.NotePull(nil, err)
		s.log.Info("peer pull failed; computing the prefix", zap.String("request_id", req.GetRequestId()),
			zap.String("peer", peer.GetId()), zap.Int("tokens", tokens), zap.Error(err))
		return nil
	}
	s.peers.ObservePull(peer.GetAddr(), int64(p.Tokens)*int64(s.spec.KVBytesPerToken()), p.Took)
	out := &prefixcache.Pulled{Tokens: p.Tokens, Layers: p.Layers, Tier: p.Tier, Took: s.now().Sub(t0)}
	s.cache.NotePull(out, nil)
	return out
}
