// Package prefixoverlap is a router scorer that favours workers holding
// the request's prompt prefix in their cache.
//
// Contract: the score of a candidate is the fraction of the request's
// full prompt blocks it holds, PrefixHitBlocks / len(Request.PrefixHashes),
// in [0, 1] (the leading blocks only: the match stops at the first miss,
// since the hashes are chained). A request without hashes scores 0
// everywhere.
package prefixoverlap

import "github.com/pdserve/pdserve/pkg/router/framework"

// Scorer scores prefix-cache overlap. The zero value is ready; safe for
// concurrent use.
type Scorer struct{}

var _ framework.Scorer = (*Scorer)(nil)

// Name implements framework.Plugin.
func (*Scorer) Name() string { return "prefix" }

// Score implements framework.Scorer.
func (*Scorer) Score(in *framework.Input, cs []framework.Candidate, scores []float64) {
	n := len(in.Request.PrefixHashes)
	for i, c := range cs {
		if n == 0 {
			scores[i] = 0
			continue
		}
		scores[i] = float64(min(max(c.PrefixHitBlocks, 0), n)) / float64(n)
	}
}
