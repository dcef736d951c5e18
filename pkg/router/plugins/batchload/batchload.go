// Package batchload is a router scorer that favours workers running
// smaller batches.
//
// Contract: with b the candidate's estimated running batch
// (Load.RunningBatch, negative counted as 0) and bmax the largest among
// the candidates, the score is 1 − b/bmax, in [0, 1]; every candidate
// scores 1 when bmax is 0. (Heartbeats carry no batch limit, so the
// largest batch seen stands for the maximum.)
package batchload

import "github.com/pdserve/pdserve/pkg/router/framework"

// Scorer scores the running batch. The zero value is ready; safe for
// concurrent use.
type Scorer struct{}

var _ framework.Scorer = (*Scorer)(nil)

// Name implements framework.Plugin.
func (*Scorer) Name() string { return "batch" }

// Score implements framework.Scorer.
func (*Scorer) Score(_ *framework.Input, cs []framework.Candidate, scores []float64) {
	framework.RelativeLoad(cs, scores, func(c framework.Candidate) int { return c.Load.RunningBatch })
}
