package kvtransfer

import (
	"sync"
	"time"
)

// DefaultPeerLinkGbps is the link a pull from a peer is priced at until
// pulls from it were measured (--peer-link-gbps): a 100 Gb/s NIC, the
// smallest of GPU nodes' data links (H100 and H200 nodes usually have
// 200-400 Gb/s a GPU).
const DefaultPeerLinkGbps = 100

// rateAlpha is the weight of a step's prefill throughput in the moving
// average pulls are priced against.
const rateAlpha = 0.2

// DefaultPullFixed is a pull's fixed cost (dialing, the credential's
// check, the peer's first byte) assumed of a peer until a pull from it
// was measured: a gRPC stream's round trips on a data-center network.
// Measured pulls replace it (ObservePull's first byte).
const DefaultPullFixed = time.Millisecond

// minPullWait is the least time a pull is given before it is given up,
// however fast computing the prefix would be: a pull's round trips.
const minPullWait = 50 * time.Millisecond

// PullPricer is what a worker knows to price a pull of a cached prefix
// from a peer worker against computing the prefix itself: its own
// prefill throughput, measured over its steps (ObserveStep), and the
// links to its peers, measured over its pulls (ObservePull). Both worker
// roles use it: a prefill worker for PrefillRequest.peer, a decode worker
// for a local prefill's GenerateRequest.peer. It reads no clock. Safe for
// concurrent use; Gbps and Always are set before first use.
type PullPricer struct {
	// Gbps is the link assumed to a peer no pull was measured from
	// (--peer-link-gbps); 0: the worker pulls nothing. ≥ 0.
	Gbps float64
	// Always makes every pull worth it and waited for (no give-up time),
	// whatever the estimate: tests of the pull itself, on engines far
	// faster than their loopback links, whose pulls take the time a
	// loaded machine gives them.
	Always bool

	links *LinkStats // true KV bytes per second of past pulls, by peer address

	mu   sync.Mutex
	rate float64 // prompt tokens computed per second of step time; 0: not measured
	// fixed is each peer's measured fixed cost of a pull (a moving
	// average of the time to the first byte), by address.
	fixed map[string]time.Duration
}

// NewPullPricer returns a pricer assuming a link of gbps Gbit/s to a
// peer until pulls from it were measured (0: pulls off), with nothing
// measured.
func NewPullPricer(gbps float64) *PullPricer {
	return &PullPricer{Gbps: gbps, links: NewLinkStats(DefaultLinkAlpha)}
}

// On reports whether the worker pulls at all (Gbps > 0). Nil: false.
func (p *PullPricer) On() bool { return p != nil && p.Gbps > 0 }

// ObserveStep adds a step that computed tokens prompt tokens in d to the
// measured prefill throughput (a moving average); a step of no tokens,
// or of d ≤ 0, is ignored.
func (p *PullPricer) ObserveStep(tokens int, d time.Duration) {
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

// ObservePull adds a pull from addr that brought bytes of KV (its true
// size) in d to that link's measure (LinkStats: a pull of
// fewer than MinLinkSampleBytes does not count), and its time to the
// first byte (dial, credential, the peer's header; ≤ d) to the peer's
// fixed cost, which every pull pays however few its bytes.
func (p *PullPricer) ObservePull(addr string, bytes int64, d, firstByte time.Duration) {
	p.links.Observe(addr, bytes, d, false)
	if firstByte < 0 || firstByte > d {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fixed == nil {
		p.fixed = make(map[string]time.Duration)
	}
	if f, ok := p.fixed[addr]; ok {
		p.fixed[addr] = f + time.Duration(rateAlpha*float64(firstByte-f))
	} else if len(p.fixed) < maxFixedPeers {
		p.fixed[addr] = firstByte
	}
}

// maxFixedPeers bounds the peers whose fixed cost is kept.
const maxFixedPeers = 4096

// Estimate returns how long pulling tokens of KV (bytes: its true size)
// from addr and computing them would take: the pull's fixed cost (the
// first byte of past pulls from addr, or DefaultPullFixed) plus its
// bytes over what past pulls from addr achieved, or Gbps; compute is 0
// while no step was measured.
// With Gbps 0 pull is 0 too: nothing is pulled.
func (p *PullPricer) Estimate(addr string, tokens int, bytes int64) (pull, compute time.Duration) {
	if p.Gbps <= 0 {
		return 0, 0
	}
	bps := p.Gbps * 1e9 / 8
	if m, n := p.links.Throughput(addr); n > 0 && m > 0 {
		bps = m
	}
	pull = time.Duration(float64(bytes) / bps * float64(time.Second))
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.fixed[addr]; ok {
		pull += f
	} else {
		pull += DefaultPullFixed
	}
	if p.rate > 0 {
		compute = time.Duration(float64(tokens) / p.rate * float64(time.Second))
	}
	return pull, compute
}

// Price decides a pull from addr of a prompt's prefix of want blocks
// (of blockTokens tokens, tokenBytes of KV a token at its true size),
// of which the worker's own tiers hold own: a pull brings the whole
// prefix (the peer sends from token 0) and saves computing the want −
// own blocks the worker lacks. It reports whether the pull is worth it
// (it is while no step was measured: computing's cost is unknown; never
// when want ≤ own or pulls are off) and how long to wait for it before
// giving up and computing the prefix: the time computing would have
// taken, at least 50 ms (0: no limit, compute not measured, or Always).
func (p *PullPricer) Price(addr string, own, want, blockTokens int, tokenBytes int64) (worth bool, giveUp time.Duration) {
	if !p.On() || want <= own || want <= 0 {
		return false, 0
	}
	pull, compute := p.Estimate(addr, want*blockTokens, int64(want*blockTokens)*tokenBytes)
	saved := compute * time.Duration(want-own) / time.Duration(want)
	if compute > 0 && pull >= saved && !p.Always {
		return false, 0
	}
	if compute > 0 && !p.Always {
		giveUp = max(saved, minPullWait)
	}
	return true, giveUp
}

// CostRatio returns the time to pull one token of KV (tokenBytes, its
// true size) from a peer over the time to compute it here: over the mean
// of the throughputs measured from the peers pulled from so far, or Gbps
// while none was, against the measured prefill throughput. 0 when pulls
// are off, tokenBytes ≤ 0 or no step was measured yet. A router credits
// the worker with a peer's blocks at this cost a block.
func (p *PullPricer) CostRatio(tokenBytes int64) float64 {
	if !p.On() || tokenBytes <= 0 {
		return 0
	}
	bps := p.Gbps * 1e9 / 8
	if m := p.links.MeanThroughput(); m > 0 {
		bps = m
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return float64(tokenBytes) / bps * p.rate
}
