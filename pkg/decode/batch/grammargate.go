package batch

import (
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
)

// The loop never computes a grammar's states: a choice's state after the
// token it emitted, and that state's mask, are computed on the worker's
// grammar.Offload (Config.Grammars; shared by the request's choices, its
// tenants taken in turn) while the loop goes on. A choice whose state is
// not ready when a step is planned sits that step out (grammarReady): it
// is delayed, never its neighbours, and since the mask it samples under
// is the same whenever it is computed, only timing changes, never a
// token. Before each plan the loop waits for such states at most a
// quarter of its last step's time (waitGrammars), so that a grammar
// request keeps its choices in step when its work is short, and costs its
// neighbours at most that.

// readier is a grammar state computed off the loop (grammar.Offloaded).
type readier interface{ Ready() bool }

// grammarReady reports whether c, a choice's grammar state or nil, can
// mask a step now.
func grammarReady(c engine.GrammarState) bool {
	r, ok := c.(readier)
	return !ok || r.Ready()
}

// waitGrammars waits, at most a quarter of the last step's time, for the
// grammar states of the batch's decoding choices that are not ready.
func (b *Batch) waitGrammars() {
	if b.cfg.Grammars == nil {
		return
	}
	var waiting []readier
	for _, q := range b.active {
		if r, ok := q.constraint.(readier); ok && len(q.pending) == 0 && !r.Ready() {
			waiting = append(waiting, r)
		}
	}
	if len(waiting) == 0 {
		return
	}
	times, _ := b.run.Steps()
	if len(times) == 0 {
		return
	}
	budget := time.Duration(times[len(times)-1] * float64(time.Millisecond) / 4)
	t := time.NewTimer(budget)
	defer t.Stop()
	for {
		changed := b.cfg.Grammars.Changed()
		for len(waiting) > 0 && waiting[0].Ready() {
			waiting = waiting[1:]
		}
		if len(waiting) == 0 {
			return
		}
		select {
		case <-changed:
		case <-t.C:
			return
		}
	}
}
