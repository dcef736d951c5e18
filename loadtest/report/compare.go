package report

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/sweep"
)

// Side is one deployment of a comparison.
type Side struct {
	Name string // e.g. "disaggregated"
	GPUs int    // ≥ 1
	// Facts say exactly what the side ran, in order: profile, workers,
	// P:D split, codec, link bandwidth, step budget, …
	Facts Object
	// Sweep is the side's rate search.
	Sweep sweep.Result
	// At is the side's run at the comparison's common rate; nil when not
	// run.
	At *metrics.Summary
}

// MaxPerGPU returns the side's max rate per GPU.
func (s Side) MaxPerGPU() float64 { return s.Sweep.MaxRate / float64(max(s.GPUs, 1)) }

// Comparison is a side-by-side benchmark.
type Comparison struct {
	Meta       Meta
	Sides      []Side
	Target     float64 // attainment target in (0, 1]
	SLO        metrics.SLO
	CommonRate float64 // requests per second of the At runs
}

// Markdown writes the comparison.
func (c Comparison) Markdown(w io.Writer) error {
	var b strings.Builder
	m := c.Meta
	b.WriteString("## Disaggregated vs colocated at equal GPUs\n\n")
	fmt.Fprintf(&b, "Same workload and SLOs on both: %s; arrivals %s; seed %d; prompts %s (tokenizer %s), ignore_eos %v. ",
		m.Workload, m.Arrival, m.Seed, m.Format, m.Tokenizer, m.IgnoreEOS)
	fmt.Fprintf(&b, "A request is good when it meets every SLO (%s ms); target: %s of requests good.\n\n", c.SLO, pct(c.Target))

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
	row("GPUs", func(s Side) string { return fmt.Sprint(s.GPUs) })
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
	row("**Max rate per GPU (req/s/GPU)**", func(s Side) string { return fmt.Sprintf("**%.3g**", s.MaxPerGPU()) })
	if len(c.Sides) > 1 {
		base := c.Sides[len(c.Sides)-1].MaxPerGPU()
		row("per GPU vs "+c.Sides[len(c.Sides)-1].Name, func(s Side) string {
			if base == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.2f×", s.MaxPerGPU()/base)
		})
	}
	row("Probes (req/s: attainment)", func(s Side) string {
		var ps []string
		for _, p := range s.Sweep.Points {
			ps = append(ps, fmt.Sprintf("%.3g: %s", p.Rate, pct(p.Summary.Attainment)))
		}
		return strings.Join(ps, ", ")
	})

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
		atSide("Goodput per GPU (req/s/GPU)", func(sd Side, s metrics.Summary) string {
			return f2(s.RequestGoodput / float64(max(sd.GPUs, 1)))
		})
		at("SLO attainment", func(s metrics.Summary) string { return pct(s.Attainment) })
		at("Failed requests", func(s metrics.Summary) string { return fmt.Sprint(s.Failed) })
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
		so.Add("facts", s.Facts)
		so.Add("max_rate", s.Sweep.MaxRate)
		so.Add("max_rate_per_gpu", s.MaxPerGPU())
		so.Add("fail_rate", s.Sweep.FailRate)
		so.Add("bracketed", s.Sweep.Bracketed())
		if i < len(probes) {
			so.Add("probes", probes[i])
		}
		if i < len(at) && at[i] != nil {
			so.Add("at_common_rate", at[i])
		}
		sides = append(sides, so)
	}
	o.Add("sides", sides)
	return o
}
