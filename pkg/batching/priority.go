package batching

import "github.com/pdserve/pdserve/pkg/wire/vocab"

// DefaultOvertakes is how many later interactive requests may start
// ahead of a waiting batch request on a worker (the services'
// Config.Overtakes of their batches): under a steady stream of
// interactive requests, batch requests still get at least one start in
// DefaultOvertakes+1.
const DefaultOvertakes = 8

// Waiter is a waiting request's place in the priority order of a batch
// that starts requests when it has room: interactive ones before batch
// ones, first come first served within a priority, and a batch request
// passed by overtakes later interactive ones starts before any later
// one. Its wait is therefore bounded: it starts after at most the
// requests that joined before it plus overtakes interactive ones that
// joined after it. A batch owns its waiters (its loop alone touches
// them).
type Waiter struct {
	Priority vocab.Priority
	// passed counts the interactive requests that joined after this one
	// and started before it.
	passed int
}

// Next returns the index in waiting (in order of joining) of the request
// to start next: the first interactive one, or batch one passed
// overtakes times already (overtakes ≤ 0: the first one, FCFS); the
// first one when every one is a batch request not yet due. It returns -1
// when waiting is empty. w returns a request's Waiter.
func Next[T any](waiting []T, w func(T) *Waiter, overtakes int) int {
	if overtakes > 0 {
		for i, x := range waiting {
			if q := w(x); q.Priority != vocab.PriorityBatch || q.passed >= overtakes {
				return i
			}
		}
	}
	if len(waiting) == 0 {
		return -1
	}
	return 0
}

// Started records that waiting[i], chosen by Next, starts: when it is an
// interactive request, it passed every batch request before it.
func Started[T any](waiting []T, i int, w func(T) *Waiter) {
	if w(waiting[i]).Priority == vocab.PriorityBatch {
		return
	}
	for _, x := range waiting[:i] {
		if q := w(x); q.Priority == vocab.PriorityBatch {
			q.passed++
		}
	}
}
