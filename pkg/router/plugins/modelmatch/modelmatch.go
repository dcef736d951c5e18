// Package modelmatch is a router filter that keeps the workers serving
// the request's model.
//
// Contract: with Request.Model empty every candidate passes; otherwise a
// candidate passes if and only if its Worker.Model is empty (serves any
// model) or equals Request.Model. Order is kept.
package modelmatch

import "github.com/pdserve/pdserve/pkg/router/framework"

// Filter keeps workers serving the request's model. The zero value is
// ready; safe for concurrent use.
type Filter struct{}

var _ framework.Filter = (*Filter)(nil)

// Name implements framework.Plugin.
func (*Filter) Name() string { return "model" }

// Filter implements framework.Filter.
func (*Filter) Filter(in *framework.Input, cs []framework.Candidate) []framework.Candidate {
	m := in.Request.Model
	if m == "" {
		return cs
	}
	out := cs[:0]
	for _, c := range cs {
		if c.Worker.Model == "" || c.Worker.Model == m {
			out = append(out, c)
		}
	}
	return out
}
