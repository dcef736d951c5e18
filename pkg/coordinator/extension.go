package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/frontend"
)

// An Extension runs in the coordinator's process beside the request path
// and watches the requests it completes: the online planner (package
// plannerhost) is one. The coordinator calls Attach once in Start, then
// ObserveTrace for every completed request, and runs Run until Shutdown.
type Extension interface {
	// Attach hands the extension what it may use of the coordinator; it
	// is called once by Start, after the control plane is connected and
	// before the API serves. An error fails Start.
	Attach(Host) error
	// ObserveTrace is called with the budget trace of every request the
	// coordinator completed (finished with stop or length, or stopped by
	// a stop string), before the response ends: the trace is then final
	// but for the status the frontend sets. Failed and cancelled requests
	// are not observed. It is called concurrently and must not block; the
	// trace must not be kept or changed after it returns.
	ObserveTrace(*budget.Trace)
	// Run runs until ctx ends (Shutdown cancels it), then returns.
	Run(ctx context.Context)
}

// A RequestWatcher is an Extension that also hears of every request as it
// starts: the coordinator calls WatchRequest with the request's trace
// before the request is routed, and the function it returns once the
// request ended, however it ended (completed, failed, cancelled), before
// the response's last chunk is written, so that it may add warnings to
// the trace (budget.Trace.Warn). Both are called concurrently and must not
// block. Standalone mode attaches one that warns when an in-process sim
// engine fell behind its model during the request.
type RequestWatcher interface {
	WatchRequest(*budget.Trace) (done func())
}

// A RefusalObserver is an Extension that also hears of every request the
// pools refused for want of room (429: no decode worker with KV room for
// it, every prefill queue full, a worker overloaded), and of every
// request of a model served here that another region served instead
// (frontend.ForwardObserver): demand they did not serve. The coordinator
// calls ObserveRefused with the request's trace (its model, arrival and
// prompt tokens known) and its max_tokens, concurrently; it must not
// block, nor keep or change the trace.
type RefusalObserver interface {
	ObserveRefused(t *budget.Trace, maxTokens int)
}

// A RetryObserver is a RefusalObserver that tells apart a request served
// on its client's retry of a refusal it heard of (refusalSet): the
// coordinator calls ObserveServedRetry with its trace instead of
// ObserveTrace, since the request counted as demand when it was refused.
// The same rules as ObserveTrace's apply.
type RetryObserver interface {
	ObserveServedRetry(*budget.Trace)
}

// Host is what an Extension gets from the coordinator it runs in.
type Host struct {
	// Publish publishes on the control plane (NATS).
	Publish func(subject string, data []byte) error
	// Members is the coordinator's view of the workers.
	Members *control.Membership
	// Registerer registers metrics served on the coordinator's /metrics.
	Registerer prometheus.Registerer
	// Log is the coordinator's logger.
	Log *zap.Logger
	// Command sends a command to the worker of role and id and waits for
	// its reply (control.SendCommand on the coordinator's connection).
	Command func(ctx context.Context, role, id string, c control.Command) error
}

// attachExtensions attaches o.Extensions. Errors: the first Attach error.
func (c *Coordinator) attachExtensions() error {
	h := Host{Publish: c.nc.Publish, Members: c.members, Registerer: c.reg, Log: c.log,
		Command: func(ctx context.Context, role, id string, cmd control.Command) error {
			return control.SendCommand(ctx, c.nc, role, id, cmd)
		}}
	for _, e := range c.o.Extensions {
		if err := e.Attach(h); err != nil {
			return err
		}
	}
	return nil
}

// observed returns b, wrapped so that every request it completes is
// observed by the extensions; b itself without extensions. With
// RefusalObservers, reg gets pdserve_planner_refusal_retries_total (nil:
// none) and now is the clock of the refusals' retry window.
func observed(b frontend.Backend, exts []Extension, reg prometheus.Registerer, now func() time.Time) frontend.Backend {
	if len(exts) == 0 {
		return b
	}
	ob := observingBackend{Backend: b, exts: exts}
	for _, e := range exts {
		if w, ok := e.(RequestWatcher); ok {
			ob.watchers = append(ob.watchers, w)
		}
		if r, ok := e.(RefusalObserver); ok {
			ob.refusals = append(ob.refusals, r)
		}
	}
	if len(ob.refusals) > 0 {
		ob.counted = newRefusalSet(reg, now)
	}
	return ob
}

// observingBackend passes the budget trace of every request its Backend
// completed (finished with stop or length, or stopped by a stop string)
// to its extensions, before Complete returns, and the trace of every
// request the pools refused for want of room to those that are
// RefusalObservers, once per request: a client's retry of a refusal
// they heard of is not passed again (refusalSet), and when it is served,
// it goes to a RetryObserver as such. Other failures and
// cancelled requests are not observed. Every request, however it ends,
// is watched by the extensions that are RequestWatchers.
type observingBackend struct {
	frontend.Backend
	exts     []Extension
	watchers []RequestWatcher  // the exts that are RequestWatchers
	refusals []RefusalObserver // the exts that are RefusalObservers
	counted  *refusalSet       // the refusals they heard of; nil without them
}

// refused tells the RefusalObservers of req, unless it retries a refusal
// they heard of.
func (b observingBackend) refused(req *frontend.Request) {
	if len(b.refusals) == 0 || !b.counted.first(req) {
		return
	}
	for _, r := range b.refusals {
		r.ObserveRefused(req.Trace, req.MaxTokens)
	}
}

var (
	_ frontend.Backend         = observingBackend{}
	_ frontend.ForwardObserver = observingBackend{}
)

// ObserveForwarded implements frontend.ForwardObserver: a request another
// region served is demand of this region's pools, as a refused one is.
func (b observingBackend) ObserveForwarded(req *frontend.Request) {
	b.refused(req)
}

func (b observingBackend) Complete(ctx context.Context, req *frontend.Request, emit frontend.EmitFunc) ([]string, error) {
	dones := make([]func(), len(b.watchers))
	for i, w := range b.watchers {
		dones[i] = w.WatchRequest(req.Trace)
	}
	finish, err := b.Backend.Complete(ctx, req, emit)
	for _, done := range dones {
		done()
	}
	switch {
	case err == nil || errors.Is(err, frontend.ErrStopped):
		retry := b.counted != nil && b.counted.retried(req)
		for _, e := range b.exts {
			if r, ok := e.(RetryObserver); ok && retry {
				r.ObserveServedRetry(req.Trace)
				continue
			}
			e.ObserveTrace(req.Trace)
		}
	case errors.Is(err, frontend.ErrOverloaded):
		b.refused(req)
	}
	return finish, err
}
