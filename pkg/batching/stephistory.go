package batching

import (
	"slices"
	"time"
)

// StepHistoryLen is how many recent step times a StepHistory keeps.
const StepHistoryLen = 16

// StepHistory is what a worker's Stats report of its batch loop's recent
// steps: the last StepHistoryLen step times and the last step's batch
// size. The zero value holds no step. It owns no lock: the worker guards
// it with its own mutex (its methods are called with that held).
type StepHistory struct {
	times     []float64 // milliseconds, oldest first
	lastBatch int
}

// Record adds one step that took d and ran batch sequences, forgetting
// the oldest beyond StepHistoryLen.
func (h *StepHistory) Record(d time.Duration, batch int) {
	h.lastBatch = batch
	h.times = append(h.times, float64(d)/float64(time.Millisecond))
	if len(h.times) > StepHistoryLen {
		h.times = h.times[len(h.times)-StepHistoryLen:]
	}
}

// TimesMs returns the recent step times in milliseconds, oldest first: a
// copy the caller owns (nil before the first step).
func (h *StepHistory) TimesMs() []float64 { return slices.Clone(h.times) }

// LastBatch returns the last step's batch size (0 before the first step).
func (h *StepHistory) LastBatch() int { return h.lastBatch }
