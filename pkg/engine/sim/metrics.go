package sim

import "github.com/prometheus/client_golang/prometheus"

// Collector returns a Prometheus collector of the engine's step counters
// (see engineCollector). Safe to call while steps run.
func (e *Engine) Collector() prometheus.Collector { return newEngineCollector(e.Stats) }

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
	stats                           func() Stats
	steps, modeled, scaled, overrun *prometheus.Desc
}

func newEngineCollector(stats func() Stats) *engineCollector {
	return &engineCollector{
		stats:   stats,
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
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(c.steps, prometheus.CounterValue, float64(st.Steps))
	ch <- prometheus.MustNewConstMetric(c.modeled, prometheus.CounterValue, st.Modeled.Seconds())
	ch <- prometheus.MustNewConstMetric(c.scaled, prometheus.CounterValue, st.Scaled.Seconds())
	ch <- prometheus.MustNewConstMetric(c.overrun, prometheus.CounterValue, st.Overrun.Seconds())
}
