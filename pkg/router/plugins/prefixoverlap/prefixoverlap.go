// Package prefixoverlap is a router scorer that favours workers holding
// the request's prompt prefix in their cache, by the time they take to
// serve it from where they hold it.
//
// Contract: the score of a candidate is the share of the time computing
// the request's full prompt blocks would take that the worker saves,
// 1 − cost / n, in [0, 1], with n = len(Request.PrefixHashes) and cost in
// units of one block's computation: the blocks it holds in engine memory
// (PrefixHitBlocks) cost nothing, the further ones its host tier holds
// (HostHitBlocks beyond PrefixHitBlocks) cost HostCost each (their load
// over the host link), the further ones its disk tier holds
// (DiskHitBlocks beyond both) DiskCost each (their read from disk, then
// their load), the rest 1 (recomputed). Only leading blocks count: the
// match stops at the first miss, since the hashes are chained. Without
// host and disk tiers the score is PrefixHitBlocks / n. A request without
// hashes scores 0 everywhere. With HostCost < DiskCost < 1, a worker
// holding a prefix in engine memory scores above one holding it in its
// host tier, which scores above one holding it on disk, which scores above
// one recomputing it.
//
// A worker that pulls prefixes from peers (Worker.PeerPullCost > 0) may
// instead pull the deepest prefix another worker holds in any tier
// (Candidate.PeerHitBlocks), each block of it costing PeerPullCost, the
// rest recomputed; its cost is the cheaper of the two ways. So a worker
// that holds nothing still scores PeerHitBlocks × (1 − PeerPullCost) / n
// when a peer holds the prefix, and load can send a prompt away from the
// worker holding its prefix without recomputing it.
//
// Each block is charged at the cheapest tier holding it. A worker loads a
// prefix deeper in a lower tier than in engine memory wholly from that
// tier (prefixcache.Host.Load), blocks its engine holds included, so the
// cost is a lower bound where the tiers overlap.
package prefixoverlap

import "github.com/pdserve/pdserve/pkg/router/framework"

// DefaultHostCost is Scorer.HostCost's default: loading a block's KV over
// PCIe Gen5 x16 (64 GB/s) against computing it, for llama-3-8b on an H100
// (128 KiB of KV a token: 2.0 µs; 2 × 8.0e9 FLOP a token at 66% of 989
// TFLOP/s: 24.6 µs), about 0.08. Models with grouped-query attention keep
// about that ratio of KV bytes to parameters.
const DefaultHostCost = 0.08

// DefaultDiskCost is Scorer.DiskCost's default: reading a block's KV from
// one NVMe SSD (PCIe Gen4 x4 drives are rated about 7 GB/s sequential
// read) and then loading it over the host link, as the disk tier does
// (the file read into host memory, then imported), against computing it,
// for the same llama-3-8b on an H100 as DefaultHostCost: 128 KiB a token
// is 131072 B / 7 GB/s = 18.7 µs read plus 2.0 µs over PCIe Gen5 x16
// (64 GB/s) = 20.8 µs, against 24.6 µs to compute: about 0.85. A disk
// block saves 15% of its computation where a host block saves 92%; a
// faster array of drives lowers it (four such drives striped: 4.7 + 2.0 =
// 6.7 µs, 0.27).
const DefaultDiskCost = 0.85

// Scorer scores prefix-cache overlap. The zero value is ready; safe for
// concurrent use.
type Scorer struct {
	// HostCost is the time to load one block from a worker's host tier
	// over computing it, in (0, 1]; 0 means DefaultHostCost, above 1
	// counts as 1.
	HostCost float64
	// DiskCost is the time to read one block from a worker's disk tier
	// and load it over computing it, in (0, 1]; 0 means DefaultDiskCost,
	// above 1 counts as 1, below HostCost as HostCost (a disk block
	// crosses the host link too).
	DiskCost float64
}

var _ framework.Scorer = (*Scorer)(nil)

// Name implements framework.Plugin.
func (*Scorer) Name() string { return "prefix" }

// Score implements framework.Scorer.
func (s *Scorer) Score(in *framework.Input, cs []framework.Candidate, scores []float64) {
	n := len(in.Request.PrefixHashes)
	for i, c := range cs {
		if n == 0 {
			scores[i] = 0
			continue
		}
		cost, _ := s.Serve(c, n)
		scores[i] = max(1-cost/float64(n), 0)
	}
}

// Serve returns what serving the leading n blocks of a request's prompt
// costs candidate c, in units of one block's computation, and how many
// of them it serves without computing them: from its own tiers (engine
// free, host HostCost, disk DiskCost a block, the rest computed), or,
// when that costs less, pulled from the deepest peer
// (Candidate.PeerHitBlocks at Worker.PeerPullCost a block: a pull
// brings the whole prefix, the blocks c holds included, as the worker's
// own choice does) and the rest computed. The worker pulls only when
// its link model says the pull is faster, so the cost is the cheaper of
// the two.
func (s *Scorer) Serve(c framework.Candidate, n int) (cost float64, served int) {
	if n <= 0 {
		return 0, 0
	}
	hc := s.HostCost
	if !(hc > 0) {
		hc = DefaultHostCost
	}
	hc = min(hc, 1)
	dc := s.DiskCost
	if !(dc > 0) {
		dc = DefaultDiskCost
	}
	dc = min(max(dc, hc), 1)
	engine := min(max(c.PrefixHitBlocks, 0), n)
	host := max(min(c.HostHitBlocks, n)-engine, 0)
	disk := max(min(c.DiskHitBlocks, n)-engine-host, 0)
	served = engine + host + disk
	cost = float64(host)*hc + float64(disk)*dc + float64(n-served)
	if peer := min(c.PeerHitBlocks, n); peer > served && c.Worker.PeerPullCost > 0 {
		if pc := float64(peer)*min(c.Worker.PeerPullCost, 1) + float64(n-peer); pc < cost {
			return pc, peer
		}
	}
	return cost, served
}
