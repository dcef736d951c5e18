package batching

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// StepMetricsOpts describe a batch loop's two step histograms,
// pdserve_<Role>_step_seconds and pdserve_<Role>_step_batch_size.
type StepMetricsOpts struct {
	// Role names the worker in the metric names ("prefill", "decode").
	Role string
	// StepHelp and BatchHelp are the histograms' help texts.
	StepHelp, BatchHelp string
	// StepBuckets are the step time's buckets, in seconds; BatchBuckets
	// the batch size's, in sequences.
	StepBuckets, BatchBuckets []float64
}

// StepMetrics are a batch loop's step time and batch size histograms.
// Observe is safe for concurrent use.
type StepMetrics struct {
	step, batch prometheus.Histogram
}

// NewStepMetrics builds the histograms o describes, unregistered (see
// Collectors and Register).
func NewStepMetrics(o StepMetricsOpts) *StepMetrics {
	return &StepMetrics{
		step: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pdserve_" + o.Role + "_step_seconds",
			Help:    o.StepHelp,
			Buckets: o.StepBuckets,
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pdserve_" + o.Role + "_step_batch_size",
			Help:    o.BatchHelp,
			Buckets: o.BatchBuckets,
		}),
	}
}

// Collectors returns the two histograms, step time first.
func (m *StepMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.step, m.batch}
}

// Observe records one step that took d and ran batch sequences. A nil
// *StepMetrics records nothing.
func (m *StepMetrics) Observe(d time.Duration, batch int) {
	if m == nil {
		return
	}
	m.step.Observe(d.Seconds())
	m.batch.Observe(float64(batch))
}

// Register registers cs on reg in order. The error, from the first
// collector reg refuses, reads "<role>: register metrics: ..." and wraps
// reg's (say, a prometheus.AlreadyRegisteredError).
func Register(reg prometheus.Registerer, role string, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("%s: register metrics: %w", role, err)
		}
	}
	return nil
}
