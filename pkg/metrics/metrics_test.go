package metrics

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/respcache"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestObserveRequestGolden(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	now := at(1000)
	m := New(reg, SLO{TTFT: 100 * time.Millisecond, TPOT: 20 * time.Millisecond}, WithClock(func() time.Time { return now }))
	// $3.6 per GPU-hour: $0.001 per GPU-second.
	gpu := &budget.Pricing{GPUHourUSD: 3.6, PrefillGPUs: 1, DecodeGPUs: 1}

	// Meets both SLOs: ttft 30 ms, tpot (70-30)/4 = 10 ms. Priced: prefill
	// 20 ms + decode 40 ms = 0.06 GPU-s = $0.00006.
	m.ObserveRequest(&budget.Trace{
		Pricing: gpu, Mode: "disaggregated",
		Status: budget.StatusOK, Codec: "zstd", PromptTokens: 10, OutputTokens: 5, PrefixHitTokens: 4, RoutedPrefixHitTokens: 3,
		Arrival: at(0), PrefillStart: at(2), PrefillEnd: at(22), KVDone: at(24),
		FirstToken: at(30), LastToken: at(70), ITLs: []time.Duration{10 * time.Millisecond, 30 * time.Millisecond},
		KVBytesRaw: 4096, KVBytesWire: 2048,
	})
	// Misses the ttft SLO (200 ms); one output token, colocated (no KV).
	// Token prices: 3 × $2/1k + 1 × $4/1k = $0.01.
	m.ObserveRequest(&budget.Trace{
		Pricing: &budget.Pricing{PromptUSDPer1k: 2, OutputUSDPer1k: 4},
		Status:  budget.StatusOK, Codec: "none", PromptTokens: 3, OutputTokens: 1, Recoveries: 1, PrefillRetries: 2,
		RoutedPrefixHitTokens: 2, // predicted, not hit: counts nothing
		Arrival:               at(0), FirstToken: at(200), LastToken: at(200),
	})
	// Failed after admission: counts against attainment, not priced.
	m.ObserveRequest(&budget.Trace{Status: budget.StatusError, Arrival: at(0)})
	// Refused requests count only by status.
	m.ObserveRequest(&budget.Trace{Status: budget.StatusRejected, Arrival: at(0), PromptTokens: 99})
	m.ObserveRequest(&budget.Trace{Status: budget.StatusInvalid})
	m.AddInFlight(3)
	m.AddInFlight(-1)
	m.SetWorkers("prefill", 2)
	m.SetWorkers("decode", 1)

	const want = `
# HELP pdserve_decode_recoveries_total Requests moved to another decode worker after a failure.
# TYPE pdserve_decode_recoveries_total counter
pdserve_decode_recoveries_total 1
# HELP pdserve_prefill_retries_total Prefills tried again on another prefill worker after one failed before the first token.
# TYPE pdserve_prefill_retries_total counter
pdserve_prefill_retries_total 2
# HELP pdserve_cost_usd_total Cost of the requests in US dollars, by the policy's pricing (no increments without one).
# TYPE pdserve_cost_usd_total counter
pdserve_cost_usd_total 0.01006
# HELP pdserve_goodput_requests_total Requests finished within every SLO target (ttft and tpot).
# TYPE pdserve_goodput_requests_total counter
pdserve_goodput_requests_total 1
# HELP pdserve_kv_raw_bytes_total Canonical (uncompressed) KV bytes moved from prefill to decode workers.
# TYPE pdserve_kv_raw_bytes_total counter
pdserve_kv_raw_bytes_total{codec="zstd"} 4096
# HELP pdserve_kv_wire_bytes_total KV bytes on the wire after the codec.
# TYPE pdserve_kv_wire_bytes_total counter
pdserve_kv_wire_bytes_total{codec="zstd"} 2048
# HELP pdserve_kv_transfer_seconds KV transfer time not hidden behind prefill compute (KV done - prefill end), remote prefill only.
# TYPE pdserve_kv_transfer_seconds histogram
pdserve_kv_transfer_seconds_bucket{le="0.001"} 0
pdserve_kv_transfer_seconds_bucket{le="0.0025"} 1
pdserve_kv_transfer_seconds_bucket{le="0.005"} 1
pdserve_kv_transfer_seconds_bucket{le="0.01"} 1
pdserve_kv_transfer_seconds_bucket{le="0.025"} 1
pdserve_kv_transfer_seconds_bucket{le="0.05"} 1
pdserve_kv_transfer_seconds_bucket{le="0.1"} 1
pdserve_kv_transfer_seconds_bucket{le="0.25"} 1
pdserve_kv_transfer_seconds_bucket{le="0.5"} 1
pdserve_kv_transfer_seconds_bucket{le="1"} 1
pdserve_kv_transfer_seconds_bucket{le="2.5"} 1
pdserve_kv_transfer_seconds_bucket{le="5"} 1
pdserve_kv_transfer_seconds_bucket{le="10"} 1
pdserve_kv_transfer_seconds_bucket{le="30"} 1
pdserve_kv_transfer_seconds_bucket{le="60"} 1
pdserve_kv_transfer_seconds_bucket{le="+Inf"} 1
pdserve_kv_transfer_seconds_sum 0.002
pdserve_kv_transfer_seconds_count 1
# HELP pdserve_output_tokens_total Output tokens handed to clients.
# TYPE pdserve_output_tokens_total counter
pdserve_output_tokens_total 6
# HELP pdserve_prefix_hit_tokens_predicted_total Prompt tokens served from a worker's prefix cache that the router predicted when it chose the worker (the lesser of its estimate and the hit); over prefix_hit_tokens_total, the share of hits routing saw.
# TYPE pdserve_prefix_hit_tokens_predicted_total counter
pdserve_prefix_hit_tokens_predicted_total 3
# HELP pdserve_prefix_hit_tokens_total Prompt tokens served from a worker's prefix cache.
# TYPE pdserve_prefix_hit_tokens_total counter
pdserve_prefix_hit_tokens_total 4
# HELP pdserve_prompt_tokens_total Prompt tokens of finished requests.
# TYPE pdserve_prompt_tokens_total counter
pdserve_prompt_tokens_total 13
# HELP pdserve_requests_in_flight Requests admitted and not yet finished.
# TYPE pdserve_requests_in_flight gauge
pdserve_requests_in_flight 2
# HELP pdserve_requests_total Requests by outcome: ok, cancelled, error, invalid, rejected (429), unavailable (503).
# TYPE pdserve_requests_total counter
pdserve_requests_total{status="error"} 1
pdserve_requests_total{status="invalid"} 1
pdserve_requests_total{status="ok"} 2
pdserve_requests_total{status="rejected"} 1
# HELP pdserve_slo_attainment Share of the requests admitted in the last 5m0s (ok, error, cancelled) that finished within every SLO target; NaN when there were none.
# TYPE pdserve_slo_attainment gauge
pdserve_slo_attainment 0.3333333333333333
# HELP pdserve_tpot_seconds Time per output token after the first: (e2e - ttft) / (output tokens - 1), requests with more than one output token.
# TYPE pdserve_tpot_seconds histogram
pdserve_tpot_seconds_bucket{le="0.0005"} 0
pdserve_tpot_seconds_bucket{le="0.001"} 0
pdserve_tpot_seconds_bucket{le="0.0025"} 0
pdserve_tpot_seconds_bucket{le="0.005"} 0
pdserve_tpot_seconds_bucket{le="0.01"} 1
pdserve_tpot_seconds_bucket{le="0.02"} 1
pdserve_tpot_seconds_bucket{le="0.04"} 1
pdserve_tpot_seconds_bucket{le="0.06"} 1
pdserve_tpot_seconds_bucket{le="0.08"} 1
pdserve_tpot_seconds_bucket{le="0.1"} 1
pdserve_tpot_seconds_bucket{le="0.15"} 1
pdserve_tpot_seconds_bucket{le="0.2"} 1
pdserve_tpot_seconds_bucket{le="0.3"} 1
pdserve_tpot_seconds_bucket{le="0.5"} 1
pdserve_tpot_seconds_bucket{le="1"} 1
pdserve_tpot_seconds_bucket{le="2.5"} 1
pdserve_tpot_seconds_bucket{le="+Inf"} 1
pdserve_tpot_seconds_sum 0.01
pdserve_tpot_seconds_count 1
# HELP pdserve_ttft_seconds Time from request arrival to the first token handed to the client.
# TYPE pdserve_ttft_seconds histogram
pdserve_ttft_seconds_bucket{le="0.001"} 0
pdserve_ttft_seconds_bucket{le="0.0025"} 0
pdserve_ttft_seconds_bucket{le="0.005"} 0
pdserve_ttft_seconds_bucket{le="0.01"} 0
pdserve_ttft_seconds_bucket{le="0.025"} 0
pdserve_ttft_seconds_bucket{le="0.05"} 1
pdserve_ttft_seconds_bucket{le="0.1"} 1
pdserve_ttft_seconds_bucket{le="0.25"} 2
pdserve_ttft_seconds_bucket{le="0.5"} 2
pdserve_ttft_seconds_bucket{le="1"} 2
pdserve_ttft_seconds_bucket{le="2.5"} 2
pdserve_ttft_seconds_bucket{le="5"} 2
pdserve_ttft_seconds_bucket{le="10"} 2
pdserve_ttft_seconds_bucket{le="30"} 2
pdserve_ttft_seconds_bucket{le="60"} 2
pdserve_ttft_seconds_bucket{le="+Inf"} 2
pdserve_ttft_seconds_sum 0.23
pdserve_ttft_seconds_count 2
# HELP pdserve_workers Live workers by role (current pool replicas).
# TYPE pdserve_workers gauge
pdserve_workers{role="decode"} 1
pdserve_workers{role="prefill"} 2
`
	names := []string{
		"pdserve_cost_usd_total", "pdserve_decode_recoveries_total", "pdserve_prefill_retries_total", "pdserve_goodput_requests_total",
		"pdserve_kv_raw_bytes_total", "pdserve_kv_wire_bytes_total", "pdserve_kv_transfer_seconds",
		"pdserve_output_tokens_total", "pdserve_prefix_hit_tokens_predicted_total", "pdserve_prefix_hit_tokens_total", "pdserve_prompt_tokens_total",
		"pdserve_requests_in_flight", "pdserve_requests_total", "pdserve_slo_attainment",
		"pdserve_tpot_seconds", "pdserve_ttft_seconds", "pdserve_workers",
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// Histograms not in the golden text still got their observations.
	for name, wantCount := range map[string]int{
		"pdserve_itl_seconds": 2, "pdserve_e2e_seconds": 2, "pdserve_queue_seconds": 1, "pdserve_prefill_seconds": 1,
	} {
		if got := histCount(t, reg, name); got != wantCount {
			t.Errorf("%s count = %d, want %d", name, got, wantCount)
		}
	}
}

