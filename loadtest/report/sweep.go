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
// the maximum rate into a rate per GPU.
func SweepMarkdown(w io.Writer, m Meta, res sweep.Result, target float64, slo metrics.SLO, gpus int) error {
	var b strings.Builder
	title := "Rate sweep"
	if m.Label != "" {
		title += ": " + m.Label
	}
	fmt.Fprintf(&b, "## %s\n\n", title)
	fmt.Fprintf(&b, "Endpoint %s%s (model %s); workload %s; arrivals %s; seed %d; %d GPUs.\n", m.BaseURL, m.Endpoint, m.Model, m.Workload, m.Arrival, m.Seed, gpus)
	fmt.Fprintf(&b, "A request is good when it meets every SLO (%s ms); target: %s of requests good.\n\n", slo, pct(target))
	sweepTable(&b, res)
	b.WriteString("\n")
	b.WriteString(MaxRateSentence(res, target, gpus))
	b.WriteString("\n")
	if a := m.Attribution(); a != "" {
		fmt.Fprintf(&b, "\nData: %s.\n", a)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func sweepTable(b *strings.Builder, res sweep.Result) {
	if len(res.Points) == 0 {
		b.WriteString("(no probe)\n")
		return
	}
	p := ColumnPercentile(res.Points[0].Summary.Percentiles)
	pn := metrics.PercentileName(p)
	fmt.Fprintf(b, "| rate (req/s) | attainment | goodput (req/s) | throughput (req/s) | %s TTFT (ms) | %s TPOT (ms) | failed | |\n", pn, pn)
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, pt := range res.Points {
		s := pt.Summary
		verdict := "fail"
		if pt.Passed {
			verdict = "pass"
		}
		if pt.Search {
			verdict += " (search)"
		}
		fmt.Fprintf(b, "| %.3g | %s | %s | %s | %s | %s | %d | %s |\n", pt.Rate, pct(s.Attainment), f2(s.RequestGoodput),
			f2(s.RequestThroughput), metricAt(s, "ttft", p), metricAt(s, "tpot", p), s.Failed, verdict)
	}
}

// MaxRateSentence states a sweep's answer.
func MaxRateSentence(res sweep.Result, target float64, gpus int) string {
	switch {
	case res.MaxRate == 0:
		return fmt.Sprintf("**No probed rate meets %s attainment** (lowest failing: %.3g req/s).", pct(target), res.FailRate)
	case !res.Bracketed():
		return fmt.Sprintf("**Max rate at %s attainment: at least %.3g req/s (%.3g req/s per GPU)**; every probed rate passed, so this is a lower bound.",
			pct(target), res.MaxRate, res.MaxRate/float64(gpus))
	default:
		return fmt.Sprintf("**Max rate at %s attainment: %.3g req/s (%.3g req/s per GPU)**, below a failing %.3g req/s.",
			pct(target), res.MaxRate, res.MaxRate/float64(gpus), res.FailRate)
	}
}

// SweepResult builds the JSON of a sweep: the answer and every probe's
// vLLM-style result.
func SweepResult(m Meta, res sweep.Result, target float64, gpus int, probes []Object) Object {
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
	o.Add("attainment_target", target)
	o.Add("max_rate", res.MaxRate)
	o.Add("max_rate_per_gpu", res.MaxRate/float64(max(gpus, 1)))
	o.Add("fail_rate", res.FailRate)
	o.Add("bracketed", res.Bracketed())
	if a := m.Attribution(); a != "" {
		o.Add("data_attribution", a)
	}
	o.Add("probes", probes)
	return o
}
