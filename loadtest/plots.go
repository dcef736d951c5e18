package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/report"
	"github.com/pdserve/pdserve/loadtest/sweep"
	"github.com/pdserve/pdserve/pkg/plot"
)

// plotFooter is the attribution printed under charts built on a dataset
// that asks for one (two ASCII lines for the bitmap font).
func plotFooter(m report.Meta) string {
	if m.Attribution() == "" {
		return ""
	}
	return "Data: Azure LLM inference trace 2023 (CC-BY 4.0)\n" +
		"Patel et al., Splitwise: Efficient generative LLM inference using phase splitting, ISCA 2024"
}

type namedRun struct {
	name string
	out  runOut
}

// writeCDFPlots writes BASE-ttft-cdf.png and BASE-tpot-cdf.png with one
// line per run, the SLO as a vertical line, and returns their paths. The x
// axis stops at 1.25 × the largest p99 (or just past the SLO) so a long
// tail does not squeeze the bulk.
func writeCDFPlots(dir, base string, m report.Meta, slo metrics.SLO, runs []namedRun) ([]string, error) {
	var ttft, tpot []plot.Series
	var ttftCut, tpotCut float64
	for _, r := range runs {
		var a, b []float64
		for i := range r.out.res.Outcomes {
			o := &r.out.res.Outcomes[i]
			if !o.Success {
				continue
			}
			a = append(a, float64(o.TTFT.Microseconds())/1000)
			if d, ok := metrics.TPOT(o); ok {
				b = append(b, float64(d.Microseconds())/1000)
			}
		}
		ttft = append(ttft, plot.CDF(r.name, a, 0))
		tpot = append(tpot, plot.CDF(r.name, b, 0))
		ttftCut = max(ttftCut, p99(a))
		tpotCut = max(tpotCut, p99(b))
	}
	sub := fmt.Sprintf("%s; %s", m.Workload, m.Arrival)
	mk := func(metric, xl string, series []plot.Series, cut float64, sloD time.Duration) plot.Chart {
		c := plot.Chart{Title: metric + " CDF: " + sub, XLabel: xl, YLabel: "fraction of requests",
			Series: series, YMin: 0, YMax: 1, Footer: plotFooter(m), LegendBottom: true, XMax: 1.25 * cut}
		if sloD > 0 {
			s := float64(sloD.Microseconds()) / 1000
			c.VRefs = []plot.VRef{{X: s, Label: fmt.Sprintf("SLO %g ms", s)}}
			c.XMax = max(c.XMax, 1.1*s)
		}
		return c
	}
	charts := []struct {
		file  string
		chart plot.Chart
	}{
		{base + "-ttft-cdf.png", mk("TTFT", "time to first token (ms)", ttft, ttftCut, slo.TTFT)},
		{base + "-tpot-cdf.png", mk("TPOT", "time per output token (ms)", tpot, tpotCut, slo.TPOT)},
	}
	var paths []string
	for _, c := range charts {
		p, err := writePNG(dir, c.file, &c.chart)
		if err != nil {
			return paths, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func p99(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return metrics.Quantile(s, 99)
}

type namedSweep struct {
	name string
	gpus int
	unit string // what gpus counts: "GPU" ("" means that) or "core"
	res  sweep.Result
}

// writeSweepPlots writes BASE-attainment.png (SLO attainment vs rate) and
// BASE-goodput.png (goodput vs rate) and returns their paths. Both share
// one x axis: the rate per GPU (per core on CPU deployments) when sweeps
// are compared or a sweep has more than one, else the rate; each axis
// names its unit.
func writeSweepPlots(dir, base string, m report.Meta, sweeps []namedSweep, target float64, slo metrics.SLO) ([]string, error) {
	var paths []string
	for _, c := range sweepCharts(base, m, sweeps, target, slo) {
		p, err := writePNG(dir, c.file, &c.chart)
		if err != nil {
			return paths, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

type namedChart struct {
	file  string
	chart plot.Chart
}

// sweepCharts builds the charts of writeSweepPlots.
func sweepCharts(base string, m report.Meta, sweeps []namedSweep, target float64, slo metrics.SLO) []namedChart {
	perUnit := len(sweeps) > 1 || (len(sweeps) == 1 && sweeps[0].gpus > 1)
	unit := ""
	for i, s := range sweeps {
		if u := report.UnitName(s.unit); i == 0 {
			unit = u
		} else if u != unit {
			unit = "unit"
		}
	}
	xl, yl, per, perSlash := "request rate (req/s)", "goodput (req/s)", "", ""
	if perUnit {
		per, perSlash = " per "+unit, "/"+unit
		xl = fmt.Sprintf("request rate per %s (req/s%s)", unit, perSlash)
		yl = fmt.Sprintf("goodput per %s (req/s%s)", unit, perSlash)
	}
	var att, good []plot.Series
	for _, s := range sweeps {
		div := 1.0
		if perUnit {
			div = float64(max(s.gpus, 1))
		}
		name := s.name
		if perUnit && len(sweeps) > 1 {
			name = fmt.Sprintf("%s (%s)", s.name, report.Count(s.gpus, s.unit))
		}
		a := plot.Series{Name: name, Markers: true}
		g := plot.Series{Name: name, Markers: true}
		for _, p := range s.res.Points {
			a.X, a.Y = append(a.X, p.Rate/div), append(a.Y, p.Summary.Attainment)
			g.X, g.Y = append(g.X, p.Rate/div), append(g.Y, p.Summary.RequestGoodput/div)
		}
		att, good = append(att, a), append(good, g)
	}
	sub := fmt.Sprintf("SLOs %s ms", slo)
	return []namedChart{
		{base + "-attainment.png", plot.Chart{Title: "SLO attainment vs request rate" + per + " (" + sub + ")", XLabel: xl,
			YLabel: "SLO attainment (share of requests)", Series: att, YMin: 0, YMax: 1.05, Footer: plotFooter(m),
			Refs: []plot.Ref{{Y: target, Label: fmt.Sprintf("target %.0f%%", 100*target)}}}},
		{base + "-goodput.png", plot.Chart{Title: "Goodput" + per + " vs request rate" + per + " (" + sub + ")", XLabel: xl,
			YLabel: yl, Series: good, Footer: plotFooter(m)}},
	}
}

func writePNG(dir, name string, c *plot.Chart) (string, error) {
	p := outPath(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", fmt.Errorf("plot: %w", err)
	}
	f, err := os.Create(p)
	if err != nil {
		return "", fmt.Errorf("plot: %w", err)
	}
	if err := c.WritePNG(f); err != nil {
		f.Close()
		return "", err
	}
	return p, f.Close()
}
