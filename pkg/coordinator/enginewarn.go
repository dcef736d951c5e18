package coordinator

import (
	"fmt"
	"time"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// overrunner is an engine that counts the steps in which it fell behind
// its performance model: the sim engine.
type overrunner interface {
	Overruns() sim.Overruns
}

var _ overrunner = (*sim.Engine)(nil)

// watchedEngine is the engine of a standalone worker that counts its
// overruns.
type watchedEngine struct {
	worker string // worker ID, as in Trace.PrefillWorker and DecodeWorker
	e      overrunner
}

// watchedEngines returns the engines of ws that count their overruns.
func watchedEngines(ws []*workerrun.Worker) []watchedEngine {
	var out []watchedEngine
	for _, w := range ws {
		if e, ok := w.Engine().(overrunner); ok {
			out = append(out, watchedEngine{worker: w.ID(), e: e})
		}
	}
	return out
}

// warnOverruns notes the overrun counts of the watched engines and
// returns the function to call when the request ends: it adds a warning
// to tr for each engine of the request's workers that fell behind its
// model meanwhile, since the request's times are then not those of the
// modeled GPU. Without watched engines (workers in other processes,
// engines without a model) it does nothing.
func (b *backend) warnOverruns(tr *budget.Trace) func() {
	if len(b.engines) == 0 {
		return func() {}
	}
	before := make([]int64, len(b.engines))
	for i, w := range b.engines {
		before[i] = w.e.Overruns().Steps
	}
	return func() {
		for i, w := range b.engines {
			if w.worker != tr.PrefillWorker && w.worker != tr.DecodeWorker {
				continue
			}
			o := w.e.Overruns()
			if n := o.Steps - before[i]; n > 0 {
				steps := "steps"
				if n == 1 {
					steps = "step"
				}
				tr.Warn(fmt.Sprintf("the sim engine of %s fell behind its performance model in %d %s during this request (the latest took %v, modeled %v): "+
					"these times are this machine's, not the modeled GPU's; lower --payload-scale, raise --time-scale or give the process more CPU",
					w.worker, n, steps, o.Last.Took.Round(time.Microsecond), o.Last.Scaled.Round(time.Microsecond)))
			}
		}
	}
}
