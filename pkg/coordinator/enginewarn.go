package coordinator

import (
	"fmt"
	"sort"
	"time"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/sim"
)

// overrunner is an engine that counts the steps in which it fell behind
// its performance model: the sim engine.
type overrunner interface {
	Overruns() sim.Overruns
}

var _ overrunner = (*sim.Engine)(nil)

// watchedEngine is the engine of an in-process worker that counts its
// overruns.
type watchedEngine struct {
	worker string // worker ID, as in Trace.PrefillWorker and DecodeWorker
	e      overrunner
}

// watchedEngines returns the engines of es (by worker ID) that count
// their overruns, sorted by worker ID.
func watchedEngines(es map[string]engine.Engine) []watchedEngine {
	var out []watchedEngine
	for id, e := range es {
		if o, ok := e.(overrunner); ok {
			out = append(out, watchedEngine{worker: id, e: o})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].worker < out[j].worker })
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
