package workerrun

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/engine"
)

// collectorEngine is an engine that exports metrics of its own (the sim
// engine's modeled step time, llamacpp's KV cells). The collector must be
// safe to scrape while the worker's scheduler runs steps.
type collectorEngine interface {
	Collector() prometheus.Collector
}

// registerEngineMetrics registers e's own collector on reg when e has one;
// otherwise, or with a nil reg, it does nothing. Errors: the registration
// error, wrapped.
func registerEngineMetrics(reg prometheus.Registerer, e engine.Engine) error {
	c, ok := e.(collectorEngine)
	if !ok || reg == nil {
		return nil
	}
	if err := reg.Register(c.Collector()); err != nil {
		return fmt.Errorf("workerrun: register engine metrics: %w", err)
	}
	return nil
}
