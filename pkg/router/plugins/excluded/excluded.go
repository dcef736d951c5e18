// Package excluded is a router filter that drops the workers the caller
// excludes (its failed attempts at this request).
//
// Contract: a candidate passes if and only if its Worker.ID is not in
// Input.Exclude; order is kept.
package excluded

import "github.com/pdserve/pdserve/pkg/router/framework"

// Filter drops excluded workers. The zero value is ready; safe for
// concurrent use.
type Filter struct{}

var _ framework.Filter = (*Filter)(nil)

// Name implements framework.Plugin.
func (*Filter) Name() string { return "excluded" }

// Filter implements framework.Filter.
func (*Filter) Filter(in *framework.Input, cs []framework.Candidate) []framework.Candidate {
	if len(in.Exclude) == 0 {
		return cs
	}
	out := cs[:0]
	for _, c := range cs {
		if !in.Exclude[c.Worker.ID] {
			out = append(out, c)
		}
	}
	return out
}
