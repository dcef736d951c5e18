// Package roundrobin is a router picker that ignores the scores and takes
// the candidates in turn: a baseline for measuring what scoring buys.
//
// Contract: Pick returns the candidate with the smallest Worker.ID (byte
// order) greater than the ID it returned last; when there is none (or on
// the first call) the smallest ID. Among candidates with the same ID, the
// earliest index. The totals are not read. The order therefore depends
// only on the candidates' ids, not on their order in cs: with a fixed set
// of n workers each gets every n-th request; a worker that is filtered
// out is skipped and the turn passes to the next id; one that joins
// takes its place in id order. The result is deterministic in the
// sequence of calls (the picker's state is the last id returned).
package roundrobin

import (
	"sync"

	"github.com/pdserve/pdserve/pkg/router/framework"
)

// Picker takes the candidates in turn by worker id. The zero value is
// ready; safe for concurrent use (calls are serialised by a mutex). Give
// each router profile its own Picker: the turn is per Picker.
type Picker struct {
	mu      sync.Mutex
	last    string // id returned last
	started bool   // last is set
}

var _ framework.Picker = (*Picker)(nil)

// Name implements framework.Plugin.
func (*Picker) Name() string { return "roundrobin" }

// Pick implements framework.Picker.
func (p *Picker) Pick(_ *framework.Input, cs []framework.Candidate, _ []float64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	next, first := -1, 0 // smallest id > last; smallest id
	for i := range cs {
		id := cs[i].Worker.ID
		if id < cs[first].Worker.ID {
			first = i
		}
		if p.started && id > p.last && (next < 0 || id < cs[next].Worker.ID) {
			next = i
		}
	}
	if next < 0 {
		next = first
	}
	p.last, p.started = cs[next].Worker.ID, true
	return next
}
