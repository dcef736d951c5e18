// Package peerpull is a worker's side of a peer pull, shared by prefill
// workers and by decode workers prefilling a prompt themselves: given
// the peer the coordinator named for a prompt (api PeerPrefix), it
// decides with the worker's kvtransfer.PullPricer whether pulling the
// peer's cached prefix beats computing it (Plan), and pulls it over the
// KV data plane (Pull), counting both in the worker's prefix cache.
// A pull that fails is logged and counted, and the prompt is computed,
// with the same tokens.
package peerpull

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// Puller pulls cached prefixes from peers for one worker: a view of the
// worker's own parts, which a worker builds when it needs one. Safe for
// concurrent use.
type Puller struct {
	Cache  *prefixcache.Cache     // the worker's; nil: no pulls
	Pricer *kvtransfer.PullPricer // the worker's link and compute model
	Dialer *kvtransfer.Dialer     // nil: no pulls
	Spec   engine.ModelSpec       // the puller's model
	Log    *zap.Logger            // not nil
	Now    func() time.Time       // not nil
}

// Plan is a pull a request makes before its prompt is computed.
type Plan struct {
	peer      *pdservev1.PeerPrefix
	hashes    []kv.Hash
	own       int           // blocks the worker's tiers hold
	maxBlocks int           // blocks the prompt may take from a cache
	giveUp    time.Duration // 0: no limit but the caller's
}

// Plan decides whether a prompt of promptLen tokens (its block hashes
// hashes) pulls its prefix from peer: when the peer holds more of it
// than any tier of the worker's cache (PeerDepth) and the link model
// says the pull is faster than computing the blocks the worker lacks.
// It returns nil when it does not pull (counted as skipped when only the
// price said no). No lock is held.
func (p Puller) Plan(peer *pdservev1.PeerPrefix, promptLen int, hashes []kv.Hash) *Plan {
	if peer == nil || p.Cache == nil || p.Dialer == nil || !p.Pricer.On() || peer.GetAddr() == "" || promptLen >= p.Spec.MaxSeqLen {
		return nil
	}
	maxHit := p.Cache.MaxHitBlocks(promptLen)
	bt := p.Cache.BlockTokens()
	want := min(int(peer.GetTokens())/bt, maxHit)
	if want <= 0 {
		return nil
	}
	own := p.Cache.PeerDepth(hashes, maxHit)
	if want <= own {
		return nil
	}
	worth, giveUp := p.Pricer.Price(peer.GetAddr(), own, want, bt, int64(p.Spec.KVBytesPerToken()))
	if !worth {
		p.Cache.NotePullSkipped()
		return nil
	}
	return &Plan{peer: peer, hashes: hashes, own: own, maxBlocks: maxHit, giveUp: giveUp}
}

// Pull pulls plan's prefix of request id's prompt from its peer,
// checking the KV against tokenBytes (the bytes of a token in a layer
// the worker's engine hands out: scaled down on sim), given up after the
// time computing it would take or when ctx ends. It returns nil when the
// pull failed (logged and counted). No lock is held: it is network I/O.
func (p Puller) Pull(ctx context.Context, id string, plan *Plan, tokenBytes int) *prefixcache.Pulled {
	peer := plan.peer
	if plan.giveUp > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, plan.giveUp)
		defer cancel()
	}
	ctx = grpcauth.CredentialContext(ctx, peer.GetCredential())
	t0 := p.Now()
	got, err := p.Dialer.Pull(ctx, kvtransfer.PullRequest{
		RequestID: id, Addr: peer.GetAddr(), ID: peer.GetId(), Role: peer.GetRole(),
		Hashes: plan.hashes, BlockTokens: p.Cache.BlockTokens(), MinBlocks: plan.own + 1, MaxBlocks: plan.maxBlocks,
		Spec: p.Spec, TokenBytes: tokenBytes,
	})
	if err == nil && got.Tokens == 0 {
		err = errors.New("the peer no longer holds the prefix")
	}
	if err != nil {
		p.Cache.NotePull(nil, err)
		p.Log.Info("peer pull failed; computing the prefix", zap.String("request_id", id),
			zap.String("peer", peer.GetId()), zap.Int("own_blocks", plan.own), zap.Error(err))
		return nil
	}
	p.Pricer.ObservePull(peer.GetAddr(), int64(got.Tokens)*int64(p.Spec.KVBytesPerToken()), got.Took, got.FirstByte)
	out := &prefixcache.Pulled{Tokens: got.Tokens, Layers: got.Layers, Tier: got.Tier, Took: p.Now().Sub(t0)}
	p.Cache.NotePull(out, nil)
	return out
}

// CostRatio is the time the worker takes to pull a token of a cached
// prefix over the time it takes to compute it, for its heartbeat
// (control.Heartbeat.PeerPullCost): 0 when it does not pull (no cache,
// no dialer, pulls off) or has measured no prefill step.
func (p Puller) CostRatio() float64 {
	if p.Cache == nil || p.Dialer == nil {
		return 0
	}
	return p.Pricer.CostRatio(int64(p.Spec.KVBytesPerToken()))
}
