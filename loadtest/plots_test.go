package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/report"
	"github.com/pdserve/pdserve/loadtest/sweep"
)

// TestSweepChartsAxes: both compare charts put the rate per GPU (per core
// on CPU deployments) on x, and say so; a one-GPU sweep keeps req/s.
func TestSweepChartsAxes(t *testing.T) {
	pts := func(rates ...float64) sweep.Result {
		var r sweep.Result
		for _, x := range rates {
			r.Points = append(r.Points, sweep.Point{Rate: x, Summary: metrics.Summary{Attainment: 1, RequestGoodput: x}})
		}
		return r
	}
	for _, tc := range []struct {
		name   string
		sweeps []namedSweep
		xl, yl string
		x      []float64
	}{
		{"compare on GPUs", []namedSweep{{name: "disaggregated", gpus: 3, res: pts(3, 6)}, {name: "colocated", gpus: 3, res: pts(3)}},
			"request rate per GPU (req/s/GPU)", "goodput per GPU (req/s/GPU)", []float64{1, 2}},
		{"compare on cores", []namedSweep{{name: "disaggregated", gpus: 2, unit: "core", res: pts(1, 2)}, {name: "colocated", gpus: 2, unit: "core", res: pts(1)}},
			"request rate per core (req/s/core)", "goodput per core (req/s/core)", []float64{0.5, 1}},
		{"one GPU", []namedSweep{{name: "x", gpus: 1, res: pts(1, 2)}},
			"request rate (req/s)", "goodput (req/s)", []float64{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := sweepCharts("b", report.Meta{}, tc.sweeps, 0.9, metrics.SLO{})
			if len(cs) != 2 {
				t.Fatalf("%d charts", len(cs))
			}
			for _, c := range cs {
				if c.chart.XLabel != tc.xl {
					t.Errorf("%s: x label %q, want %q", c.file, c.chart.XLabel, tc.xl)
				}
				if diff := cmp.Diff(tc.x, c.chart.Series[0].X); diff != "" {
					t.Errorf("%s: x (-want +got):\n%s", c.file, diff)
				}
			}
			if cs[1].chart.YLabel != tc.yl {
				t.Errorf("goodput y label %q, want %q", cs[1].chart.YLabel, tc.yl)
			}
		})
	}
}
