package metrics

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pdserve/pdserve/loadtest/client"
)

// ErrBadSpec reports an unparsable --goodput, --percentile-metrics or
// --metric-percentiles value.
var ErrBadSpec = errors.New("metrics: bad specification")

// SLO holds per-request latency objectives; a zero field is not set.
type SLO struct {
	TTFT, TPOT, E2EL time.Duration
}

// Set reports whether any objective is set.
func (s SLO) Set() bool { return s.TTFT > 0 || s.TPOT > 0 || s.E2EL > 0 }

// String returns the --goodput spelling, e.g. "ttft:300 tpot:50".
func (s SLO) String() string {
	var parts []string
	for _, kv := range []struct {
		k string
		v time.Duration
	}{{"ttft", s.TTFT}, {"tpot", s.TPOT}, {"e2el", s.E2EL}} {
		if kv.v > 0 {
			parts = append(parts, kv.k+":"+strconv.FormatFloat(ms(kv.v), 'g', -1, 64))
		}
	}
	return strings.Join(parts, " ")
}

// Map returns the objectives in milliseconds by name ("ttft", "tpot",
// "e2el"), only those set.
func (s SLO) Map() map[string]float64 {
	m := map[string]float64{}
	if s.TTFT > 0 {
		m["ttft"] = ms(s.TTFT)
	}
	if s.TPOT > 0 {
		m["tpot"] = ms(s.TPOT)
	}
	if s.E2EL > 0 {
		m["e2el"] = ms(s.E2EL)
	}
	return m
}

// ParseGoodput parses vLLM's --goodput values: "KEY:MS" items (keys ttft,
// tpot, e2el; milliseconds > 0), given as separate arguments or separated by
// spaces or commas.
func ParseGoodput(items ...string) (SLO, error) {
	var s SLO
	for _, it := range items {
		for _, f := range strings.FieldsFunc(it, func(r rune) bool { return r == ' ' || r == ',' }) {
			k, v, ok := strings.Cut(f, ":")
			x, err := strconv.ParseFloat(v, 64)
			if !ok || err != nil || !(x > 0) || math.IsInf(x, 0) {
				return SLO{}, fmt.Errorf("%w: goodput %q: want KEY:MILLISECONDS with a positive number", ErrBadSpec, f)
			}
			d := time.Duration(x * float64(time.Millisecond))
			switch strings.ToLower(k) {
			case "ttft":
				s.TTFT = d
			case "tpot":
				s.TPOT = d
			case "e2el":
				s.E2EL = d
			default:
				return SLO{}, fmt.Errorf("%w: goodput %q: key %q is not ttft, tpot or e2el", ErrBadSpec, f, k)
			}
		}
	}
	return s, nil
}

// TPOT returns a completed request's time per output token, excluding the
// first: (E2EL − TTFT) / (output tokens − 1), and false when it has one
// output token or fewer.
func TPOT(o *client.Outcome) (time.Duration, bool) {
	if o.OutputTokens <= 1 {
		return 0, false
	}
	return (o.Latency - o.TTFT) / time.Duration(o.OutputTokens-1), true
}

// Good reports whether o completed and meets every objective set (TPOT of a
// one-token request counts as 0).
func (s SLO) Good(o *client.Outcome) bool {
	if !o.Success {
		return false
	}
	tpot, _ := TPOT(o)
	return (s.TTFT == 0 || o.TTFT <= s.TTFT) &&
		(s.TPOT == 0 || tpot <= s.TPOT) &&
		(s.E2EL == 0 || o.Latency <= s.E2EL)
}

// AllMetrics are the client-side metric names, in report order.
var AllMetrics = []string{"ttft", "ttfo", "tpot", "itl", "e2el"}

// ParseMetricNames parses --percentile-metrics: a comma-separated subset of
// ttft, ttfo, tpot, itl, e2el.
func ParseMetricNames(spec string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(AllMetrics, f) {
			return nil, fmt.Errorf("%w: metric %q: want ttft, ttfo, tpot, itl or e2el", ErrBadSpec, f)
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no metric in %q", ErrBadSpec, spec)
	}
	return out, nil
}

// ParsePercentiles parses --metric-percentiles: comma-separated numbers in
// (0, 100], e.g. "50,90,95,99" or "99.9".
func ParsePercentiles(spec string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := strconv.ParseFloat(f, 64)
		if err != nil || !(p > 0 && p <= 100) {
			return nil, fmt.Errorf("%w: percentile %q: want a number in (0, 100]", ErrBadSpec, f)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no percentile in %q", ErrBadSpec, spec)
	}
	return out, nil
}

// PercentileName returns vLLM's key fragment for p: "p99", "p99.9".
func PercentileName(p float64) string {
	return "p" + strconv.FormatFloat(p, 'f', -1, 64)
}

// Stats summarises a set of values in milliseconds.
type Stats struct {
	N           int
	Mean        float64
	Median      float64
	Std         float64 // population standard deviation (numpy's np.std)
	Percentiles []Percentile
}

// Percentile is one percentile's value, in milliseconds.
type Percentile struct {
	P     float64 // in (0, 100]
	Value float64
}

// Get returns the percentile p's value, or false when it was not computed.
func (s Stats) Get(p float64) (float64, bool) {
	for _, q := range s.Percentiles {
		if q.P == p {
			return q.Value, true
		}
	}
	return 0, false
}

