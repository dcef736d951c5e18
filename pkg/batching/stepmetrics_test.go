package batching

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStepMetrics: the histograms carry the role's names, the help texts
// and buckets given, and record seconds and sequences; a nil *StepMetrics
// records nothing.
func TestStepMetrics(t *testing.T) {
	m := NewStepMetrics(StepMetricsOpts{
		Role:         "x",
		StepHelp:     "Step time.",
		BatchHelp:    "Batch size.",
		StepBuckets:  []float64{0.01, 0.1},
		BatchBuckets: []float64{1, 4},
	})
	reg := prometheus.NewPedanticRegistry()
	if err := Register(reg, "x", m.Collectors()...); err != nil {
		t.Fatal(err)
	}
	m.Observe(50*time.Millisecond, 3)
	(*StepMetrics)(nil).Observe(time.Second, 1)
	want := `# HELP pdserve_x_step_batch_size Batch size.
# TYPE pdserve_x_step_batch_size histogram
pdserve_x_step_batch_size_bucket{le="1"} 0
pdserve_x_step_batch_size_bucket{le="4"} 1
pdserve_x_step_batch_size_bucket{le="+Inf"} 1
pdserve_x_step_batch_size_sum 3
pdserve_x_step_batch_size_count 1
# HELP pdserve_x_step_seconds Step time.
# TYPE pdserve_x_step_seconds histogram
pdserve_x_step_seconds_bucket{le="0.01"} 0
pdserve_x_step_seconds_bucket{le="0.1"} 1
pdserve_x_step_seconds_bucket{le="+Inf"} 1
pdserve_x_step_seconds_sum 0.05
pdserve_x_step_seconds_count 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestRegisterError: the first collector refused stops Register, with an
// error naming the role that wraps the registry's.
func TestRegisterError(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "pdserve_x_a_total", Help: "A."})
	b := prometheus.NewCounter(prometheus.CounterOpts{Name: "pdserve_x_a_total", Help: "A."})
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "pdserve_x_c_total", Help: "C."})
	err := Register(reg, "x", a, b, c)
	var are prometheus.AlreadyRegisteredError
	if err == nil || !strings.HasPrefix(err.Error(), "x: register metrics: ") || !errors.As(err, &are) {
		t.Fatalf("Register: %v, want an x: register metrics: error wrapping AlreadyRegisteredError", err)
	}
	if reg.Unregister(c) {
		t.Error("the collector after the refused one was registered")
	}
}
