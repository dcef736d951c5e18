package workerrun

import (
	"maps"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/enginecfg"
)

// fakeEngine is an engine.Engine with a collector of one counter; only
// Collector may be called.
type fakeEngine struct {
	engine.Engine
	c prometheus.Counter
}

func (f fakeEngine) Collector() prometheus.Collector { return f.c }

// engineSamples gathers reg and returns the pdserve_engine_* samples by
// "name{worker}" (worker empty when unlabelled).
func engineSamples(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "pdserve_engine_steps_total", "pdserve_engine_modeled_seconds_total",
			"pdserve_engine_scaled_seconds_total", "pdserve_engine_overrun_seconds_total":
		default:
			continue
		}
		if mf.GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s: type %v, want counter", mf.GetName(), mf.GetType())
		}
		for _, m := range mf.GetMetric() {
			worker := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" {
					worker = l.GetValue()
				}
			}
			got[mf.GetName()+"{"+worker+"}"] = m.GetCounter().GetValue()
		}
	}
	return got
}

// TestRegisterEngineMetrics: an engine's own collector is registered
// under the registerer's labels; a nil registerer registers nothing.
func TestRegisterEngineMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"worker": "w"}, reg)
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "pdserve_engine_steps_total", Help: "h"})
	c.Add(3)
	if err := registerEngineMetrics(wrapped, fakeEngine{c: c}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]float64{"pdserve_engine_steps_total{w}": 3}, engineSamples(t, reg)); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	if err := registerEngineMetrics(wrapped, fakeEngine{c: c}); err == nil {
		t.Error("registering the same collector twice succeeded")
	}
	if err := registerEngineMetrics(nil, fakeEngine{c: c}); err != nil {
		t.Errorf("nil registerer: %v", err)
	}
}

// TestEngineMetricsOnlyForSim: a sim-engine worker exports its step
// counters under its worker label, and they move with the steps it runs;
// a ref-engine worker on the same registry exports none.
func TestEngineMetricsOnlyForSim(t *testing.T) {
	reg := prometheus.NewRegistry()
	so := testOptions(control.RoleColocated, "")
	so.MetricsAddr = ""
	so.Registerer = reg
	so.ID = "sim-worker"
	so.Engine = enginecfg.Options{Engine: enginecfg.Sim, Profile: "h100/llama-3-8b/tp1", TimeScale: 0.001, PayloadScale: 0.01, Seed: 3}
	ro := testOptions(control.RoleColocated, "")
	ro.MetricsAddr = ""
	ro.Registerer = reg
	ro.ID = "ref-worker"
	sw := startWorker(t, so)
	startWorker(t, ro)

	dc := pdservev1.NewDecodeServiceClient(dial(t, sw))
	gen, err := dc.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: "s", PromptTokens: prompt(30, 5), MaxTokens: 6, IgnoreEos: true, LocalPrefill: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readGenerate(gen, 0); err != nil {
		t.Fatal(err)
	}

	got := engineSamples(t, reg)
	names := slices.Sorted(maps.Keys(got))
	want := []string{
		"pdserve_engine_modeled_seconds_total{sim-worker}",
		"pdserve_engine_overrun_seconds_total{sim-worker}",
		"pdserve_engine_scaled_seconds_total{sim-worker}",
		"pdserve_engine_steps_total{sim-worker}",
	}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("engine series (-want +got):\n%s", diff)
	}
	// One prefill step and at least five decode steps (a mixed step may
	// carry both), each of a positive modeled time, scaled by 0.001.
	if s := got["pdserve_engine_steps_total{sim-worker}"]; s < 6 {
		t.Errorf("steps_total %v, want ≥ 6", s)
	}
	m, sc := got["pdserve_engine_modeled_seconds_total{sim-worker}"], got["pdserve_engine_scaled_seconds_total{sim-worker}"]
	if !(m > 0) || !(sc > 0) || sc >= m {
		t.Errorf("modeled_seconds_total %v, scaled_seconds_total %v: want both > 0 and scaled < modeled at time scale 0.001", m, sc)
	}
}