// Summarize computes Stats of xs (milliseconds); xs is not modified.
func Summarize(xs []float64, ps []float64) Stats {
	s := Stats{N: len(xs)}
	sorted := slices.Clone(xs)
	sort.Float64s(sorted)
	if len(sorted) > 0 {
		var sum float64
		for _, x := range sorted {
			sum += x
		}
		s.Mean = sum / float64(len(sorted))
		var sq float64
		for _, x := range sorted {
			sq += (x - s.Mean) * (x - s.Mean)
		}
		s.Std = math.Sqrt(sq / float64(len(sorted)))
	}
	s.Median = Quantile(sorted, 50)
	for _, p := range ps {
		s.Percentiles = append(s.Percentiles, Percentile{P: p, Value: Quantile(sorted, p)})
	}
	return s
}

// Quantile returns the p-th percentile (0–100) of sorted values by linear
// interpolation between closest ranks (numpy's default), 0 when empty.
func Quantile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	pos := p / 100 * float64(n-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, n-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// Options select what Compute reports.
type Options struct {
	// Metrics get mean/median/std/percentiles; nil means all of AllMetrics
	// (ttfo only when a stream carried reasoning).
	Metrics []string
	// Percentiles to report; nil means 50, 90, 95, 99.
	Percentiles []float64
	// SLO decides which requests are good.
	SLO SLO
}

// DefaultPercentiles are reported when none are asked for.
var DefaultPercentiles = []float64{50, 90, 95, 99}

// Summary is a benchmark's result.
type Summary struct {
	Total     int // requests sent
	Completed int
	Failed    int
	Good      int           // completed and meeting every SLO (= Completed without SLOs)
	Duration  time.Duration // the benchmark's wall time
	// Token counts: prompt tokens of completed requests (from the
	// workload) and their output tokens.
	TotalInput, TotalOutput int
	// Rates per second of Duration.
	RequestThroughput    float64
	RequestGoodput       float64 // meaningful when SLO.Set()
	OutputThroughput     float64
	TotalTokenThroughput float64
	// Attainment is Good / Total (0 when nothing was sent).
	Attainment float64
	// MaxOutputTokensPerS and MaxConcurrentRequests are vLLM's peak figures
	// over one-second buckets (one token per event).
	MaxOutputTokensPerS   float64
	MaxConcurrentRequests int
	// Metrics holds each reported metric's Stats; MetricOrder lists the
	// names in report order.
	Metrics     map[string]Stats
	MetricOrder []string
	Percentiles []float64
	SLO         SLO
	// Reasoning counts completed requests whose stream carried reasoning.
	Reasoning int
	// Budget aggregates the server's per-request budget objects; nil when
	// none arrived.
	Budget *Budget
}

// Compute summarises outcomes of a run that took dur.
func Compute(outs []client.Outcome, dur time.Duration, o Options) Summary {
	ps := o.Percentiles
	if ps == nil {
		ps = DefaultPercentiles
	}
	s := Summary{Total: len(outs), Duration: dur, Percentiles: ps, SLO: o.SLO, Metrics: map[string]Stats{}}
	vals := map[string][]float64{}
	for i := range outs {
		out := &outs[i]
		if !out.Success {
			s.Failed++
			continue
		}
		s.Completed++
		s.TotalInput += out.PromptLen
		s.TotalOutput += out.OutputTokens
		vals["ttft"] = append(vals["ttft"], ms(out.TTFT))
		if out.HasAnswer {
			vals["ttfo"] = append(vals["ttfo"], ms(out.TTFO))
		}
		if out.Reasoning {
			s.Reasoning++
		}
		if tpot, ok := TPOT(out); ok {
			vals["tpot"] = append(vals["tpot"], ms(tpot))
		}
		for _, g := range out.ITL {
			vals["itl"] = append(vals["itl"], ms(g))
		}
		vals["e2el"] = append(vals["e2el"], ms(out.Latency))
		if o.SLO.Good(out) {
			s.Good++
		}
	}
	if sec := dur.Seconds(); sec > 0 {
		s.RequestThroughput = float64(s.Completed) / sec
		s.RequestGoodput = float64(s.Good) / sec
		s.OutputThroughput = float64(s.TotalOutput) / sec
		s.TotalTokenThroughput = float64(s.TotalInput+s.TotalOutput) / sec
	}
	if s.Total > 0 {
		s.Attainment = float64(s.Good) / float64(s.Total)
	}
	names := o.Metrics
	if names == nil {
		names = AllMetrics
	}
	for _, m := range AllMetrics {
		if !slices.Contains(names, m) || (m == "ttfo" && s.Reasoning == 0) {
			continue
		}
		s.MetricOrder = append(s.MetricOrder, m)
		s.Metrics[m] = Summarize(vals[m], ps)
	}
	s.MaxOutputTokensPerS, s.MaxConcurrentRequests = peaks(outs)
	s.Budget = aggregateBudget(outs, ps)
	return s
}

// peaks computes vLLM's max output tokens per second and max concurrent
// requests over one-second buckets from the earliest successful start.
func peaks(outs []client.Outcome) (float64, int) {
	var t0, tEnd time.Time
	first := true
	for i := range outs {
		o := &outs[i]
		if !o.Success {
			continue
		}
		end := o.Start.Add(o.Latency)
		if first || o.Start.Before(t0) {
			t0 = o.Start
		}
		if first || end.After(tEnd) {
			tEnd = end
		}
		first = false
	}
	if first {
		return 0, 0
	}
	n := int(math.Ceil(tEnd.Sub(t0).Seconds())) + 1
	tokens := make([]float64, n)
	conc := make([]int, n)
	for i := range outs {
		o := &outs[i]
		if !o.Success {
			continue
		}
		base := o.Start.Sub(t0)
		for _, tt := range o.TokenTimes() {
			if b := int((base + tt).Seconds()); b >= 0 && b < n {
				tokens[b]++
			}
		}
		for b := int(base.Seconds()); b <= int((base+o.Latency).Seconds()) && b < n; b++ {
			conc[b]++
		}
	}
	return slices.Max(tokens), slices.Max(conc)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
