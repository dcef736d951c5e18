package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/pdserve/pdserve/loadtest/client"
	"github.com/pdserve/pdserve/pkg/workload"
)

// Clock tells the time and waits for it.
type Clock interface {
	Now() time.Time
	// SleepUntil returns when the clock reaches t (at once if it has), or
	// with ctx's error when ctx is done first.
	SleepUntil(ctx context.Context, t time.Time) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RealClock is the wall clock.
var RealClock Clock = realClock{}

// Doer sends one request and reports its outcome (client.Client.Do). It is
// called from many goroutines at once.
type Doer func(ctx context.Context, r *workload.Request) client.Outcome

// Config shapes a run.
type Config struct {
	// Schedule holds each request's send offset from the start; nil sends
	// all at once. Its length must match the requests'.
	Schedule []time.Duration
	// MaxConcurrency caps requests in flight; 0 means no cap.
	MaxConcurrency int
	// RequestTimeout bounds each request; 0 means none.
	RequestTimeout time.Duration
	// Clock defaults to RealClock.
	Clock Clock
	// Progress, when set, is called after each completion with the number
	// done and the total, one call at a time.
	Progress func(done, total int)
}

// Result is what a run did.
type Result struct {
	// Outcomes of the requests sent, in workload order.
	Outcomes []client.Outcome
	// Start is when the run began; Duration runs from Start until the last
	// request ended.
	Start    time.Time
	Duration time.Duration
	// Interrupted reports that the context ended the run early; Outcomes
	// then hold only the requests sent.
	Interrupted bool
}

// ErrConfig reports an unusable Config.
var ErrConfig = errors.New("runner: bad config")

// Run sends reqs with do according to cfg and waits for every request sent
// to end. Canceling ctx stops sending, cancels requests in flight, and
// returns what was sent with Interrupted set. No goroutine outlives Run.
func Run(ctx context.Context, reqs []workload.Request, do Doer, cfg Config) (Result, error) {
	if cfg.Schedule != nil && len(cfg.Schedule) != len(reqs) {
		return Result{}, fmt.Errorf("%w: %d scheduled offsets for %d requests", ErrConfig, len(cfg.Schedule), len(reqs))
	}
	if cfg.MaxConcurrency < 0 {
		return Result{}, fmt.Errorf("%w: max concurrency %d < 0", ErrConfig, cfg.MaxConcurrency)
	}
	clock := cfg.Clock
	if clock == nil {
		clock = RealClock
	}
	var sem chan struct{}
	if cfg.MaxConcurrency > 0 {
		sem = make(chan struct{}, cfg.MaxConcurrency)
	}
	outs := make([]client.Outcome, len(reqs))
	var (
		wg     sync.WaitGroup
		pmu    sync.Mutex
		nDone  int
		sent   int
		cutoff bool
	)
	start := clock.Now()
send:
	for i := range reqs {
		var off time.Duration
		if cfg.Schedule != nil {
			off = cfg.Schedule[i]
		}
		if err := clock.SleepUntil(ctx, start.Add(off)); err != nil {
			cutoff = true
			break
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				cutoff = true
				break send
			}
		}
		if ctx.Err() != nil {
			cutoff = true
			if sem != nil {
				<-sem
			}
			break
		}
		sent++
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rctx := ctx
			if cfg.RequestTimeout > 0 {
				var cancel context.CancelFunc
				rctx, cancel = context.WithTimeout(ctx, cfg.RequestTimeout)
				defer cancel()
			}
			outs[i] = do(rctx, &reqs[i])
			if sem != nil {
				<-sem
			}
			if cfg.Progress != nil {
				pmu.Lock()
				nDone++
				cfg.Progress(nDone, len(reqs))
				pmu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	res := Result{Start: start, Duration: clock.Now().Sub(start), Interrupted: cutoff}
	res.Outcomes = outs[:sent]
	return res, nil
}

// Scale divides every time in r by f (> 0): with a performance-model server
// that runs f times slower than modelled (time scale f), it turns wall
// times back into modelled times. The server's budget terms (numbers named
// *_ms in Outcome.Budget) are divided too.
func Scale(r *Result, f float64) {
	if f == 1 || f <= 0 {
		return
	}
	div := func(d time.Duration) time.Duration { return time.Duration(float64(d) / f) }
	r.Duration = div(r.Duration)
	for i := range r.Outcomes {
		o := &r.Outcomes[i]
		o.Start = r.Start.Add(div(o.Start.Sub(r.Start)))
		o.TTFT, o.TTFO, o.Latency = div(o.TTFT), div(o.TTFO), div(o.Latency)
		for k, g := range o.ITL {
			o.ITL[k] = div(g)
		}
		for k, v := range o.Budget {
			if x, ok := v.(float64); ok && strings.HasSuffix(k, "_ms") {
				o.Budget[k] = x / f
			}
		}
	}
}
