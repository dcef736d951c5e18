// Package batchroom is a router filter that drops decode workers whose
// running batch is full.
//
// Contract: a candidate has room when its batch limit is unknown
// (Worker.MaxBatch ≤ 0) or its estimated running batch (Load.RunningBatch:
// the heartbeat's plus the router's later assignments) is below
// Worker.MaxBatch. Candidates without room are dropped, in order, unless
// none has room: then every candidate passes (the request waits in some
// worker's queue either way, and the scorers choose which). The filter
// therefore never empties a non-empty set.
//
// Without it a decode worker that caches a popular prefix would keep
// winning on the prefix score after its batch is full: the request then
// waits there for a slot while another worker has one free.
package batchroom

import "github.com/pdserve/pdserve/pkg/router/framework"

// Filter drops workers with a full batch. The zero value is ready; safe for
// concurrent use.
type Filter struct{}

var _ framework.Filter = (*Filter)(nil)

// Name implements framework.Plugin.
func (*Filter) Name() string { return "batchroom" }

func hasRoom(c framework.Candidate) bool {
	return c.Worker.MaxBatch <= 0 || c.Load.RunningBatch < c.Worker.MaxBatch
}

// Filter implements framework.Filter.
func (*Filter) Filter(_ *framework.Input, cs []framework.Candidate) []framework.Candidate {
	room := 0
	for _, c := range cs {
		if hasRoom(c) {
			room++
		}
	}
	if room == 0 || room == len(cs) {
		return cs
	}
	out := cs[:0]
	for _, c := range cs {
		if hasRoom(c) {
			out = append(out, c)
		}
	}
	return out
}
