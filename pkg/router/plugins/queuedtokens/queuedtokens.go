// Package queuedtokens is a router scorer that favours workers with fewer
// queued prefill tokens.
//
// Contract: with q the candidate's estimated queued prefill tokens
// (Load.QueuedPrefillTokens, negative counted as 0) and qmax the largest
// among the candidates, the score is 1 − q/qmax, in [0, 1]: 1 for an
// empty queue, 0 for the longest; every candidate scores 1 when qmax is 0.
// The score is relative to the candidates, so a weight trades a fraction
// of the longest queue against the other scorers.
package queuedtokens

import "github.com/pdserve/pdserve/pkg/router/framework"

// Scorer scores queued prefill tokens. The zero value is ready; safe for
// concurrent use.
type Scorer struct{}

var _ framework.Scorer = (*Scorer)(nil)

// Name implements framework.Plugin.
func (*Scorer) Name() string { return "queue" }

// Score implements framework.Scorer.
func (*Scorer) Score(_ *framework.Input, cs []framework.Candidate, scores []float64) {
	framework.RelativeLoad(cs, scores, func(c framework.Candidate) int { return c.Load.QueuedPrefillTokens })
}
