package ref

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
)

// countJob counts the calls of every unit and flags a worker index out of
// range or used by two calls at once.
type countJob struct {
	calls []atomic.Int32 // per unit
	busy  []atomic.Int32 // per worker
	bad   atomic.Int32
}

func (j *countJob) do(worker, unit int) {
	if worker < 0 || worker >= len(j.busy) {
		j.bad.Add(1)
		return
	}
	if j.busy[worker].Add(1) != 1 {
		j.bad.Add(1)
	}
	j.calls[unit].Add(1)
	j.busy[worker].Add(-1)
}

// TestPoolRunsEveryUnitOnce runs many jobs back to back, with more and
// fewer units than workers, on pools that poll between runs and pools that
// park at once (more workers than GOMAXPROCS).
func TestPoolRunsEveryUnitOnce(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		size, procs int
		spin        bool
	}{{1, 2, false}, {2, 2, true}, {3, 4, true}, {3, 2, false}} {
		t.Run(fmt.Sprintf("size %d procs %d", tc.size, tc.procs), func(t *testing.T) {
			runtime.GOMAXPROCS(tc.procs)
			p := newPool(tc.size)
			defer p.close()
			if p.spin != tc.spin {
				t.Fatalf("spin = %v, want %v", p.spin, tc.spin)
			}
			sizes := []int{1, 2, 3, 5, 17, 64}
			for run := range 300 {
				units := sizes[run%len(sizes)]
				j := &countJob{calls: make([]atomic.Int32, units), busy: make([]atomic.Int32, p.size)}
				p.run(j, units)
				if n := j.bad.Load(); n != 0 {
					t.Fatalf("run %d: %d calls with a bad or shared worker index", run, n)
				}
				for u := range j.calls {
					if n := j.calls[u].Load(); n != 1 {
						t.Fatalf("run %d of %d units: unit %d ran %d times", run, units, u, n)
					}
				}
			}
			p.close()
			p.close() // idempotent
		})
	}
}

// spinJob is a unit of fixed arithmetic, a few microseconds long.
type spinJob struct{ sink [8]float64 }

func (j *spinJob) do(worker, _ int) {
	x := float64(worker)
	for range 4000 {
		x = x*0.999999 + 1e-9
	}
	j.sink[worker%len(j.sink)] += x
}

// BenchmarkPoolRun measures runs of eight units of a few microseconds each
// (a decode matmul's size): with two workers a run should take about half
// as long as with one, which it does not when waking a parked worker costs
// more than a unit.
func BenchmarkPoolRun(b *testing.B) {
	for _, size := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", size), func(b *testing.B) {
			p := newPool(size)
			defer p.close()
			var j spinJob
			for b.Loop() {
				p.run(&j, 8)
			}
		})
	}
}
