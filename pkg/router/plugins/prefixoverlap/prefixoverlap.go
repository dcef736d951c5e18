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
// over the host link), the rest 1 (recomputed). Only leading blocks count:
// the match stops at the first miss, since the hashes are chained. Without
// a host tier the score is PrefixHitBlocks / n. A request without hashes
// scores 0 everywhere.
package prefixoverlap

import "github.com/pdserve/pdserve/pkg/router/framework"

// DefaultHostCost is Scorer.HostCost's default: loading a block's KV over
// PCIe Gen5 x16 (64 GB/s) against computing it, for llama-3-8b on an H100
// (128 KiB of KV a token: 2.0 µs; 2 × 8.0e9 FLOP a token at 66% of 989
// TFLOP/s: 24.6 µs), about 0.08. Models with grouped-query attention keep
// about that ratio of KV bytes to parameters.
const DefaultHostCost = 0.08

// Scorer scores prefix-cache overlap. The zero value is ready; safe for
// concurrent use.
type Scorer struct {
	// HostCost is the time to load one block from a worker's host tier
	// over computing it, in (0, 1]; 0 means DefaultHostCost, above 1
	// counts as 1.
	HostCost float64
}

var _ framework.Scorer = (*Scorer)(nil)

// Name implements framework.Plugin.
func (*Scorer) Name() string { return "prefix" }

// Score implements framework.Scorer.
func (s *Scorer) Score(in *framework.Input, cs []framework.Candidate, scores []float64) {
	n := len(in.Request.PrefixHashes)
	hc := s.HostCost
	if !(hc > 0) {
		hc = DefaultHostCost
	}
	hc = min(hc, 1)
	for i, c := range cs {
		if n == 0 {
			scores[i] = 0
			continue
		}
		engine := min(max(c.PrefixHitBlocks, 0), n)
		host := max(min(c.HostHitBlocks, n)-engine, 0)
		scores[i] = max(1-(float64(host)*hc+float64(n-engine-host))/float64(n), 0)
	}
}
