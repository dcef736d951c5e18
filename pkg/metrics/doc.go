// Package metrics holds the coordinator's Prometheus collectors: one naming
// scheme (prefix pdserve_, base units seconds and bytes), histograms of the
// latency budget (ttft, tpot, itl, e2e, queue, prefill, kv_transfer),
// counters of KV bytes raw and on the wire, requests by outcome, goodput
// (requests meeting every SLO) and gauges of in-flight requests and
// workers by role.
//
// Collectors register on the Registerer given to New, never on the global
// default, so tests use fresh registries. All methods are safe for
// concurrent use.
package metrics
