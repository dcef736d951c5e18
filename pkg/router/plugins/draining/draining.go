// Package draining is a router filter that drops draining workers.
//
// Contract: a candidate passes if and only if its Worker.Draining is
// false; order is kept.
package draining

import "github.com/pdserve/pdserve/pkg/router/framework"

// Filter drops draining workers. The zero value is ready; safe for
// concurrent use.
type Filter struct{}

var _ framework.Filter = (*Filter)(nil)

// Name implements framework.Plugin.
func (*Filter) Name() string { return "draining" }

// Filter implements framework.Filter.
func (*Filter) Filter(_ *framework.Input, cs []framework.Candidate) []framework.Candidate {
	out := cs[:0]
	for _, c := range cs {
		if !c.Worker.Draining {
			out = append(out, c)
		}
	}
	return out
}
