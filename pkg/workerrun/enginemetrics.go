package workerrun

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/sim"
)

// simStatser is an engine that counts its modeled step time (the
// performance-model engine, sim.Engine). Stats must be safe to call
// while the engine's scheduler runs steps.
type simStatser interface {
	Stats() sim.Stats
}

// engineCollector exports the step counters of a performance-model
// engine, read from its Stats at scrape time:
//
//	pdserve_engine_steps_total             counter  engine steps run
//	pdserve_engine_modeled_seconds_total   counter  Σ modeled step time, before the time scale
//	pdserve_engine_scaled_seconds_total    counter  Σ modeled step time × time scale: what the steps aimed to take
//	pdserve_engine_overrun_seconds_total   counter  Σ time steps took beyond their scaled time
//
// overrun / scaled is the fraction by which this process fell behind the
// model (CPU saturation, late timers, slow callbacks); near 0 means the
// modeled step times were met. The worker label comes from the
// registerer (in-process workers); a worker with a registry of its own
// serves them unlabelled, like its other metrics. Safe for concurrent
// use.
type engineCollector struct {
	e                               simStatser
	steps, modeled, scaled, overrun *prometheus.Desc
}

func newEngineCollector(e simStatser) *engineCollector {
	return &engineCollector{
		e:       e,
		steps:   prometheus.NewDesc("pdserve_engine_steps_total", "Steps run by the performance-model engine (failed steps excluded).", nil, nil),
		modeled: prometheus.NewDesc("pdserve_engine_modeled_seconds_total", "Sum of the modeled step times of the performance-model engine, before the time scale, in seconds.", nil, nil),
		scaled:  prometheus.NewDesc("pdserve_engine_scaled_seconds_total", "Sum of the modeled step times times the time scale (the time the steps aimed to take), in seconds.", nil, nil),
		overrun: prometheus.NewDesc("pdserve_engine_overrun_seconds_total", "Sum of the time steps took beyond their scaled modeled time (the process falling behind the model), in seconds.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.steps
	ch <- c.modeled
	ch <- c.scaled
	ch <- c.overrun
}

// Collect implements prometheus.Collector.
func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.Stats()
	ch <- prometheus.MustNewConstMetric(c.steps, prometheus.CounterValue, float64(st.Steps))
	ch <- prometheus.MustNewConstMetric(c.modeled, prometheus.CounterValue, st.Modeled.Seconds())
	ch <- prometheus.MustNewConstMetric(c.scaled, prometheus.CounterValue, st.Scaled.Seconds())
	ch <- prometheus.MustNewConstMetric(c.overrun, prometheus.CounterValue, st.Overrun.Seconds())
}

// registerEngineMetrics registers an engineCollector for e on reg when e
// counts modeled step time (the sim engine); otherwise, or with a nil
// reg, it does nothing. Errors: the registration error, wrapped.
func registerEngineMetrics(reg prometheus.Registerer, e engine.Engine) error {
	s, ok := e.(simStatser)
	if !ok || reg == nil {
		return nil
	}
	if err := reg.Register(newEngineCollector(s)); err != nil {
		return fmt.Errorf("workerrun: register engine metrics: %w", err)
	}
	return nil
}
