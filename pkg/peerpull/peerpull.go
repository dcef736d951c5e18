// Package peerpull is a worker's side of a peer pull, shared by prefill
// workers and by decode workers prefilling a prompt themselves: given
// the peer the coordinator named for a prompt (api PeerPrefix), it
// decides with the worker's kvtransfer.PullPricer whether pulling the
// peer's cached prefix beats computing it (Plan), and pulls it over the
// KV data plane (Pull), counting both in the worker's prefix cache.
// A pull that fails is logged and counted, and the prompt is computed,
// with the same tokens.
//
// Pulled KV is tagged with its peer (prefixcache.Pulled.Source). With a
// Check, sampled blocks of each pull are recomputed here and compared
// (Verify): a pull that matches is Verified, and its KV may be cached,
// exported and advertised as the worker's own, tagged with the peer; one
// that does not is dropped (the prompt is computed here), counted, and
// its peer is no longer pulled from (Trust). Without a check, pulled KV
// is unverified: it serves its own request only.
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
	// Check spot-checks pulls (nil or off: pulled KV is unverified).
	Check *Check
	// Trust holds the peers that failed a spot check, which Plan skips
	// (nil: none is skipped).
	Trust *Trust
	// Distrusted, when set, is called once for a peer that failed a spot
	// check, after Trust marked it (the worker drops the entries it
	// cached from it: prefixcache.Cache.DropSource).
	Distrusted func(peer string)
}

// Plan is a pull a request makes before its prompt is computed.
type Plan struct {
	peer      *pdservev1.PeerPrefix
	hashes    []kv.Hash
	own       int           // blocks the worker's tiers hold
	maxBlocks int           // blocks the prompt may take from a cache
	giveUp    time.Duration // 0: no limit but the caller's
	prompt    []int32       // for the spot check; nil: none (PlanPrompt)
}

// PlanPrompt is Plan of prompt, which the pull's spot check (Check)
// recomputes blocks of; a Plan made without it is never checked.
func (p Puller) PlanPrompt(peer *pdservev1.PeerPrefix, prompt []int32, hashes []kv.Hash) *Plan {
	pl := p.Plan(peer, len(prompt), hashes)
	if pl != nil {
		pl.prompt = prompt
	}
	return pl
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
	if p.Trust != nil && !p.Trust.Trusted(peer.GetId()) {
		// It sent KV that failed a spot check: the prompt is computed.
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
// time computing it would take or when ctx ends, then spot-checks it
// with Check when the plan has its prompt (PlanPrompt): the check takes
// the engine lock for its prefill. It returns nil when the pull failed or
// its check did not match (logged and counted); what it returns is
// tagged with the peer, and Verified when checked. No lock is held
// during the transfer: it is network I/O.
func (p Puller) Pull(ctx context.Context, id string, plan *Plan, tokenBytes int) *prefixcache.Pulled {
	peer := plan.peer
	// The give-up time bounds the transfer; the spot check after it is
	// bounded by ctx alone (a prefill of a few blocks here).
	pctx := ctx
	if plan.giveUp > 0 {
		var cancel context.CancelFunc
		pctx, cancel = context.WithTimeout(ctx, plan.giveUp)
		defer cancel()
	}
	pctx = grpcauth.CredentialContext(pctx, peer.GetCredential())
	t0 := p.Now()
	got, err := p.Dialer.Pull(pctx, kvtransfer.PullRequest{
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
	out := &prefixcache.Pulled{Tokens: got.Tokens, Layers: got.Layers, Tier: got.Tier, Took: p.Now().Sub(t0), Source: peer.GetId()}
	if p.Check.On() && plan.prompt != nil {
		if err := p.check(ctx, id, plan, out); err != nil {
			p.Cache.NotePull(nil, err)
			return nil
		}
	}
	p.Cache.NotePull(out, nil)
	return out
}

// check spot-checks out, pulled for plan (Check): nil when its sampled
// blocks match (out is then Verified), else the reason the pull is
// dropped. A mismatch distrusts the peer (logged, counted, Distrusted
// called once); an engine failure does not.
func (p Puller) check(ctx context.Context, id string, plan *Plan, out *prefixcache.Pulled) error {
	bt := p.Cache.BlockTokens()
	n := out.Tokens / bt * bt
	if n <= 0 {
		return errors.New("the peer sent less than a block")
	}
	blocks := SampleBlocks(n/bt, p.Check.Blocks, p.Check.IntN)
	t0 := p.Now()
	ok, recomputed, err := Verify(ctx, p.Check.Engine, p.Check.Lock, plan.prompt, out.Layers, out.Tokens, bt, blocks)
	took := p.Now().Sub(t0)
	out.Took += took
	if err != nil {
		p.Log.Warn("spot check of a peer pull failed to run; computing the prefix", zap.String("request_id", id),
			zap.String("peer", out.Source), zap.Error(err))
		return err
	}
	p.Cache.NoteCheck(ok, recomputed, took)
	if ok {
		out.Verified = true
		return nil
	}
	if p.Trust != nil && p.Trust.Distrust(out.Source, p.Now()) && p.Distrusted != nil {
		p.Distrusted(out.Source)
	}
	p.Log.Warn("a peer's pulled KV failed the spot check: dropped, the prefix computed here, the peer no longer pulled from",
		zap.String("request_id", id), zap.String("peer", out.Source), zap.String("peer_addr", plan.peer.GetAddr()),
		zap.Int("pulled_tokens", out.Tokens), zap.Ints("blocks_checked", blocks))
	return errPoisoned
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
