// Package queuelimit is a router filter that drops prefill workers whose
// queue is full.
//
// Contract: with Max ≤ 0 every candidate passes; otherwise a candidate
// passes if and only if its estimated queued prefill tokens
// (Load.QueuedPrefillTokens) are fewer than Max. Order is kept. In a
// capacity stage, an emptied set makes the router return ErrNoCapacity.
package queuelimit

import "github.com/pdserve/pdserve/pkg/router/framework"

// Filter drops workers with Max or more queued prefill tokens. Safe for
// concurrent use.
type Filter struct {
	Max int // tokens; ≤ 0: unbounded
}

var _ framework.Filter = (*Filter)(nil)

// Name implements framework.Plugin.
func (*Filter) Name() string { return "queuelimit" }

// Filter implements framework.Filter.
func (f *Filter) Filter(_ *framework.Input, cs []framework.Candidate) []framework.Candidate {
	if f.Max <= 0 {
		return cs
	}
	out := cs[:0]
	for _, c := range cs {
		if c.Load.QueuedPrefillTokens < f.Max {
			out = append(out, c)
		}
	}
	return out
}
