package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/sweep"
)

// Side is one deployment of a comparison.
type Side struct {
	Name string // e.g. "disaggregated"
	GPUs int    // ≥ 1; units of Unit
	// Unit is what GPUs counts: "GPU" ("" means that) or "core" (a CPU
	// deployment).
	Unit string
	// Profile is the performance profile the side runs ("" when unknown),
	// for the plan command the diagnosis suggests.
	Profile string
	// Facts say exactly what the side ran, in order: profile, workers,
	// P:D split, codec, link bandwidth, step budget, …
	Facts Object
	// Sweep is the side's rate search.
	Sweep sweep.Result
	// At is the side's run at the comparison's common rate; nil when not
	// run.
	At *metrics.Summary
}

// MaxPerGPU returns the side's max rate per GPU (per Unit).
func (s Side) MaxPerGPU() float64 { return s.Sweep.MaxRate / float64(max(s.GPUs, 1)) }

// FailPerGPU returns the side's first failing rate per GPU (per Unit);
// +Inf when none failed.
func (s Side) FailPerGPU() float64 { return s.Sweep.FailRate / float64(max(s.GPUs, 1)) }

// failPoint returns the probe at the side's first failing rate.
func (s Side) failPoint() (sweep.Point, bool) {
	for _, p := range s.Sweep.Points {
		if p.Rate == s.Sweep.FailRate {
			return p, true
		}
	}
	return sweep.Point{}, false
}

// RatioInterval returns the interval of a's per-unit crossing over b's:
// [a's last meeting ÷ b's first failing, a's first failing ÷ b's last
// meeting]; an end is 0 or +Inf where a bracket is open.
func RatioInterval(a, b Side) (lo, hi float64) {
	lo, hi = 0, math.Inf(1)
	if f := b.FailPerGPU(); a.MaxPerGPU() > 0 && !math.IsInf(f, 1) {
		lo = a.MaxPerGPU() / f
	}
	if m := b.MaxPerGPU(); m > 0 && !math.IsInf(a.FailPerGPU(), 1) {
		hi = a.FailPerGPU() / m
	}
	return lo, hi
}

// ratioText writes a ratio interval: "[1.33×, 1.46×]", "≥ 1.2×".
func ratioText(lo, hi float64) string {
	l, h := "[0×", "∞)"
	if lo > 0 {
		l = fmt.Sprintf("[%.2f×", lo)
	}
	if !math.IsInf(hi, 1) {
		h = fmt.Sprintf("%.2f×]", hi)
	}
	return l + ", " + h
}

// Comparison is a side-by-side benchmark.
type Comparison struct {
	Meta       Meta
	Sides      []Side
	Target     float64 // attainment target in (0, 1]
	SLO        metrics.SLO
	CommonRate float64 // requests per second of the At runs
	// Split is how the disaggregated side's P:D split was chosen; nil
	// when no split is known (deployments given by URL).
	Split *SplitChoice
}

// SplitChoice is the disaggregated side's prefill:decode split and what
// the planner says of it.
type SplitChoice struct {
	// Ran is the split that ran, "P:D".
	Ran string
	// Auto: the planner chose Ran (--pd-split auto).
	Auto bool
	// Planner is the split the planner picks for the workload at the
	// same worker count, "" when it was not consulted (Why says why).
	Planner string
	Why     string
	// Predicted holds the planner's predicted max rate (req/s) of every
	// split it weighed, in order of prefill workers.
	Predicted []SplitRate
	// Cached says what prefix caching the planner counted, e.g. "a
	// 512-token prefix shared by every prompt, 42% of the prompt tokens".
	Cached string
}

// SplitRate is one split's predicted max rate.
type SplitRate struct {
	Split   string  // "P:D"
	MaxRate float64 // req/s; 0 when it never meets the SLO
}

// Text states the split: which ran, who chose it, and a label when the
// planner would choose another.
func (c SplitChoice) Text() string {
	var preds []string
	for _, p := range c.Predicted {
		preds = append(preds, fmt.Sprintf("%s %.3g req/s", p.Split, p.MaxRate))
	}
	pred := ""
	if len(preds) > 0 {
		pred = " (the planner's predicted max rates: " + strings.Join(preds, ", ")
		if c.Cached != "" {
			pred += "; prefix caches simulated on " + c.Cached
		}
		pred += ")"
	}
	switch {
	case c.Auto:
		return fmt.Sprintf("P:D split %s, chosen by the planner for this workload (--pd-split auto)%s.", c.Ran, pred)
	case c.Planner == "":
		return fmt.Sprintf("P:D split %s, as given; the planner was not consulted (%s).", c.Ran, c.Why)
	case c.Planner == c.Ran:
		return fmt.Sprintf("P:D split %s, as given; the planner picks the same split for this workload%s.", c.Ran, pred)
	}
	return fmt.Sprintf("**P:D split %s, as given: a split the planner would not choose** (it picks %s for this workload%s); the disaggregated side's figures are those of that split, not of disaggregation at its best.", c.Ran, c.Planner, pred)
}

