// Package metrics holds the coordinator's Prometheus collectors: one naming
// scheme (prefix pdserve_, base units seconds, bytes and US dollars;
// counters end in _total, counters of bytes in _bytes_total), histograms
// of the latency budget (ttft, tpot, itl, e2e, queue, prefill,
// kv_transfer), counters of KV bytes raw and on the wire
// (pdserve_kv_raw_bytes_total, pdserve_kv_wire_bytes_total), requests by
// outcome, tokens, the cost of priced requests (pdserve_cost_usd_total;
// see budget.Trace.Cost) and gauges of in-flight requests and workers by
// role.
//
// With an SLO (a TTFT or TPOT target) it also exports goodput
// (pdserve_goodput_requests_total: requests finished within every target)
// and pdserve_slo_attainment, the share of admitted requests of a sliding
// window (DefaultAttainmentWindow) that met the SLO. Without an SLO
// neither exists: every request would "meet" it. The window reads time
// from a clock given to New (WithClock), so tests do not wait.
//
// Collectors register on the Registerer given to New, never on the global
// default, so tests use fresh registries. All methods are safe for
// concurrent use.
package metrics
