package batching

import "github.com/pdserve/pdserve/pkg/wire/vocab"

// DefaultOvertakes is how many interactive requests in a row may start
// ahead of a waiting batch request on a worker (the services'
// Config.Overtakes of their batches): under a steady stream of
// interactive requests, the oldest waiting request still starts once in
// DefaultOvertakes+1 starts.
const DefaultOvertakes = 8

// Order is the priority order in which a batch starts its waiting
// requests when it has room: first come first served, except that a
// waiting interactive request goes ahead of older batch ones, at most
// Overtakes times in a row; then the oldest waiting request starts. A
// batch request's wait is therefore bounded: with m requests waiting
// ahead of it, it starts within (m+1)·(Overtakes+1) starts. The zero
// Order (Overtakes 0) is FCFS. A batch owns its Order (its loop alone
// touches it).
type Order struct {
	// Overtakes is the most interactive requests in a row that start
	// ahead of an older waiting batch request; ≤ 0: none (FCFS).
	Overtakes int
	// passed counts the interactive requests started in a row ahead of
	// an older batch request.
	passed int
}

// Next returns the index in waiting (in order of joining) of the request
// to start next: the first interactive one when Overtakes allows it one
// more pass, else the first one; -1 when waiting is empty. prio returns
// a request's priority.
func Next[T any](o *Order, waiting []T, prio func(T) vocab.Priority) int {
	if len(waiting) == 0 {
		return -1
	}
	if o.Overtakes > 0 && o.passed < o.Overtakes {
		for i, x := range waiting {
			if prio(x) != vocab.PriorityBatch {
				return i
			}
		}
	}
	return 0
}

// Started records that waiting[i], chosen by Next, starts.
func Started[T any](o *Order, waiting []T, i int, prio func(T) vocab.Priority) {
	for _, x := range waiting[:i] {
		if prio(x) == vocab.PriorityBatch {
			o.passed++ // an interactive request passed an older batch one
			return
		}
	}
	o.passed = 0 // the oldest request started
}