// unit returns the sides' common unit, "unit" when they differ.
func (c Comparison) unit() string {
	unit := "GPU"
	for i, s := range c.Sides {
		if u := UnitName(s.Unit); i == 0 {
			unit = u
		} else if u != unit {
			return "unit"
		}
	}
	return unit
}

// Markdown writes the comparison.
func (c Comparison) Markdown(w io.Writer) error {
	var b strings.Builder
	m := c.Meta
	unit := c.unit()
	fmt.Fprintf(&b, "## Disaggregated vs colocated at equal %ss\n\n", unit)
	fmt.Fprintf(&b, "Same workload and SLOs on both: %s; arrivals %s; seed %d; prompts %s (tokenizer %s), ignore_eos %v. ",
		m.Workload, m.Arrival, m.Seed, m.Format, m.Tokenizer, m.IgnoreEOS)
	fmt.Fprintf(&b, "A request is good when it meets every SLO (%s ms); target: %s of requests good.\n\n", c.SLO, pct(c.Target))
	fmt.Fprintf(&b, "%s\n\n", PromptsText(m))
	if c.Split != nil {
		fmt.Fprintf(&b, "%s\n\n", c.Split.Text())
	}

	b.WriteString("| |")
	for _, s := range c.Sides {
		fmt.Fprintf(&b, " %s |", s.Name)
	}
	b.WriteString("\n|---|")
	for range c.Sides {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	row := func(k string, f func(Side) string) {
		fmt.Fprintf(&b, "| %s |", k)
		for _, s := range c.Sides {
			fmt.Fprintf(&b, " %s |", f(s))
		}
		b.WriteString("\n")
	}
	row(unit+"s", func(s Side) string { return Count(s.GPUs, s.Unit) })
	var keys []string
	for _, s := range c.Sides {
		for _, f := range s.Facts {
			if !slices.Contains(keys, f.Key) {
				keys = append(keys, f.Key)
			}
		}
	}
	for _, k := range keys {
		row(k, func(s Side) string {
			if v, ok := s.Facts.Get(k); ok {
				return fmt.Sprint(v)
			}
			return "—"
		})
	}
	row(fmt.Sprintf("**Max rate at %s attainment (req/s)**", pct(c.Target)), func(s Side) string {
		r := fmt.Sprintf("%.3g", s.Sweep.MaxRate)
		if !s.Sweep.Bracketed() && s.Sweep.MaxRate > 0 {
			r = "≥ " + r
		}
		return "**" + r + "**"
	})
	row(fmt.Sprintf("**Max rate per %s (req/s/%s)**", unit, unit), func(s Side) string { return fmt.Sprintf("**%.3g**", s.MaxPerGPU()) })
	row(fmt.Sprintf("%s crossing in (req/s): [last meeting, first failing]", pct(c.Target)), func(s Side) string {
		r := Interval(s.Sweep, 1)
		switch {
		case s.Sweep.Converged():
			r += fmt.Sprintf(", %s wide", pct(s.Sweep.Gap()))
		case s.Sweep.Bracketed() && s.Sweep.MaxRate > 0:
			r += fmt.Sprintf(", %s wide (over the %s asked: raise --search-steps)", pct(s.Sweep.Gap()), pct(s.Sweep.Tolerance))
		}
		return r
	})
	row(fmt.Sprintf("%s crossing per %s (req/s/%s)", pct(c.Target), unit, unit), func(s Side) string {
		return Interval(s.Sweep, float64(max(s.GPUs, 1)))
	})
	var base Side
	if len(c.Sides) > 1 {
		base = c.Sides[len(c.Sides)-1]
		row(fmt.Sprintf("per %s vs %s: max rates", unit, base.Name), func(s Side) string {
			if base.MaxPerGPU() == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.2f×", s.MaxPerGPU()/base.MaxPerGPU())
		})
		row(fmt.Sprintf("per %s vs %s: crossings", unit, base.Name), func(s Side) string {
			return ratioText(RatioInterval(s, base))
		})
	}
	row("Probes (req/s: attainment, failed)", func(s Side) string {
		var ps []string
		for _, p := range s.Sweep.Points {
			t := fmt.Sprintf("%.3g: %s", p.Rate, pct(p.Summary.Attainment))
			if p.Summary.Failed > 0 {
				t += fmt.Sprintf(" (%d %s)", p.Summary.Failed, p.Summary.TopFailure())
			}
			if p.Outlier {
				t += " (noise)"
			}
			ps = append(ps, t)
		}
		return strings.Join(ps, ", ")
	})
	row("Prefix hit ratio by probe (req/s: prompt tokens served from a prefix cache)", func(s Side) string {
		var ps []string
		for _, p := range s.Sweep.Points {
			ps = append(ps, fmt.Sprintf("%.3g: %s", p.Rate, HitText(p.Summary)))
		}
		return strings.Join(ps, ", ")
	})
	row("Failures at the first failing rate", func(s Side) string {
		p, ok := s.failPoint()
		if !ok {
			return "—"
		}
		if len(p.Summary.Failures) == 0 {
			return fmt.Sprintf("none of %d at %.3g req/s (SLO misses only)", p.Summary.Total, p.Rate)
		}
		var fs []string
		for _, f := range p.Summary.Failures {
			fs = append(fs, fmt.Sprintf("%d × %s", f.Count, f.Reason))
		}
		return fmt.Sprintf("%d of %d at %.3g req/s: %s", p.Summary.Failed, p.Summary.Total, p.Rate, strings.Join(fs, "; "))
	})
	if len(c.Sides) > 1 {
		s0 := c.Sides[0]
		lo, hi := RatioInterval(s0, base)
		if base.MaxPerGPU() > 0 {
			fmt.Fprintf(&b, "\n**%s vs %s per %s: %.2f× at the max rates; the %s crossings put it in %s.**\n",
				s0.Name, base.Name, unit, s0.MaxPerGPU()/base.MaxPerGPU(), pct(c.Target), ratioText(lo, hi))
		}
	}
	if d := c.Diagnosis(); len(d) > 0 {
		b.WriteString("\n### Why the sides fail where they do\n\n")
		for _, l := range d {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, s := range c.Sides {
		if out := s.Sweep.Outliers(); len(out) > 0 {
			var ps []string
			for _, p := range out {
				ps = append(ps, fmt.Sprintf("%.3g req/s (%s)", p.Rate, pct(p.Summary.Attainment)))
			}
			fmt.Fprintf(&b, "\nThe %s side's attainment is not monotone in the rate: %s lie on the wrong side of its crossing and were taken for noise.\n",
				s.Name, strings.Join(ps, ", "))
		}
	}

	if c.CommonRate > 0 {
		fmt.Fprintf(&b, "\n### Both at %.3g req/s\n\n", c.CommonRate)
		b.WriteString("| |")
		for _, s := range c.Sides {
			fmt.Fprintf(&b, " %s |", s.Name)
		}
		b.WriteString("\n|---|")
		for range c.Sides {
			b.WriteString("---:|")
		}
		b.WriteString("\n")
		atSide := func(k string, f func(Side, metrics.Summary) string) {
			row(k, func(s Side) string {
				if s.At == nil {
					return "n/a"
				}
				return f(s, *s.At)
			})
		}
		at := func(k string, f func(metrics.Summary) string) {
			atSide(k, func(_ Side, s metrics.Summary) string { return f(s) })
		}
		at("Goodput (req/s)", func(s metrics.Summary) string { return f2(s.RequestGoodput) })
		atSide(fmt.Sprintf("Goodput per %s (req/s/%s)", unit, unit), func(sd Side, s metrics.Summary) string {
			return f2(s.RequestGoodput / float64(max(sd.GPUs, 1)))
		})
		at("SLO attainment", func(s metrics.Summary) string { return pct(s.Attainment) })
		at("Prefix hit ratio", HitText)
		at("Failed requests", func(s metrics.Summary) string {
			if s.Failed == 0 {
				return "0"
			}
			var fs []string
			for _, f := range s.Failures {
				fs = append(fs, fmt.Sprintf("%d %s", f.Count, f.Short()))
			}
			return fmt.Sprintf("%d (%s)", s.Failed, strings.Join(fs, ", "))
		})
		at("Completed, missed an SLO", func(s metrics.Summary) string {
			if len(s.Misses) == 0 {
				return "—"
			}
			return missText(s.Misses)
		})
		var ps []float64
		for _, s := range c.Sides {
			if s.At != nil {
				ps = s.At.Percentiles
				break
			}
		}
		for _, name := range []string{"ttft", "tpot", "itl", "e2el"} {
			shown := ps
			if !slices.Contains(ps, 50) {
				shown = append([]float64{50}, ps...)
			}
			for _, p := range shown {
				label := fmt.Sprintf("%s %s (ms)", metricTitle[name], metrics.PercentileName(p))
				at(label, func(s metrics.Summary) string { return metricAt(s, name, p) })
			}
		}
		// Budget: mean of each server-side term; kv_transfer gets its own line.
		var terms []string
		for _, s := range c.Sides {
			if s.At != nil && s.At.Budget != nil {
				for _, t := range s.At.Budget.TermOrder {
					if !slices.Contains(terms, t) {
						terms = append(terms, t)
					}
				}
			}
		}
		if len(terms) > 0 {
			fmt.Fprintf(&b, "| *Server-side budget, mean (ms)* |%s\n", strings.Repeat(" |", len(c.Sides)))
			for _, t := range terms {
				at("  "+termTitle(t), func(s metrics.Summary) string {
					if s.Budget == nil {
						return "n/a"
					}
					st, ok := s.Budget.Terms[t]
					if !ok {
						return "—"
					}
					return f2(st.Mean)
				})
			}
			at("  KV raw / wire", func(s metrics.Summary) string {
				if s.Budget == nil {
					return "—"
				}
				raw, ok := s.Budget.Sums["kv_bytes_raw"]
				if !ok || raw == 0 {
					return "—"
				}
				return fmt.Sprintf("%s / %s", bytesIEC(raw), bytesIEC(s.Budget.Sums["kv_bytes_wire"]))
			})
		}
	}
	if a := m.Attribution(); a != "" {
		fmt.Fprintf(&b, "\nData: %s.\n", a)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Result builds the comparison's JSON: per side its facts, max rate, probes
// (vLLM-style results) and the run at the common rate.
func (c Comparison) Result(probes [][]Object, at []Object) Object {
	var o Object
	m := c.Meta
	o.Add("date", m.Date)
	o.Add("workload", m.Workload)
	o.Add("arrival", m.Arrival)
	o.Add("seed", m.Seed)
	o.Add("prompts", PromptsText(m))
	o.Add("shared_prefix_tokens", m.SharedPrefix)
	if c.Split != nil {
		var sp Object
		sp.Add("ran", c.Split.Ran)
		sp.Add("auto", c.Split.Auto)
		if c.Split.Planner != "" {
			sp.Add("planner", c.Split.Planner)
			sp.Add("planner_agrees", c.Split.Planner == c.Split.Ran)
		} else {
			sp.Add("planner", nil)
			sp.Add("not_consulted", c.Split.Why)
		}
		var preds []Object
		for _, p := range c.Split.Predicted {
			var po Object
			po.Add("split", p.Split)
			po.Add("max_rate", p.MaxRate)
			preds = append(preds, po)
		}
		sp.Add("predicted", preds)
		if c.Split.Cached != "" {
			sp.Add("prefix_cache", c.Split.Cached)
		}
		sp.Add("text", c.Split.Text())
		o.Add("pd_split", sp)
	}
	o.Add("goodput_slos_ms", c.SLO.Map())
	o.Add("attainment_target", c.Target)
	o.Add("common_rate", c.CommonRate)
	if a := m.Attribution(); a != "" {
		o.Add("data_attribution", a)
	}
	var sides []Object
	for i, s := range c.Sides {
		var so Object
		so.Add("name", s.Name)
		so.Add("gpus", s.GPUs)
		so.Add("unit", UnitName(s.Unit))
		so.Add("facts", s.Facts)
		addCrossing(&so, s.Sweep, s.GPUs)
		if p, ok := s.failPoint(); ok {
			so.Add("failures_at_fail_rate", FailuresJSON(p.Summary.Failures))
		}
		var hits []any
		for _, p := range s.Sweep.Points {
			var h Object
			h.Add("rate", p.Rate)
			if r, ok := p.Summary.PrefixHitRatio(); ok {
				h.Add("prefix_hit_ratio", r)
			} else {
				h.Add("prefix_hit_ratio", nil)
			}
			hits = append(hits, h)
		}
		so.Add("prefix_hit_ratio_by_probe", hits)
		if i < len(probes) {
			so.Add("probes", probes[i])
		}
		if i < len(at) && at[i] != nil {
			so.Add("at_common_rate", at[i])
		}
		sides = append(sides, so)
	}
	o.Add("sides", sides)
	if len(c.Sides) > 1 {
		a, b := c.Sides[0], c.Sides[len(c.Sides)-1]
		if b.MaxPerGPU() > 0 {
			o.Add("ratio_per_gpu", a.MaxPerGPU()/b.MaxPerGPU())
		} else {
			o.Add("ratio_per_gpu", nil)
		}
		lo, hi := RatioInterval(a, b)
		o.Add("ratio_per_gpu_interval", []any{lo, finite(hi)})
	}
	o.Add("diagnosis", c.Diagnosis())
	return o
}
