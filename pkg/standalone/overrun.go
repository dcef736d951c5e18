package standalone

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/coordinator"
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

// overrunWarnings is the coordinator extension that warns a request whose
// in-process sim engines fell behind their model while it ran: the
// request's times are then not those of the modeled GPU. Its engines are
// fixed at construction; it is safe for concurrent use.
type overrunWarnings struct {
	engines []watchedEngine // sorted by worker ID
}

var (
	_ coordinator.Extension      = (*overrunWarnings)(nil)
	_ coordinator.RequestWatcher = (*overrunWarnings)(nil)
)

// newOverrunWarnings returns the extension watching the engines of es (by
// worker ID) that count their overruns, or nil when none does.
func newOverrunWarnings(es map[string]engine.Engine) *overrunWarnings {
	var out []watchedEngine
	for id, e := range es {
		if o, ok := e.(overrunner); ok {
			out = append(out, watchedEngine{worker: id, e: o})
		}
	}
	if len(out) == 0 {
		return nil
	}
	sort.Slice(out, func(i, j int) bool { return out[i].worker < out[j].worker })
	return &overrunWarnings{engines: out}
}

func (*overrunWarnings) Attach(coordinator.Host) error { return nil }
func (*overrunWarnings) ObserveTrace(*budget.Trace)    {}
func (*overrunWarnings) Run(ctx context.Context)       { <-ctx.Done() }

// WatchRequest notes the overrun counts of the engines and returns the
// function to call when the request ends: it adds a warning to tr for
// each engine of the request's workers that fell behind its model
// meanwhile.
func (x *overrunWarnings) WatchRequest(tr *budget.Trace) func() {
	before := make([]int64, len(x.engines))
	for i, w := range x.engines {
		before[i] = w.e.Overruns().Steps
	}
	return func() {
		for i, w := range x.engines {
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
