package sim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// engineSamples gathers g and returns the pdserve_engine_* counters by
// "name{worker}".
func engineSamples(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
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

func TestEngineCollector(t *testing.T) {
	tests := []struct {
		name string
		st   Stats
		want map[string]float64
	}{
		{"zero", Stats{}, map[string]float64{
			"pdserve_engine_steps_total{w}":           0,
			"pdserve_engine_modeled_seconds_total{w}": 0,
			"pdserve_engine_scaled_seconds_total{w}":  0,
			"pdserve_engine_overrun_seconds_total{w}": 0,
		}},
		{"counts", Stats{Steps: 7, Modeled: 3 * time.Second, Scaled: 1500 * time.Millisecond, Overrun: 250 * time.Millisecond}, map[string]float64{
			"pdserve_engine_steps_total{w}":           7,
			"pdserve_engine_modeled_seconds_total{w}": 3,
			"pdserve_engine_scaled_seconds_total{w}":  1.5,
			"pdserve_engine_overrun_seconds_total{w}": 0.25,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.st
			reg := prometheus.NewRegistry()
			wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"worker": "w"}, reg)
			if err := wrapped.Register(newEngineCollector(func() Stats { return st })); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, engineSamples(t, reg)); diff != "" {
				t.Errorf("samples (-want +got):\n%s", diff)
			}
		})
	}
}
