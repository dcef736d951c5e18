package batching

import (
	"context"
	"sync"
)

// Signals is what a worker's request handlers and its batch loop signal
// each other: the wake-up the loop waits on when it has nothing to run,
// whether the worker is draining, and that a request ended (for
// WaitIdle). Create it with NewSignals.
//
// Signals owns no lock. Wake and Woken are safe from any goroutine under
// any lock. The draining flag and the end-of-request signal are guarded by
// the worker's own mutex (the one that guards its requests): the methods
// named ...Locked are called with it held, so that a handler reads
// draining in the same critical section as the rest of its state (say,
// "stopped or draining, else insert the request"). WaitIdle takes that
// mutex itself.
type Signals struct {
	wake     chan struct{} // capacity 1: the batch loop has something to look at
	draining bool          // guarded by the worker's mutex
	changed  chan struct{} // guarded by the worker's mutex; closed and replaced whenever a request ends
}

// NewSignals returns Signals with no wake-up pending, not draining.
func NewSignals() *Signals {
	return &Signals{wake: make(chan struct{}, 1), changed: make(chan struct{})}
}

// Wake tells the batch loop it has something to look at. It never blocks:
// wake-ups given before the loop reads one coalesce into one.
func (s *Signals) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Woken is the channel the batch loop waits on: it yields once after one
// or more Wake calls.
func (s *Signals) Woken() <-chan struct{} { return s.wake }

// SetDrainingLocked sets whether the worker is draining. The caller holds
// the worker's mutex.
func (s *Signals) SetDrainingLocked(d bool) { s.draining = d }

// DrainingLocked reports whether the worker is draining. The caller holds
// the worker's mutex.
func (s *Signals) DrainingLocked() bool { return s.draining }

// EndedLocked wakes every WaitIdle call: a request ended (the worker's
// count of requests changed). The caller holds the worker's mutex, and has
// already changed the count under it.
func (s *Signals) EndedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// WaitIdle blocks until live, called with mu held, returns 0, or ctx ends
// (returning its error). mu is the worker's mutex (held by no caller of
// WaitIdle); the worker calls EndedLocked under it whenever live's count
// drops.
func (s *Signals) WaitIdle(ctx context.Context, mu sync.Locker, live func() int) error {
	for {
		mu.Lock()
		n, ch := live(), s.changed
		mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
