package sweep

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/pdserve/pdserve/loadtest/metrics"
)

// ErrOptions reports unusable search options.
var ErrOptions = errors.New("sweep: bad options")

// Probe runs a benchmark at rate (requests per second, > 0 and finite)
// and returns its summary.
type Probe func(ctx context.Context, rate float64) (metrics.Summary, error)

// Options shape a search.
type Options struct {
	// Rates is the grid, probed in ascending order; each > 0 and finite.
	Rates []float64
	// Target is the attainment to meet, in (0, 1].
	Target float64
	// Steps is the number of probes after the grid spent on narrowing (or
	// first widening) the bracket; 0 probes the grid only.
	Steps int
	// MinGap stops narrowing once (fail − pass) / pass < MinGap; 0 means
	// 0.02.
	MinGap float64
	// StopEarly skips the grid rates above the first failing one.
	StopEarly bool
}

// Point is one probe.
type Point struct {
	Rate    float64 // requests per second
	Summary metrics.Summary
	Passed  bool // Summary.Attainment ≥ Target
	Search  bool // probed by the search, not the grid
}

// Result is a search's answer.
type Result struct {
	// Points are every probe, sorted by rate.
	Points []Point
	// MaxRate is the highest probed rate that passed with every lower grid
	// rate passing too; 0 when none did.
	MaxRate float64
	// FailRate is the lowest failing rate above MaxRate; +Inf when none
	// failed (MaxRate is then only a lower bound).
	FailRate float64
}

// Bracketed reports whether a failing rate bounds MaxRate from above.
func (r Result) Bracketed() bool { return !math.IsInf(r.FailRate, 1) }

// Search probes the grid and narrows the bracket. A probe error ends the
// search and is returned with the points so far.
func Search(ctx context.Context, o Options, probe Probe) (Result, error) {
	if len(o.Rates) == 0 {
		return Result{}, fmt.Errorf("%w: no rates", ErrOptions)
	}
	if !(o.Target > 0 && o.Target <= 1) {
		return Result{}, fmt.Errorf("%w: attainment target %v not in (0, 1]", ErrOptions, o.Target)
	}
	if o.Steps < 0 {
		return Result{}, fmt.Errorf("%w: %d search steps", ErrOptions, o.Steps)
	}
	rates := append([]float64(nil), o.Rates...)
	sort.Float64s(rates)
	for _, r := range rates {
		if !(r > 0) || math.IsInf(r, 0) {
			return Result{}, fmt.Errorf("%w: rate %v: want finite and > 0", ErrOptions, r)
		}
	}
	gap := o.MinGap
	if gap <= 0 {
		gap = 0.02
	}
	res := Result{FailRate: math.Inf(1)}
	run := func(rate float64, search bool) (bool, error) {
		s, err := probe(ctx, rate)
		if err != nil {
			return false, fmt.Errorf("sweep: rate %g req/s: %w", rate, err)
		}
		p := Point{Rate: rate, Summary: s, Passed: s.Attainment >= o.Target, Search: search}
		res.Points = append(res.Points, p)
		return p.Passed, nil
	}
	finish := func(err error) (Result, error) {
		sort.SliceStable(res.Points, func(i, j int) bool { return res.Points[i].Rate < res.Points[j].Rate })
		return res, err
	}
	failed := false
	for _, r := range rates {
		if failed && o.StopEarly {
			break
		}
		ok, err := run(r, false)
		if err != nil {
			return finish(err)
		}
		switch {
		case !ok && !failed:
			failed = true
			res.FailRate = r
		case ok && !failed:
			res.MaxRate = r
		}
	}
	steps := o.Steps
	// Widen: every grid rate passed; double until one fails.
	for !res.Bracketed() && steps > 0 {
		steps--
		r := 2 * res.MaxRate
		ok, err := run(r, true)
		if err != nil {
			return finish(err)
		}
		if ok {
			res.MaxRate = r
		} else {
			res.FailRate = r
		}
	}
	// Narrow by bisection.
	for res.Bracketed() && steps > 0 {
		if res.MaxRate > 0 && (res.FailRate-res.MaxRate)/res.MaxRate < gap {
			break
		}
		steps--
		mid := (res.MaxRate + res.FailRate) / 2
		ok, err := run(mid, true)
		if err != nil {
			return finish(err)
		}
		if ok {
			res.MaxRate = mid
		} else {
			res.FailRate = mid
		}
	}
	return finish(nil)
}
