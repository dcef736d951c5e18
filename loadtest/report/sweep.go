package report

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/sweep"
)

// ColumnPercentile picks the percentile shown in sweep and comparison
// tables: 90 when asked for, else the highest asked.
func ColumnPercentile(ps []float64) float64 {
	if slices.Contains(ps, 90) {
		return 90
	}
	if len(ps) == 0 {
		return 90
	}
	return slices.Max(ps)
}

func metricAt(s metrics.Summary, name string, p float64) string {
	st, ok := s.Metrics[name]
	if !ok {
		return "n/a"
	}
	v, ok := st.Get(p)
	if !ok {
		return "n/a"
	}
	return f2(v)
}

// SweepMarkdown writes a sweep's table and its answer. gpus (≥ 1) turns
// rates into rates per unit; unit names what is counted ("GPU", "core";
// "" means "GPU").
func SweepMarkdown(w io.Writer, m Meta, res sweep.Result, target float64, slo metrics.SLO, gpus int, unit string) error {
	var b strings.Builder
	title := "Rate sweep"
	if m.Label != "" {
		title += ": " + m.Label
	}
	fmt.Fprintf(&b, "## %s\n\n", title)
	fmt.Fprintf(&b, "Endpoint %s%s (model %s); workload %s; arrivals %s; seed %d; %s.\n", m.BaseURL, m.Endpoint, m.Model, m.Workload, m.Arrival, m.Seed, Count(gpus, unit))
	fmt.Fprintf(&b, "A request is good when it meets every SLO (%s ms); target: %s of requests good. %s\n\n", slo, pct(target), PromptsText(m))
	sweepTable(&b, res)
	b.WriteString("\n")
	b.WriteString(MaxRateSentence(res, target, gpus, unit))
	b.WriteString("\n")
	if a := m.Attribution(); a != "" {
		fmt.Fprintf(&b, "\nData: %s.\n", a)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// HitText writes a run's prefix hit ratio (the share of its prompt tokens
// served from a prefix cache, see metrics.Summary.PrefixHitRatio), "n/a"
// when the server reported none.
func HitText(s metrics.Summary) string {
	r, ok := s.PrefixHitRatio()
	if !ok {
		return "n/a"
	}
	return pct(r)
}

// PromptsText says how the prompts of a sweep's probes were drawn, from
// the Meta of one of them.
func PromptsText(m Meta) string {
	prefix := ""
	if m.SharedPrefix > 0 {
		prefix = fmt.Sprintf(", beyond the %d-token prefix every prompt shares (--random-prefix-len)", m.SharedPrefix)
	}
	if m.DatasetName == "sharegpt" {
		return "**Every probe sent the same ShareGPT texts** (real text has no seed to redraw): probes after the first may hit KV the earlier ones left; the prefix hits show how much."
	}
	if m.SamePrompts {
		return fmt.Sprintf("**Every probe sent the same prompts** (--same-prompts, seed %d): probes after the first may hit KV the earlier ones left%s; the prefix hits show how much.", m.Seed, prefix)
	}
	return fmt.Sprintf("Every probe sent prompts of its own: the lengths and arrivals of seed %d, the content drawn from a seed derived from %d and the probe's index (the first probe: %d itself; content_seed in each probe's JSON), so no probe can hit KV an earlier one left%s.",
		m.Seed, m.Seed, m.Seed, prefix)
}

// UnitName returns unit, or "GPU" when it is empty.
func UnitName(unit string) string {
	if unit == "" {
		return "GPU"
	}
	return unit
}

// Count returns "3 GPUs", "1 core".
func Count(n int, unit string) string {
	u := UnitName(unit)
	if n != 1 {
		u += "s"
	}
	return fmt.Sprintf("%d %s", n, u)
}

// Interval writes [lo, hi] of a sweep's crossing divided by div: "[6.94,
// 7.12]", "[6, ∞)" when nothing failed, "(0, 2]" when nothing passed.
func Interval(res sweep.Result, div float64) string {
	lo, hi := "(0", fmt.Sprintf("%.3g]", res.FailRate/div)
	if res.MaxRate > 0 {
		lo = fmt.Sprintf("[%.3g", res.MaxRate/div)
	}
	if !res.Bracketed() {
		hi = "∞)"
	}
	return lo + ", " + hi
}

func sweepTable(b *strings.Builder, res sweep.Result) {
	if len(res.Points) == 0 {
		b.WriteString("(no probe)\n")
		return
	}
	p := ColumnPercentile(res.Points[0].Summary.Percentiles)
	pn := metrics.PercentileName(p)
	fmt.Fprintf(b, "| rate (req/s) | attainment | goodput (req/s) | throughput (req/s) | %s TTFT (ms) | %s TPOT (ms) | prefix hits | failed | |\n", pn, pn)
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, pt := range res.Points {
		s := pt.Summary
		verdict := "fail"
		if pt.Passed {
			verdict = "pass"
		}
		if pt.Search {
			verdict += " (search)"
		}
		if pt.Outlier {
			verdict += ", against the trend: noise"
		}
		failed := fmt.Sprint(s.Failed)
		if r := s.TopFailure(); r != "" {
			failed += " (" + r + ")"
		}
		fmt.Fprintf(b, "| %.3g | %s | %s | %s | %s | %s | %s | %s | %s |\n", pt.Rate, pct(s.Attainment), f2(s.RequestGoodput),
			f2(s.RequestThroughput), metricAt(s, "ttft", p), metricAt(s, "tpot", p), HitText(s), failed, verdict)
	}
}

// MaxRateSentence states a sweep's answer: the crossing's bracket [last
// rate meeting the target, first rate failing it], per unit too, whether
// it is within the search's tolerance, and the probes taken for noise.
func MaxRateSentence(res sweep.Result, target float64, gpus int, unit string) string {
	u := UnitName(unit)
	div := float64(max(gpus, 1))
	var s string
	switch {
	case res.MaxRate == 0:
		s = fmt.Sprintf("**No probed rate meets %s attainment** (lowest failing: %.3g req/s).", pct(target), res.FailRate)
	case !res.Bracketed():
		s = fmt.Sprintf("**Max rate at %s attainment: at least %.3g req/s (%.3g req/s per %s)**; every probed rate passed, so this is a lower bound.",
			pct(target), res.MaxRate, res.MaxRate/div, u)
	default:
		s = fmt.Sprintf("**Max rate at %s attainment: %.3g req/s (%.3g req/s per %s)**, below a failing %.3g req/s: the crossing lies in %s req/s (%s per %s), %s wide.",
			pct(target), res.MaxRate, res.MaxRate/div, u, res.FailRate, Interval(res, 1), Interval(res, div), u, pct(res.Gap()))
		if !res.Converged() && res.Tolerance > 0 {
			s += fmt.Sprintf(" That is wider than the %s asked for: raise --search-steps.", pct(res.Tolerance))
		}
	}
	if out := res.Outliers(); len(out) > 0 {
		var ps []string
		for _, p := range out {
			ps = append(ps, fmt.Sprintf("%.3g req/s (%s)", p.Rate, pct(p.Summary.Attainment)))
		}
		s += fmt.Sprintf(" Attainment is not monotone in the rate here: %s lie on the wrong side of the crossing and were taken for noise.", strings.Join(ps, ", "))
	}
	return s
}

// SweepResult builds the JSON of a sweep: the answer and every probe's
// vLLM-style result.
func SweepResult(m Meta, res sweep.Result, target float64, gpus int, unit string, probes []Object) Object {
	var o Object
	o.Add("date", m.Date)
	o.Add("label", m.Label)
	o.Add("base_url", m.BaseURL)
	o.Add("endpoint", m.Endpoint)
	o.Add("model_id", m.Model)
	o.Add("workload", m.Workload)
	o.Add("arrival", m.Arrival)
	o.Add("seed", m.Seed)
	o.Add("gpus", gpus)
	o.Add("unit", UnitName(unit))
	o.Add("attainment_target", target)
	addCrossing(&o, res, gpus)
	if a := m.Attribution(); a != "" {
		o.Add("data_attribution", a)
	}
	o.Add("probes", probes)
	return o
}

// addCrossing adds a sweep's answer to o: max_rate (the last rate meeting
// the target), fail_rate (the first failing; null when none), their
// values per unit, the bracket's relative width, whether it is within the
// tolerance, and the rates taken for noise.
func addCrossing(o *Object, res sweep.Result, gpus int) {
	div := float64(max(gpus, 1))
	o.Add("max_rate", res.MaxRate)
	o.Add("max_rate_per_gpu", res.MaxRate/div)
	o.Add("fail_rate", res.FailRate)
	o.Add("fail_rate_per_gpu", res.FailRate/div)
	o.Add("bracketed", res.Bracketed())
	o.Add("crossing_interval", []any{res.MaxRate, finite(res.FailRate)})
	o.Add("crossing_gap", res.Gap())
	o.Add("rate_tolerance", res.Tolerance)
	o.Add("converged", res.Converged())
	out := []float64{}
	for _, p := range res.Outliers() {
		out = append(out, p.Rate)
	}
	o.Add("noise_outliers", out)
}