func histCount(t *testing.T, g prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return int(mf.GetMetric()[0].GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("metric %s not gathered", name)
	return 0
}

func TestNilMetricsIsNoop(t *testing.T) {
	var m *Metrics
	m.ObserveRequest(&budget.Trace{Status: budget.StatusOK})
	m.AddInFlight(1)
	m.SetWorkers("decode", 1)
}

func TestNoSLONoGoodput(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, SLO{})
	m.ObserveRequest(&budget.Trace{Status: budget.StatusOK, Arrival: at(0), FirstToken: at(5), LastToken: at(5), OutputTokens: 1})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "pdserve_goodput_requests_total", "pdserve_slo_attainment":
			t.Errorf("%s exported without an SLO", mf.GetName())
		case "pdserve_cost_usd_total":
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v != 0 {
				t.Errorf("cost of an unpriced request = %v, want 0", v)
			}
		}
	}
}

// TestEmptyReplySLO: a reply whose first token was its end delivers no
// token; its end, at e2e, is what the client waited for, so it meets the
// TTFT target only when that came in time (it used to count as met
// whatever the wait), and its e2e is observed, its TTFT not.
func TestEmptyReplySLO(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, SLO{TTFT: 100 * time.Millisecond, TPOT: 50 * time.Millisecond})
	for _, end := range []int{50, 150} {
		m.ObserveRequest(&budget.Trace{Status: budget.StatusOK, Arrival: at(0), PrefillStart: at(1), PrefillEnd: at(end - 5), Ended: at(end), FinishReason: "stop"})
	}
	if got := testutil.ToFloat64(m.goodput); got != 1 {
		t.Errorf("goodput of replies of no token ended at 50 and 150 ms, TTFT target 100 ms: %v, want 1", got)
	}
	if n := histCount(t, reg, "pdserve_e2e_seconds"); n != 2 {
		t.Errorf("e2e observations: %d, want 2", n)
	}
	if n := histCount(t, reg, "pdserve_ttft_seconds"); n != 0 {
		t.Errorf("ttft observations: %d, want 0 (no token)", n)
	}
}

