package ref

import (
	"sync"
	"sync/atomic"
)

// job is a unit of parallel work: do(worker, unit) handles one unit. worker
// is in [0, pool size) and lets a job use per-worker scratch; two calls
// never share a worker index at the same time.
type job interface {
	do(worker, unit int)
}

// pool is a fixed set of goroutines that run the units of one job at a time,
// handed out dynamically (an atomic counter), with the calling goroutine
// working as worker 0. Results must not depend on which worker runs a unit;
// every job in this package computes each output element in one unit, in a
// fixed order, so they do not. A pool is used by one goroutine at a time
// (the engine's caller); close stops its goroutines.
type pool struct {
	size  int             // workers, the caller included
	wake  []chan struct{} // one per background worker
	busy  sync.WaitGroup  // background workers inside the current run
	exit  sync.WaitGroup  // background goroutines alive
	job   job
	units int
	next  atomic.Int64
	once  sync.Once
}

func newPool(size int) *pool {
	p := &pool{size: max(size, 1)}
	p.wake = make([]chan struct{}, p.size-1)
	p.exit.Add(len(p.wake))
	for i := range p.wake {
		p.wake[i] = make(chan struct{})
		go p.loop(i+1, p.wake[i])
	}
	return p
}

func (p *pool) loop(worker int, wake <-chan struct{}) {
	defer p.exit.Done()
	for range wake {
		p.work(worker)
		p.busy.Done()
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
	helpers := min(len(p.wake), units-1)
	if helpers == 0 {
		for u := range units {
			j.do(0, u)
		}
		return
	}
	p.job, p.units = j, units
	p.next.Store(0)
	p.busy.Add(helpers)
	for i := range helpers {
		p.wake[i] <- struct{}{}
	}
	p.work(0)
	p.busy.Wait()
	p.job = nil
}

// close stops the background goroutines and waits for them to exit. It is
// idempotent.
func (p *pool) close() {
	p.once.Do(func() {
		for _, c := range p.wake {
			close(c)
		}
		p.exit.Wait()
	})
}
