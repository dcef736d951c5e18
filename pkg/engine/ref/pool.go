package ref

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// job is a unit of parallel work: do(worker, unit) handles one unit. worker
// is in [0, pool size) and lets a job use per-worker scratch; two calls
// never share a worker index at the same time.
type job interface {
	do(worker, unit int)
}

// spinFor is how long a worker polls for the next run before it parks, and
// how long the caller polls for the helpers to finish before it parks.
// Waking a parked goroutine costs tens of microseconds on a virtual
// machine, as much as a whole matmul of a decode step; the runs of a step
// follow each other within microseconds, so a short poll catches them.
const spinFor = 50 * time.Microsecond

// States of a background worker, changed only with atomics.
const (
	helperParked   = iota // blocked on its wake channel (or about to be)
	helperSpinning        // polling state for helperClaimed
	helperClaimed         // handed the current run
)

type helper struct {
	state atomic.Int32
	wake  chan struct{}
}

// pool is a fixed set of goroutines that run the units of one job at a time,
// handed out dynamically (an atomic counter), with the calling goroutine
// working as worker 0. Results must not depend on which worker runs a unit;
// every job in this package computes each output element in one unit, in a
// fixed order, so they do not. A pool is used by one goroutine at a time
// (the engine's caller); close stops its goroutines.
//
// When every worker can have a processor of its own (size ≤ GOMAXPROCS
// when the pool is made), a worker that finishes a run polls for the next
// one for spinFor before it parks, and the caller polls for the workers
// likewise; otherwise pollers would take processors from the workers, and
// all of them park at once.
type pool struct {
	size    int  // workers, the caller included
	spin    bool // workers and caller poll before parking
	helpers []helper
	busy    sync.WaitGroup // background workers inside the current run
	left    atomic.Int32   // background workers inside the current run, for polling
	exit    sync.WaitGroup // background goroutines alive
	job     job
	units   int
	next    atomic.Int64
	once    sync.Once
}

func newPool(size int) *pool {
	p := &pool{size: max(size, 1)}
	p.spin = p.size > 1 && p.size <= runtime.GOMAXPROCS(0)
	p.helpers = make([]helper, p.size-1)
	p.exit.Add(len(p.helpers))
	for i := range p.helpers {
		p.helpers[i].wake = make(chan struct{})
		go p.loop(i+1, &p.helpers[i])
	}
	return p
}

func (p *pool) loop(worker int, h *helper) {
	defer p.exit.Done()
	claimed := func() bool { return h.state.Load() == helperClaimed }
	for {
		if _, ok := <-h.wake; !ok {
			return
		}
	work:
		p.work(worker)
		if p.spin {
			// Before Done: the caller's next run must not see the
			// claim of this one.
			h.state.Store(helperSpinning)
		}
		p.left.Add(-1)
		p.busy.Done()
		// Park unless a run claims this worker while it polls, or in the
		// moment between the poll and the park.
		if p.spin && (poll(claimed) || !h.state.CompareAndSwap(helperSpinning, helperParked)) {
			goto work
		}
	}
}

// poll calls cond until it reports true, for up to spinFor, yielding the
// processor now and then, and returns cond's last answer.
func poll(cond func() bool) bool {
	var deadline time.Time
	for i := 0; ; i++ {
		if cond() {
			return true
		}
		if i%64 == 0 {
			now := time.Now()
			if i == 0 {
				deadline = now.Add(spinFor)
			} else if now.After(deadline) {
				return false
			}
			runtime.Gosched()
		}
	}
}

func (p *pool) work(worker int) {
	for {
		u := int(p.next.Add(1) - 1)
		if u >= p.units {
			return
		}
		p.job.do(worker, u)
	}
}

// run calls j.do for every unit in [0, units) and returns when all are
// done. It must not be called after close.
func (p *pool) run(j job, units int) {
	if units <= 0 {
		return
	}
	helpers := min(len(p.helpers), units-1)
	if helpers == 0 {
		for u := range units {
			j.do(0, u)
		}
		return
	}
	p.job, p.units = j, units
	p.next.Store(0)
	p.busy.Add(helpers)
	p.left.Store(int32(helpers))
	for i := range helpers {
		h := &p.helpers[i]
		if p.spin && h.state.CompareAndSwap(helperSpinning, helperClaimed) {
			continue // it is polling and takes the run without a wake-up
		}
		h.state.Store(helperClaimed)
		h.wake <- struct{}{}
	}
	p.work(0)
	if p.spin {
		poll(func() bool { return p.left.Load() == 0 })
	}
	p.busy.Wait()
	p.job = nil
}

// close stops the background goroutines and waits for them to exit (a
// polling one within spinFor). It is idempotent.
func (p *pool) close() {
	p.once.Do(func() {
		for i := range p.helpers {
			close(p.helpers[i].wake)
		}
		p.exit.Wait()
	})
}
