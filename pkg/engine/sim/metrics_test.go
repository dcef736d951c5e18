package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestEngineCollector compares the collector's output with golden text.
func TestEngineCollector(t *testing.T) {
	const help = `# HELP pdserve_engine_modeled_seconds_total Sum of the modeled step times of the performance-model engine, before the time scale, in seconds.
# TYPE pdserve_engine_modeled_seconds_total counter
pdserve_engine_modeled_seconds_total %s
# HELP pdserve_engine_overrun_seconds_total Sum of the time steps took beyond their scaled modeled time (the process falling behind the model), in seconds.
# TYPE pdserve_engine_overrun_seconds_total counter
pdserve_engine_overrun_seconds_total %s
# HELP pdserve_engine_scaled_seconds_total Sum of the modeled step times times the time scale (the time the steps aimed to take), in seconds.
# TYPE pdserve_engine_scaled_seconds_total counter
pdserve_engine_scaled_seconds_total %s
# HELP pdserve_engine_steps_total Steps run by the performance-model engine (failed steps excluded).
# TYPE pdserve_engine_steps_total counter
pdserve_engine_steps_total %s
`
	tests := []struct {
		name                           string
		st                             Stats
		modeled, overrun, scaled, step string
	}{
		{"zero", Stats{}, "0", "0", "0", "0"},
		{"counts", Stats{Steps: 7, Modeled: 3 * time.Second, Scaled: 1500 * time.Millisecond, Overrun: 250 * time.Millisecond}, "3", "0.25", "1.5", "7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.st
			want := fmtGolden(help, tt.modeled, tt.overrun, tt.scaled, tt.step)
			if err := testutil.CollectAndCompare(newEngineCollector(func() Stats { return st }), strings.NewReader(want)); err != nil {
				t.Error(err)
			}
		})
	}
}

// fmtGolden fills the %s slots of tmpl in order.
func fmtGolden(tmpl string, vals ...string) string {
	for _, v := range vals {
		tmpl = strings.Replace(tmpl, "%s", v, 1)
	}
	return tmpl
}
