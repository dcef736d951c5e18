package decode

import (
	"runtime"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
)

// The batch loop never computes a grammar's states: a choice's state
// after the token it emitted, and that state's mask, are computed on the
// server's grammar.Offload (shared by the request's choices, its tenants
// taken in turn), while the loop goes on. A choice whose state is not
// ready when a step is planned sits that step out (grammarReady): it is
// delayed, never its neighbours, and since the mask it samples under is
// the same whenever it is computed, only timing changes, never a token.
// Before each plan the loop waits for such states at most a quarter of
// its last step's time (waitGrammars), so that a grammar request keeps
// its choices in step when its work is short, and costs its neighbours
// at most that.

// readier is a grammar state computed off the loop (grammar.Offloaded).
type readier interface{ Ready() bool }

// grammarReady reports whether c, a choice's grammar state or nil, can
// mask a step now.
func grammarReady(c engine.GrammarState) bool {
	r, ok := c.(readier)
	return !ok || r.Ready()
}

// grammarWorkers is the goroutines of a decode worker's grammar.Offload:
// a quarter of the CPUs, at least one, so that grammar work leaves the
// engine most of them.
func grammarWorkers() int { return max(1, runtime.GOMAXPROCS(0)/4) }

// waitGrammars waits, at most a quarter of the last step's time, for the
// grammar states of the batch's decoding choices that are not ready. The
// caller holds the engine lock, not rn.mu.
func (pl batcher) waitGrammars() {
	s := pl.s
	s.rn.mu.Lock()
	var waiting []readier
	for _, q := range s.rn.active {
		if r, ok := q.constraint.(readier); ok && len(q.pending) == 0 && !r.Ready() {
			waiting = append(waiting, r)
		}
	}
	s.rn.mu.Unlock()
	if len(waiting) == 0 {
		return
	}
	times, _ := s.run.Steps()
	if len(times) == 0 {
		return
	}
	budget := time.Duration(times[len(times)-1] * float64(time.Millisecond) / 4)
	t := time.NewTimer(budget)
	defer t.Stop()
	for {
		changed := s.offload.Changed()
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
