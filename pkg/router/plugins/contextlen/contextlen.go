// Package contextlen is a router filter that keeps the workers whose own
// context length fits the request: a worker's heartbeat limits apply to
// that worker only, never to the others.
//
// Contract: with Request.SeqTokens ≤ 0 every candidate passes; otherwise
// a candidate passes if and only if its Worker.MaxSeqLen is 0 (it does not
// say) or at least Request.SeqTokens. Order is kept.
package contextlen

import "github.com/pdserve/pdserve/pkg/router/framework"

// Filter keeps workers whose context length fits the request. The zero
// value is ready; safe for concurrent use.
type Filter struct{}

var _ framework.Filter = (*Filter)(nil)

// Name implements framework.Filter.
func (*Filter) Name() string { return "context" }

// Filter implements framework.Filter.
func (*Filter) Filter(in *framework.Input, cs []framework.Candidate) []framework.Candidate {
	n := in.Request.SeqTokens
	if n <= 0 {
		return cs
	}
	out := cs[:0]
	for _, c := range cs {
		if c.Worker.MaxSeqLen <= 0 || c.Worker.MaxSeqLen >= n {
			out = append(out, c)
		}
	}
	return out
}
