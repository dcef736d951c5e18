package runner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
)

// Batch is one planned step: prompt chunks and decode tokens, with the
// request each item belongs to (PrefillOf[i] owns Prefill[i], DecodeOf[i]
// owns Decode[i]); T is the policy's request type. The Policy builds it in
// Plan and gets it back in Done; the Runner only reads it.
type Batch[T any] struct {
	Prefill   []engine.PrefillItem
	PrefillOf []T
	Decode    []engine.DecodeItem
	DecodeOf  []T
	// OnKV receives the KV the step's prompt chunks compute, as
	// engine.KVFunc documents (nil: the engine keeps it). An error from it
	// fails the step.
	OnKV engine.KVFunc
}

// Size is the step's items: prompt chunks and decode tokens.
func (b Batch[T]) Size() int { return len(b.Prefill) + len(b.Decode) }

// Result is what one step produced: an output per item, in the batch's
// order, and when the step started and ended (Options.Now). When Err is
// set (the engine failed, returned the wrong number of outputs, or the
// loop is stopping: the Done's ctx ended), the outputs are not to be
// used and no sequence of the batch advanced.
type Result struct {
	Prefill, Decode []engine.Output
	Start, End      time.Time
	Err             error
}

// Policy is a worker's admission and ordering policy. The Runner calls
// its methods from its loop goroutine only, one at a time, holding the
// engine lock: they may use the engine freely. Each takes the worker's
// own locks as it needs them.
type Policy[T any] interface {
	// Plan brings waiting requests into the batch at a step boundary
	// (admission, imports of KV received meanwhile), drops those that
	// ended, and picks the next step. An empty Batch means nothing to
	// run: the Runner waits for a wake-up (Signals.Wake) and asks again.
	Plan() Batch[T]
	// Done hands out the results of b, the last batch Plan returned; ctx
	// is the loop's (ended: the loop is stopping).
	Done(ctx context.Context, b Batch[T], r Result)
	// Shutdown ends every request still live and frees what it holds of
	// the engine. It is called once, when the loop ends.
	Shutdown()
}

// Options configure a Runner.
type Options struct {
	// Role names the worker in errors ("prefill", "decode").
	Role string
	// PrefillOnly runs each step with Engine.Prefill (a prefill worker's
	// batches hold no decode items) instead of engine.RunStep.
	PrefillOnly bool
	// Stopped ends the loop when it ends (the worker's own lifetime; the
	// context given to Run ends it too). Nil: only Run's context does.
	Stopped context.Context
	// Observe records each step's duration and size (the worker's
	// metrics); nil: nothing.
	Observe func(d time.Duration, batch int)
	// Beside runs in its own goroutine while the loop runs (periodic
	// housekeeping); its context ends when the loop stops, and Run returns
	// only after it returned. Nil: none.
	Beside func(ctx context.Context)
	// Now is the clock of the step stamps; nil: time.Now.
	Now func() time.Time
}

// Runner is a worker's batch loop over one engine. Create it with New,
// run it with Run.
type Runner[T any] struct {
	eng engine.Engine
	p   Policy[T]
	sig *batching.Signals
	o   Options

	// engMu guards the engine: the loop holds it for a whole step (plan,
	// run, hand out); whoever else touches the engine takes it with
	// LockEngine (decode: ending a request that holds an engine sequence).
	engMu sync.Mutex

	mu    sync.Mutex // guards ran and steps; taken after any worker lock, never before
	ran   bool
	steps batching.StepHistory
}

// New returns a Runner of eng under policy p, waiting on sig when p
// plans nothing. It does not start it.
func New[T any](eng engine.Engine, p Policy[T], sig *batching.Signals, o Options) *Runner[T] {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Stopped == nil {
		o.Stopped = context.Background()
	}
	return &Runner[T]{eng: eng, p: p, sig: sig, o: o}
}

// Run runs the loop until ctx or Options.Stopped ends, then calls the
// Policy's Shutdown and waits for Options.Beside. It returns nil after a
// stop, or an error, doing nothing, when Run was called before.
func (r *Runner[T]) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.ran {
		r.mu.Unlock()
		return fmt.Errorf("%s: Run called twice", r.o.Role)
	}
	r.ran = true
	r.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel()
	stop := context.AfterFunc(r.o.Stopped, cancel)
	defer stop()
	if r.o.Beside != nil {
		bg.Go(func() { r.o.Beside(ctx) })
	}
	defer r.shutdown()
	for {
		r.engMu.Lock()
		b := r.p.Plan()
		if b.Size() == 0 {
			r.engMu.Unlock()
			select {
			case <-r.sig.Woken():
				continue
			case <-ctx.Done():
				return nil
			}
		}
		if ctx.Err() != nil {
			r.engMu.Unlock()
			return nil
		}
		r.step(ctx, b)
		r.engMu.Unlock()
	}
}

func (r *Runner[T]) shutdown() {
	r.engMu.Lock()
	defer r.engMu.Unlock()
	r.p.Shutdown()
}

// step runs b on the engine, records it, and hands its results to the
// Policy. The caller holds engMu.
func (r *Runner[T]) step(ctx context.Context, b Batch[T]) {
	var res Result
	res.Start = r.o.Now()
	if r.o.PrefillOnly {
		if len(b.Decode) > 0 {
			res.Err = fmt.Errorf("%s: %d decode items in a prefill-only step", r.o.Role, len(b.Decode))
		} else {
			res.Prefill, res.Err = r.eng.Prefill(ctx, b.Prefill, b.OnKV)
		}
	} else {
		res.Prefill, res.Decode, res.Err = engine.RunStep(ctx, r.eng, b.Prefill, b.Decode, b.OnKV)
	}
	res.End = r.o.Now()
	d, n := res.End.Sub(res.Start), b.Size()
	if r.o.Observe != nil {
		r.o.Observe(d, n)
	}
	if res.Err == nil && (len(res.Prefill) != len(b.Prefill) || len(res.Decode) != len(b.Decode)) {
		if r.o.PrefillOnly {
			res.Err = fmt.Errorf("%s: engine returned %d outputs for %d items", r.o.Role, len(res.Prefill), len(b.Prefill))
		} else {
			res.Err = fmt.Errorf("%s: engine returned %d+%d outputs for %d+%d items", r.o.Role, len(res.Prefill), len(res.Decode), len(b.Prefill), len(b.Decode))
		}
	}
	r.mu.Lock()
	r.steps.Record(d, n)
	r.mu.Unlock()
	r.p.Done(ctx, b, res)
}

// Steps returns the recent step times in milliseconds, oldest first (a
// copy the caller owns), and the last step's size, for Stats. Safe for
// concurrent use, under any worker lock.
func (r *Runner[T]) Steps() (timesMs []float64, lastBatch int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.steps.TimesMs(), r.steps.LastBatch()
}

// LockEngine waits for the step in progress, if any, to end and keeps the
// loop from starting another until UnlockEngine: for a caller outside the
// loop that must touch the engine (free a sequence). It is taken before
// any lock the Policy takes in its methods.
func (r *Runner[T]) LockEngine() { r.engMu.Lock() }

// UnlockEngine lets the loop go on after LockEngine.
func (r *Runner[T]) UnlockEngine() { r.engMu.Unlock() }
