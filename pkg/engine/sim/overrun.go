package sim

import (
	"sync"
	"time"
)

// A step overruns its model when it takes longer than its scaled modeled
// time by more than OverrunFraction of that time and by at least
// OverrunSlack: the process fell behind the modeled GPU (KV generation
// or callbacks slower than the step, CPU starvation), not a late timer.
const (
	OverrunFraction = 0.5
	OverrunSlack    = 10 * time.Millisecond
)

// Overrun is one step that overran its model.
type Overrun struct {
	At      time.Time     // when the step ended, on the engine's clock
	Took    time.Duration // how long it took
	Scaled  time.Duration // what it aimed to take: Modeled × TimeScale
	Modeled time.Duration // the profile's step time
}

// Overruns counts the steps that overran so far.
type Overruns struct {
	Steps int64   // steps that overran
	Last  Overrun // the latest of them (zero while Steps is 0)
}

// overruns is the engine's record of overrunning steps; its own lock,
// since Overruns is read from other goroutines while steps run.
type overruns struct {
	mu   sync.Mutex
	o    Overruns
	hook func(Overrun)
}

// Overruns returns the steps that overran so far. Safe to call while
// steps run.
func (e *Engine) Overruns() Overruns {
	e.over.mu.Lock()
	defer e.over.mu.Unlock()
	return e.over.o
}

// OnOverrun makes every overrunning step call f, in the goroutine running
// the step, after the step: f must be quick (e.g. a rate-limited log
// line). Set it before steps run; nil removes it.
func (e *Engine) OnOverrun(f func(Overrun)) {
	e.over.mu.Lock()
	e.over.hook = f
	e.over.mu.Unlock()
}

// noteStep records a finished step that ended at end.
func (e *Engine) noteStep(end time.Time, modeled, scaled, took time.Duration) {
	if !overran(took, scaled) {
		return
	}
	o := Overrun{At: end, Took: took, Scaled: scaled, Modeled: modeled}
	e.over.mu.Lock()
	e.over.o.Steps++
	e.over.o.Last = o
	hook := e.over.hook
	e.over.mu.Unlock()
	if hook != nil {
		hook(o)
	}
}

// overran reports whether a step that aimed to take scaled and took took
// overran its model.
func overran(took, scaled time.Duration) bool {
	over := took - scaled
	return over >= OverrunSlack && float64(over) > OverrunFraction*float64(scaled)
}
