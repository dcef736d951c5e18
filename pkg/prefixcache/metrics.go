package prefixcache

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns a worker's prefix cache collectors, read from stats
// at each scrape, named pdserve_<subsystem>_prefix_cache_*:
//
//	lookups_total     counter  prompts looked up
//	hits_total        counter  lookups that hit at least one block (hit rate: hits / lookups)
//	hit_tokens_total  counter  prompt tokens taken from the cache: prefill tokens saved
//	evictions_total   counter  entries evicted for the bounds
//	reclaims_total    counter  entries evicted to give their KV to requests
//	tokens            gauge    KV tokens held by cached sequences
//	entries           gauge    cached engine sequences
//
// Each worker package registers them from its metrics.go.
func Collectors(subsystem string, stats func() Stats) []prometheus.Collector {
	name := func(s string) string { return "pdserve_" + subsystem + "_prefix_cache_" + s }
	counter := func(n, help string, f func(Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name(n), Help: help}, func() float64 { return float64(f(stats())) })
	}
	gauge := func(n, help string, f func(Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name(n), Help: help}, func() float64 { return float64(f(stats())) })
	}
	return []prometheus.Collector{
		counter("lookups_total", "Prompts looked up in the prefix cache.", func(s Stats) uint64 { return s.Lookups }),
		counter("hits_total", "Prefix cache lookups that hit at least one block.", func(s Stats) uint64 { return s.Hits }),
		counter("hit_tokens_total", "Prompt tokens taken from the prefix cache instead of computed (prefill tokens saved).", func(s Stats) uint64 { return s.HitTokens }),
		counter("evictions_total", "Prefix cache entries evicted for its bounds.", func(s Stats) uint64 { return s.Evictions }),
		counter("reclaims_total", "Prefix cache entries evicted to give their KV blocks to requests.", func(s Stats) uint64 { return s.Reclaims }),
		gauge("tokens", "KV tokens held by the prefix cache's sequences.", func(s Stats) int { return s.Tokens }),
		gauge("entries", "Engine sequences held by the prefix cache.", func(s Stats) int { return s.Entries }),
	}
}
