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
	res  sweep.Result
}

// writeSweepPlots writes BASE-attainment.png (SLO attainment vs rate) and
// BASE-goodput.png (goodput per GPU vs rate) and returns their paths.
func writeSweepPlots(dir, base string, m report.Meta, sweeps []namedSweep, target float64, slo metrics.SLO) ([]string, error) {
	var att, good []plot.Series
	for _, s := range sweeps {
		a := plot.Series{Name: s.name, Markers: true}
		g := plot.Series{Name: s.name, Markers: true}
		for _, p := range s.res.Points {
			a.X, a.Y = append(a.X, p.Rate), append(a.Y, p.Summary.Attainment)
			g.X, g.Y = append(g.X, p.Rate/float64(max(s.gpus, 1))), append(g.Y, p.Summary.RequestGoodput/float64(max(s.gpus, 1)))
		}
		att, good = append(att, a), append(good, g)
	}
	sub := fmt.Sprintf("SLOs %s ms", slo)
	perGPU := ""
	if len(sweeps) > 1 || (len(sweeps) == 1 && sweeps[0].gpus > 1) {
		perGPU = " per GPU"
	}
	charts := []struct {
		file  string
		chart plot.Chart
	}{
		{base + "-attainment.png", plot.Chart{Title: "SLO attainment vs request rate (" + sub + ")", XLabel: "request rate (req/s)",
			YLabel: "SLO attainment", Series: att, YMin: 0, YMax: 1.05, Footer: plotFooter(m),
			Refs: []plot.Ref{{Y: target, Label: fmt.Sprintf("target %.0f%%", 100*target)}}}},
		{base + "-goodput.png", plot.Chart{Title: "Goodput" + perGPU + " vs request rate" + perGPU + " (" + sub + ")", XLabel: "request rate" + perGPU + " (req/s)",
			YLabel: "goodput" + perGPU + " (req/s)", Series: good, Footer: plotFooter(m)}},
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
