// Package kvpressure is a router scorer that favours workers with a larger
// share of free KV blocks.
//
// Contract: with f the candidate's estimated free blocks
// (Load.KVBlocksFree, negative counted as 0) and t its Worker.KVBlocksTotal,
// the score is f/t clamped to [0, 1]. A worker that reports no total
// (t ≤ 0) is scored f/fmax, fmax being the most free blocks of such
// candidates (0 when fmax is 0), so that among them the most free blocks
// win.
package kvpressure

import "github.com/pdserve/pdserve/pkg/router/framework"

// Scorer scores free KV blocks. The zero value is ready; safe for
// concurrent use.
type Scorer struct{}

var _ framework.Scorer = (*Scorer)(nil)

// Name implements framework.Plugin.
func (*Scorer) Name() string { return "kv" }

// Score implements framework.Scorer.
func (*Scorer) Score(_ *framework.Input, cs []framework.Candidate, scores []float64) {
	fmax := 0
	for _, c := range cs {
		if c.Worker.KVBlocksTotal <= 0 {
			fmax = max(fmax, c.Load.KVBlocksFree)
		}
	}
	for i, c := range cs {
		f := max(c.Load.KVBlocksFree, 0)
		switch t := c.Worker.KVBlocksTotal; {
		case t > 0:
			scores[i] = min(float64(f)/float64(t), 1)
		case fmax > 0:
			scores[i] = float64(f) / float64(fmax)
		default:
			scores[i] = 0
		}
	}
}
