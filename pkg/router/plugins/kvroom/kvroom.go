// Package kvroom is a router filter that drops decode workers without KV
// room for the request.
//
// Contract: a candidate has room when its estimated free blocks
// (Load.KVBlocksFree) are at least Input.Blocks. Candidates without room
// are dropped, in order, unless none has room: then every candidate
// passes, because the router's figure is an estimate and the decode
// worker's Reserve is the authoritative check (a worker that freed blocks
// since its heartbeat may still take the request). The filter therefore
// never empties a non-empty set.
package kvroom

import "github.com/pdserve/pdserve/pkg/router/framework"

// Filter drops workers without KV room. The zero value is ready; safe for
// concurrent use.
type Filter struct{}

var _ framework.Filter = (*Filter)(nil)

// Name implements framework.Plugin.
func (*Filter) Name() string { return "kvroom" }

// Filter implements framework.Filter.
func (*Filter) Filter(in *framework.Input, cs []framework.Candidate) []framework.Candidate {
	room := 0
	for _, c := range cs {
		if c.Load.KVBlocksFree >= in.Blocks {
			room++
		}
	}
	if room == 0 || room == len(cs) {
		return cs
	}
	out := cs[:0]
	for _, c := range cs {
		if c.Load.KVBlocksFree >= in.Blocks {
			out = append(out, c)
		}
	}
	return out
}