func TestAttainmentWindow(t *testing.T) {
	now := t0
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, SLO{TTFT: 100 * time.Millisecond}, WithClock(func() time.Time { return now }), WithAttainmentWindow(time.Minute))
	ok := func(ttft int) *budget.Trace {
		return &budget.Trace{Status: budget.StatusOK, Arrival: at(0), FirstToken: at(ttft), LastToken: at(ttft), OutputTokens: 1}
	}
	steps := []struct {
		name    string
		advance time.Duration
		observe []*budget.Trace
		want    string // the gauge's value in the text format
	}{
		{name: "empty window", want: "NaN"},
		{name: "one met", observe: []*budget.Trace{ok(50)}, want: "1"},
		{name: "one missed, one error", advance: 30 * time.Second, observe: []*budget.Trace{ok(150), {Status: budget.StatusError}}, want: "0.3333333333333333"},
		{name: "refused and invalid do not count", observe: []*budget.Trace{{Status: budget.StatusRejected}, {Status: budget.StatusInvalid}}, want: "0.3333333333333333"},
		{name: "cancelled counts as missed", observe: []*budget.Trace{{Status: budget.StatusCancelled}}, want: "0.25"},
		// 31 s after the first: it left the one-minute window.
		{name: "first slides out", advance: 31 * time.Second, want: "0"},
		{name: "new one met", observe: []*budget.Trace{ok(10)}, want: "0.25"},
		{name: "all slide out", advance: 2 * time.Minute, want: "NaN"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			now = now.Add(s.advance)
			for _, tr := range s.observe {
				m.ObserveRequest(tr)
			}
			want := "# HELP pdserve_slo_attainment Share of the requests admitted in the last 1m0s (ok, error, cancelled) that finished within every SLO target; NaN when there were none.\n" +
				"# TYPE pdserve_slo_attainment gauge\npdserve_slo_attainment " + s.want + "\n"
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pdserve_slo_attainment"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestResponseCache: lookups count by result from the trace; the
// cache's occupancy and removals are read at each scrape.
func TestResponseCache(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, SLO{})
	stats := respcache.Stats{Entries: 3, Bytes: 1200, Evictions: 2, Expirations: 5}
	m.WatchResponseCache(func() respcache.Stats { return stats })
	m.ObserveRequest(&budget.Trace{Status: budget.StatusOK, Cache: budget.CacheMiss})
	m.ObserveRequest(&budget.Trace{Status: budget.StatusOK, Cache: budget.CacheHit})
	m.ObserveRequest(&budget.Trace{Status: budget.StatusOK, Cache: budget.CacheHit})
	m.ObserveRequest(&budget.Trace{Status: budget.StatusOK}) // not looked up
	const want = `
# HELP pdserve_response_cache_requests_total Response cache lookups by result: hit (replayed without a worker) or miss, one per prompt; none while the cache is off.
# TYPE pdserve_response_cache_requests_total counter
pdserve_response_cache_requests_total{result="hit"} 2
pdserve_response_cache_requests_total{result="miss"} 1
# HELP pdserve_response_cache_entries Responses held by the response cache.
# TYPE pdserve_response_cache_entries gauge
pdserve_response_cache_entries 3
# HELP pdserve_response_cache_bytes Estimated bytes held by the response cache's responses.
# TYPE pdserve_response_cache_bytes gauge
pdserve_response_cache_bytes 1200
# HELP pdserve_response_cache_evictions_total Responses removed from the response cache, by reason: capacity (the entries or bytes bound) or ttl (expired).
# TYPE pdserve_response_cache_evictions_total counter
pdserve_response_cache_evictions_total{reason="capacity"} 2
pdserve_response_cache_evictions_total{reason="ttl"} 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pdserve_response_cache_requests_total",
		"pdserve_response_cache_entries", "pdserve_response_cache_bytes", "pdserve_response_cache_evictions_total"); err != nil {
		t.Error(err)
	}
}

// TestResponseCacheOff: without lookups and without WatchResponseCache
// no response cache series exists.
func TestResponseCacheOff(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, SLO{})
	m.ObserveRequest(&budget.Trace{Status: budget.StatusOK})
	n, err := testutil.GatherAndCount(reg, "pdserve_response_cache_requests_total", "pdserve_response_cache_entries")
	if err != nil || n != 0 {
		t.Errorf("%d response cache series (err %v), want 0", n, err)
	}
}

// TestPrefixTierHitTokens: the prefix hits split by where they came from,
// the worker's engine, host and disk tiers and a peer's cache (every
// series at 0 before any request), sum to pdserve_prefix_hit_tokens_total;
// a part larger than the hit (a bad report) counts as what is left of it.
func TestPrefixTierHitTokens(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, SLO{})
	names := []string{"pdserve_prefix_hit_tokens_total", "pdserve_prefix_tier_hit_tokens_total"}
	const head = `
# HELP pdserve_prefix_hit_tokens_total Prompt tokens served from a worker's prefix cache.
# TYPE pdserve_prefix_hit_tokens_total counter
pdserve_prefix_hit_tokens_total %d
# HELP pdserve_prefix_tier_hit_tokens_total Prompt tokens served from a worker's prefix cache, by where they came from: engine (the prefilling worker's engine memory), host and disk (loaded from its host tier, or the disk tier behind it), peer (pulled from another worker's cache); they sum to prefix_hit_tokens_total.
# TYPE pdserve_prefix_tier_hit_tokens_total counter
pdserve_prefix_tier_hit_tokens_total{tier="disk"} %d
pdserve_prefix_tier_hit_tokens_total{tier="engine"} %d
pdserve_prefix_tier_hit_tokens_total{tier="host"} %d
pdserve_prefix_tier_hit_tokens_total{tier="peer"} %d
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(head, 0, 0, 0, 0, 0)), names...); err != nil {
		t.Error(err)
	}
	for _, tr := range []budget.Trace{
		{PrefixHitTokens: 512, HostHitTokens: 384, DiskHitTokens: 128}, // 128 from the engine, 256 host, 128 disk
		{PrefixHitTokens: 64},                    // all from the engine
		{PrefixHitTokens: 16, HostHitTokens: 32}, // capped: 16 from host
		{PrefixHitTokens: 96, PeerHitTokens: 80}, // 80 pulled, 16 own
		{PrefixHitTokens: 32, PeerHitTokens: 64}, // capped: 32 pulled
		{},
	} {
		tr.Status, tr.Arrival = budget.StatusOK, at(0)
		m.ObserveRequest(&tr)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(head, 720, 128, 208, 272, 112)), names...); err != nil {
		t.Error(err)
	}
}
