package router

import (
	"math"
	"time"

	"github.com/pdserve/pdserve/pkg/router/framework"
	"github.com/prometheus/client_golang/prometheus"
)

// The plugin interfaces and the types they see, defined in package
// framework (which the plugins import) and re-exported here.
type (
	Worker        = framework.Worker
	PrefixMatcher = framework.PrefixMatcher
	Request       = framework.Request
	Candidate     = framework.Candidate
	Load          = framework.Load
	Input         = framework.Input
	Plugin        = framework.Plugin
	Filter        = framework.Filter
	Scorer        = framework.Scorer
	Picker        = framework.Picker
)

// Profile names, as in Input.Profile and the metrics' profile label.
const (
	ProfileDecode  = "decode"
	ProfilePrefill = "prefill"
)

// Profile is the plugins that choose one worker: filters, then weighted
// scorers, then a picker. Its plugins must be safe for concurrent use;
// the router calls them under its lock, one cycle at a time.
type Profile struct {
	// Filters decide which workers may take the request at all (draining,
	// excluded, model): when they leave none, Route fails with
	// ErrNoDecodeWorkers or ErrNoPrefillWorkers.
	Filters []Filter
	// Capacity filters decide which of those have room now: when they
	// leave none, Route fails with ErrNoCapacity. In the prefill profile
	// the Decider's busy rule runs between Filters and Capacity.
	Capacity []Filter
	// Scorers rate the candidates; a candidate's total is Σ weight ×
	// score. Scorers of weight 0 are not run.
	Scorers []WeightedScorer
	// Picker chooses from the totals; nil is the highest total, ties by
	// the lowest id (plugins/maxscore).
	Picker Picker
}

// WeightedScorer is a scorer and its weight (≥ 0) in its profile.
type WeightedScorer struct {
	Scorer Scorer
	Weight float64
}

// profile is a Profile ready to run: its plugins with their timers.
type profile struct {
	name     string
	filters  []timed[Filter]
	capacity []timed[Filter]
	scorers  []timed[Scorer]
	weights  []float64
	picker   timed[Picker]
	t        *timer // nil: untimed
}

// timed is a plugin and the histogram of its calls (nil: not timed).
type timed[P Plugin] struct {
	p   P
	obs prometheus.Observer
}

// timer measures plugin calls; a nil timer measures nothing.
type timer struct {
	clock func() time.Time
	hist  *prometheus.HistogramVec
}

func (t *timer) observer(profile, kind string, p Plugin) prometheus.Observer {
	if t == nil {
		return nil
	}
	return t.hist.WithLabelValues(profile, p.Name(), kind)
}

// start returns the time a call starts, or the zero time when untimed.
func (t *timer) start() time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.clock()
}

func (t *timer) stop(obs prometheus.Observer, start time.Time) {
	if t != nil && obs != nil {
		obs.Observe(t.clock().Sub(start).Seconds())
	}
}

func compile(name string, p Profile, t *timer, picker Picker) *profile {
	c := &profile{name: name, t: t}
	for _, f := range p.Filters {
		c.filters = append(c.filters, timed[Filter]{f, t.observer(name, "filter", f)})
	}
	for _, f := range p.Capacity {
		c.capacity = append(c.capacity, timed[Filter]{f, t.observer(name, "filter", f)})
	}
	for _, s := range p.Scorers {
		if s.Weight > 0 {
			c.scorers = append(c.scorers, timed[Scorer]{s.Scorer, t.observer(name, "scorer", s.Scorer)})
			c.weights = append(c.weights, s.Weight)
		}
	}
	if p.Picker != nil {
		picker = p.Picker
	}
	c.picker = timed[Picker]{picker, t.observer(name, "picker", picker)}
	return c
}

// filter runs fs over cs in order. It returns the candidates left and,
// when they are none, the name of the filter that removed the last ones
// ("" when cs was empty to begin with).
func (p *profile) filter(in *Input, fs []timed[Filter], cs []Candidate) ([]Candidate, string) {
	if len(cs) == 0 {
		return cs, ""
	}
	for _, f := range fs {
		s := p.t.start()
		cs = f.p.Filter(in, cs)
		p.t.stop(f.obs, s)
		if len(cs) == 0 {
			return cs, f.p.Name()
		}
	}
	return cs, ""
}

// pick scores cs (non-empty) and returns the index the picker chose.
// scores and totals are scratch buffers, grown as needed.
func (p *profile) pick(in *Input, cs []Candidate, scores, totals *[]float64) int {
	if len(cs) == 1 && len(p.scorers) == 0 {
		return 0
	}
	*scores, *totals = grow(*scores, len(cs)), grow(*totals, len(cs))
	sc, tot := *scores, *totals
	clear(tot)
	for k, s := range p.scorers {
		clear(sc)
		st := p.t.start()
		s.p.Score(in, cs, sc)
		p.t.stop(s.obs, st)
		w := p.weights[k]
		for i, v := range sc {
			if !(v >= 0) { // negative or NaN
				v = 0
			}
			tot[i] += w * math.Min(v, 1)
		}
	}
	st := p.t.start()
	i := p.picker.p.Pick(in, cs, tot)
	p.t.stop(p.picker.obs, st)
	return i
}

func grow(b []float64, n int) []float64 {
	if cap(b) < n {
		return make([]float64, n)
	}
	return b[:n]
}
