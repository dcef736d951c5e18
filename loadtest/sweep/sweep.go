package sweep

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"

	"github.com/pdserve/pdserve/loadtest/metrics"
)

// ErrOptions reports unusable search options.
var ErrOptions = errors.New("sweep: bad options")

// DefaultTolerance is the relative width of the bracket at which the
// search stops when Options.Tolerance is 0: the crossing is then known
// within 5 %.
const DefaultTolerance = 0.05

// Probe runs a benchmark at rate (requests per second, > 0 and finite)
// and returns its summary.
type Probe func(ctx context.Context, rate float64) (metrics.Summary, error)

// Options shape a search.
type Options struct {
	// Rates is the grid, probed in ascending order; each > 0 and finite.
	Rates []float64
	// Target is the attainment to meet, in (0, 1].
	Target float64
	// Steps caps the probes after the grid (doubling past it, halving below
	// it, bisecting the bracket); 0 probes the grid only.
	Steps int
	// Tolerance stops the bisection once (FailRate − MaxRate) / MaxRate ≤
	// Tolerance; in (0, 1), 0 means DefaultTolerance.
	Tolerance float64
	// StopEarly skips the grid rates above the first failing one.
	StopEarly bool
}

// Point is one probe.
type Point struct {
	Rate    float64 // requests per second
	Summary metrics.Summary
	Passed  bool // Summary.Attainment ≥ Target
	Search  bool // probed by the search, not the grid
	// Outlier marks a probe on the wrong side of the crossing the search
	// settled on: a pass above it or a failure below it. Attainment is then
	// not monotone in the rate there, and the probe is taken for noise.
	Outlier bool
}

// Result is a search's answer: the crossing of the attainment target lies
// in [MaxRate, FailRate].
type Result struct {
	// Points are every probe, sorted by rate.
	Points []Point
	// MaxRate is the last rate meeting the target: the highest passing
	// probe below the crossing; 0 when none passed.
	MaxRate float64
	// FailRate is the first rate failing: the lowest failing probe above
	// the crossing; +Inf when none failed (MaxRate is then only a lower
	// bound).
	FailRate float64
	// Tolerance is the relative bracket width the search aimed at.
	Tolerance float64
}

// Bracketed reports whether a failing rate bounds MaxRate from above.
func (r Result) Bracketed() bool { return !math.IsInf(r.FailRate, 1) }

// Gap returns the bracket's relative width (FailRate − MaxRate) / MaxRate,
// +Inf when it is open on either side.
func (r Result) Gap() float64 {
	if r.MaxRate <= 0 || !r.Bracketed() {
		return math.Inf(1)
	}
	return (r.FailRate - r.MaxRate) / r.MaxRate
}

// Converged reports whether the bracket is within Tolerance.
func (r Result) Converged() bool { return r.Gap() <= r.Tolerance*(1+1e-9) }

// Outliers returns the probes taken for noise (see Point.Outlier).
func (r Result) Outliers() []Point {
	var out []Point
	for _, p := range r.Points {
		if p.Outlier {
			out = append(out, p)
		}
	}
	return out
}

// Search probes the grid, then narrows the bracket around the crossing of
// the target: it doubles past the grid while every probe passes, halves
// below it while every probe fails, and bisects [MaxRate, FailRate] until
// it is within Options.Tolerance or Options.Steps probes are spent.
//
// Attainment measured at a finite number of requests is noisy, so it need
// not fall monotonically with the rate near the target. The crossing is
// the split of the probes, sorted by rate, into a passing lower part and a
// failing upper part that misclassifies the least: each probe on the wrong
// side costs |attainment − target| (a near miss is weak evidence), ties
// go to the lower split. The probes on the wrong side are Outliers. The
// midpoints are rounded to three significant digits, so the probed rates
// are a function of the grid and the pass/fail outcomes alone: the same
// outcomes give the same probes. A probe error ends the search and is
// returned with the points so far.
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
	tol := o.Tolerance
	if tol == 0 {
		tol = DefaultTolerance
	}
	if !(tol > 0 && tol < 1) {
		return Result{}, fmt.Errorf("%w: tolerance %v not in (0, 1)", ErrOptions, o.Tolerance)
	}
	rates := slices.Clone(o.Rates)
	sort.Float64s(rates)
	rates = slices.Compact(rates)
	for _, r := range rates {
		if !(r > 0) || math.IsInf(r, 0) {
			return Result{}, fmt.Errorf("%w: rate %v: want finite and > 0", ErrOptions, r)
		}
	}
	res := Result{FailRate: math.Inf(1), Tolerance: tol}
	run := func(rate float64, search bool) (bool, error) {
		s, err := probe(ctx, rate)
		if err != nil {
			return false, fmt.Errorf("sweep: rate %g req/s: %w", rate, err)
		}
		p := Point{Rate: rate, Summary: s, Passed: s.Attainment >= o.Target, Search: search}
		i, _ := slices.BinarySearchFunc(res.Points, rate, func(p Point, r float64) int { return cmpFloat(p.Rate, r) })
		res.Points = slices.Insert(res.Points, i, p)
		res.settle(o.Target)
		return p.Passed, nil
	}
	failed := false
	for _, r := range rates {
		if failed && o.StopEarly {
			break
		}
		ok, err := run(r, false)
		if err != nil {
			return res, err
		}
		failed = failed || !ok
	}
	for steps := o.Steps; steps > 0; steps-- {
		next, ok := res.next()
		if !ok {
			break
		}
		if _, err := run(next, true); err != nil {
			return res, err
		}
	}
	return res, nil
}

// next returns the rate to probe next, false when the bracket is within
// tolerance or cannot be split further.
func (r *Result) next() (float64, bool) {
	lo, hi := r.MaxRate, r.FailRate
	var x float64
	switch {
	case !r.Bracketed():
		x = 2 * lo
	case lo == 0:
		x = round3(hi / 2)
	case r.Converged():
		return 0, false
	default:
		x = round3((lo + hi) / 2)
		if !(x > lo && x < hi) {
			x = (lo + hi) / 2
		}
	}
	if !(x > lo && x < hi) || r.probed(x) {
		return 0, false
	}
	return x, true
}

func (r *Result) probed(x float64) bool {
	for _, p := range r.Points {
		if p.Rate == x {
			return true
		}
	}
	return false
}

// settle finds the crossing of the sorted points (see Search) and sets
// MaxRate, FailRate and the outliers.
func (r *Result) settle(target float64) {
	n := len(r.Points)
	// cost(k): probes [0, k) taken to pass, [k, n) to fail.
	w := func(p Point) float64 { return math.Abs(p.Summary.Attainment-target) + 1e-9 }
	cost := 0.0
	for _, p := range r.Points {
		if p.Passed {
			cost += w(p)
		}
	}
	best, bestK := cost, 0
	for k := 1; k <= n; k++ {
		p := r.Points[k-1]
		if p.Passed {
			cost -= w(p)
		} else {
			cost += w(p)
		}
		if cost < best-1e-12 {
			best, bestK = cost, k
		}
	}
	r.MaxRate, r.FailRate = 0, math.Inf(1)
	if bestK > 0 {
		r.MaxRate = r.Points[bestK-1].Rate
	}
	if bestK < n {
		r.FailRate = r.Points[bestK].Rate
	}
	for i := range r.Points {
		p := &r.Points[i]
		p.Outlier = (i < bestK) != p.Passed
	}
}

// round3 rounds x to three significant digits.
func round3(x float64) float64 {
	y, err := strconv.ParseFloat(strconv.FormatFloat(x, 'g', 3, 64), 64)
	if err != nil {
		return x
	}
	return y
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
