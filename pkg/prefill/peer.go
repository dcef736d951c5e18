package prefill

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// rateAlpha is the weight of a step's prefill throughput in the moving
// average pulls are priced against.
const rateAlpha = 0.2

// peerPulls is what the worker knows to price a pull against computing
// the prefix: its own prefill throughput, measured over its steps, and
// the links to its peers, measured over its pulls. Safe for concurrent
// use.
type peerPulls struct {
	gbps  float64               // the link assumed to an unmeasured peer; 0: no pulls
	links *kvtransfer.LinkStats // true KV bytes per second of past pulls, by peer address

	// always makes every pull worth it, whatever the estimate: tests of
	// the pull itself, on engines far faster than their loopback links.
	always bool

	mu   sync.Mutex
	rate float64 // prompt tokens computed per second of step time; 0: not measured
}

// observeStep adds a step that computed tokens prompt tokens in d.
func (p *peerPulls) observeStep(tokens int, d time.Duration) {
	if tokens <= 0 || d <= 0 {
		return
	}
	r := float64(tokens) / d.Seconds()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rate == 0 {
		p.rate = r
	} else {
		p.rate += rateAlpha * (r - p.rate)
	}
}

// estimate returns how long pulling tokens of KV (bytes: its true size)
// from addr and computing them would take; compute is 0 while the
// worker has measured no step.
func (p *peerPulls) estimate(addr string, tokens int, bytes int64) (pull, compute time.Duration) {
	bps := p.gbps * 1e9 / 8
	if m, n := p.links.Throughput(addr); n > 0 && m > 0 {
		bps = m
	}
	pull = time.Duration(float64(bytes) / bps * float64(time.Second))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rate > 0 {
		compute = time.Duration(float64(tokens) / p.rate * float64(time.Second))
	}
	return pull, compute
}

// costRatio returns the time to pull one token of KV (bytesPerToken, its
// true size) over the time to compute it: over the mean throughput of
// the peers pulled from so far, or the assumed link while none was,
// against the measured prefill throughput. 0 when pulls are off or no
// step was measured yet.
func (p *peerPulls) costRatio(bytesPerToken int64) float64 {
	if p.gbps <= 0 || bytesPerToken <= 0 {
		return 0
	}
	bps := p.gbps * 1e9 / 8
	if m := p.links.MeanThroughput(); m > 0 {
		bps = m
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return float64(bytesPerToken) / bps * p.rate
}

// PeerPullCost is the time this worker takes to pull a token of a
// cached prefix from a peer over the time it takes to compute it, for
// its heartbeat (control.Heartbeat.PeerPullCost): 0 when it does not
// pull or has measured no step.
func (s *Server) PeerPullCost() float64 {
	if s.cache == nil {
		return 0
	}
	return s.peers.costRatio(int64(s.spec.KVBytesPerToken()))
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
	if peer == nil || s.cache == nil || s.peers.gbps <= 0 || peer.GetAddr() == "" {
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
	pull, compute := s.peers.estimate(peer.GetAddr(), want*bt, int64(want*bt)*int64(s.spec.KVBytesPerToken()))
	// A pull brings the whole prefix (the peer sends from token 0); it
	// saves computing the blocks this worker lacks.
	saved := compute * time.Duration(want-own) / time.Duration(want)
	if compute > 0 && pull >= saved && !s.peers.always {
		s.cache.NotePullSkipped()
		return nil
	}
	if compute > 0 {
		// Give up once the pull took what computing would have.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, max(saved, 50*time.Millisecond))
		defer cancel()
	}
	ctx = grpcauth.CredentialContext(ctx, peer.GetCredential())
	t0 := s.now()
	p, err := s.dialer.Pull(ctx, kvtransfer.PullRequest{
		RequestID: req.GetRequestId(), Addr: peer.GetAddr(), ID: peer.GetId(), Role: peer.GetRole(),
		Hashes: hashes, BlockTokens: bt, MinBlocks: own + 1, MaxBlocks: maxHit, Spec: s.spec,
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
	s.peers.links.Observe(peer.GetAddr(), int64(p.Tokens)*int64(s.spec.KVBytesPerToken()), p.Took, false)
	out := &prefixcache.Pulled{Tokens: p.Tokens, Layers: p.Layers, Tier: p.Tier, Took: s.now().Sub(t0)}
	s.cache.NotePull(out, nil)
	return out
}
