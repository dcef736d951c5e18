package metrics

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/respcache"
)

// Bucket bounds in seconds.
var (
	// LatencyBuckets suit whole-request terms (ttft, e2e, queue, prefill,
	// kv_transfer): 1 ms to 60 s.
	LatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	// TokenBuckets suit per-token terms (tpot, itl): 0.5 ms to 2.5 s.
	TokenBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5}
)

// SLO is the pair of targets a request must meet to count as goodput; a
// zero target is always met. With both zero there is no SLO: no goodput
// counter and no attainment gauge.
type SLO struct {
	TTFT, TPOT time.Duration
}

// set reports whether a target is set.
func (s SLO) set() bool { return s.TTFT > 0 || s.TPOT > 0 }

// DefaultAttainmentWindow is how far back the SLO attainment gauge looks
// unless WithAttainmentWindow says otherwise.
const DefaultAttainmentWindow = 5 * time.Minute

// Option configures New.
type Option func(*settings)

type settings struct {
	now    func() time.Time
	window time.Duration
}

// WithClock makes the attainment window read time from now instead of
// time.Now (tests).
func WithClock(now func() time.Time) Option { return func(s *settings) { s.now = now } }

// WithAttainmentWindow sets the span of the SLO attainment gauge (> 0;
// other values keep DefaultAttainmentWindow).
func WithAttainmentWindow(d time.Duration) Option {
	return func(s *settings) {
		if d > 0 {
			s.window = d
		}
	}
}

// Metrics are the coordinator's collectors.
type Metrics struct {
	slo SLO
	now func() time.Time
	reg prometheus.Registerer // for WatchResponseCache

	ttft, tpot, itl, e2e                        prometheus.Histogram
	queue, prefill, kvTransfer                  prometheus.Histogram
	kvRawBytes, kvWireBytes                     *prometheus.CounterVec
	requests                                    *prometheus.CounterVec
	goodput                                     prometheus.Counter // nil without an SLO
	attainment                                  *window            // nil without an SLO
	promptTokens, outputTokens                  prometheus.Counter
	prefixHitTokens, recoveries, prefillRetries prometheus.Counter
	prefixHitPredicted                          prometheus.Counter
	prefixTierHitTokens                         *prometheus.CounterVec // by tier: engine, host
	cost                                        prometheus.Counter
	inFlight                                    prometheus.Gauge
	workers                                     *prometheus.GaugeVec
	cacheRequests                               *prometheus.CounterVec // by result: hit, miss
	streamStalled, authReloadErrors             prometheus.Counter
}

// New creates the collectors and registers them on reg. The goodput
// counter and the attainment gauge exist only when slo sets a target. It
// panics when a collector is already registered there (a programming
// error, as with prometheus.MustRegister).
func New(reg prometheus.Registerer, slo SLO, opts ...Option) *Metrics {
	set := settings{now: time.Now, window: DefaultAttainmentWindow}
	for _, o := range opts {
		o(&set)
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "pdserve", Name: name, Help: help, Buckets: buckets})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "pdserve", Name: name, Help: help})
	}
	m := &Metrics{
		slo:        slo,
		now:        set.now,
		reg:        reg,
		ttft:       hist("ttft_seconds", "Time from request arrival to the first token handed to the client.", LatencyBuckets),
		tpot:       hist("tpot_seconds", "Time per output token after the first: (e2e - ttft) / (output tokens - 1), requests with more than one output token.", TokenBuckets),
		itl:        hist("itl_seconds", "Gap between successive token deliveries to a client.", TokenBuckets),
		e2e:        hist("e2e_seconds", "Time from request arrival to the last token handed to the client (to the end of a reply of no token).", LatencyBuckets),
		queue:      hist("queue_seconds", "Time from request arrival to the start of its prefill (admission, routing, prefill queue).", LatencyBuckets),
		prefill:    hist("prefill_seconds", "Prefill compute time of a request's prompt.", LatencyBuckets),
		kvTransfer: hist("kv_transfer_seconds", "KV transfer time not hidden behind prefill compute (KV done - prefill end), remote prefill only.", LatencyBuckets),
		kvRawBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pdserve", Name: "kv_raw_bytes_total",
			Help: "Canonical (uncompressed) KV bytes moved from prefill to decode workers."}, []string{"codec"}),
		kvWireBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pdserve", Name: "kv_wire_bytes_total",
			Help: "KV bytes on the wire after the codec."}, []string{"codec"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pdserve", Name: "requests_total",
			Help: "Requests by outcome: ok, cancelled, error, invalid, rejected (429), unavailable (503)."}, []string{"status"}),
		promptTokens:       counter("prompt_tokens_total", "Prompt tokens of finished requests."),
		outputTokens:       counter("output_tokens_total", "Output tokens handed to clients."),
		prefixHitTokens:    counter("prefix_hit_tokens_total", "Prompt tokens served from a worker's prefix cache."),
		prefixHitPredicted: counter("prefix_hit_tokens_predicted_total", "Prompt tokens served from a worker's prefix cache that the router predicted when it chose the worker (the lesser of its estimate and the hit); over prefix_hit_tokens_total, the share of hits routing saw."),
		prefixTierHitTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pdserve", Name: "prefix_tier_hit_tokens_total",
			Help: "Prompt tokens served from a worker's prefix cache, by where they came from: engine (the prefilling worker's engine memory), host and disk (loaded from its host tier, or the disk tier behind it), peer (pulled from another worker's cache); they sum to prefix_hit_tokens_total."}, []string{"tier"}),
		recoveries:     counter("decode_recoveries_total", "Requests moved to another decode worker after a failure."),
		prefillRetries: counter("prefill_retries_total", "Prefills tried again on another prefill worker after one failed before the first token."),
		cost:           counter("cost_usd_total", "Cost of the requests in US dollars, by the policy's pricing (no increments without one)."),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "pdserve", Name: "requests_in_flight",
			Help: "Requests admitted and not yet finished."}),
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "pdserve", Name: "workers",
			Help: "Live workers by role (current pool replicas)."}, []string{"role"}),
		cacheRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pdserve", Name: "response_cache_requests_total",
			Help: "Response cache lookups by result: hit (replayed without a worker) or miss, one per prompt; none while the cache is off."}, []string{"result"}),
		streamStalled:    counter("stream_stalled_cancels_total", "Requests cancelled because the client stopped reading their response for longer than the write timeout."),
		authReloadErrors: counter("auth_reload_errors_total", "Failed reloads of the API key or metrics token file (missing, unreadable or invalid); the last good contents stay in use."),
	}
	reg.MustRegister(m.ttft, m.tpot, m.itl, m.e2e, m.queue, m.prefill, m.kvTransfer,
		m.kvRawBytes, m.kvWireBytes, m.requests, m.promptTokens, m.outputTokens,
		m.prefixHitTokens, m.prefixHitPredicted, m.prefixTierHitTokens, m.recoveries, m.prefillRetries, m.cost, m.inFlight, m.workers, m.cacheRequests,
		m.streamStalled, m.authReloadErrors)
	for _, tier := range []string{TierEngine, TierHost, TierDisk, TierPeer} {
		m.prefixTierHitTokens.WithLabelValues(tier) // every series from the start, at 0
	}
	if slo.set() {
		m.goodput = counter("goodput_requests_total", "Requests finished within every SLO target (ttft and tpot).")
		m.attainment = newWindow(set.window)
		reg.MustRegister(m.goodput, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "pdserve", Name: "slo_attainment",
			Help: fmt.Sprintf("Share of the requests admitted in the last %v (ok, error, cancelled) that finished within every SLO target; NaN when there were none.", set.window)},
			func() float64 { return m.attainment.value(m.now()) }))
	}
	return m
}

// The tier label values of pdserve_prefix_tier_hit_tokens_total: where
// the prefilling worker took a prefix hit's tokens from. Engine, host and
// disk are its own tiers (source own); peer is a pull from another
// worker's cache, whichever tier there (source peer).
const (
	TierEngine = "engine"
	TierHost   = "host"
	TierDisk   = "disk"
	TierPeer   = "peer"
)

// ObserveRequest records a request that ended with t.Status. Refused
// requests (invalid, rejected, unavailable) and those another region
// served (forwarded; that region observes them) only count by status; admitted
// ones also feed the histograms of the terms they reached, the cost when
// t is priced, and, with an SLO, goodput and the attainment window (at
// the clock's now). A nil *Metrics records nothing.
func (m *Metrics) ObserveRequest(t *budget.Trace) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(t.Status).Inc()
	if t.Cache != "" {
		m.cacheRequests.WithLabelValues(t.Cache).Inc()
	}
	switch t.Status {
	case budget.StatusInvalid, budget.StatusRejected, budget.StatusUnavailable, budget.StatusForwarded:
		return
	}
	s := t.Terms()
	if !t.FirstToken.IsZero() {
		m.ttft.Observe(s.TTFT.Seconds())
	}
	if !t.FirstToken.IsZero() || !t.Ended.IsZero() {
		m.e2e.Observe(s.E2E.Seconds())
	}
	if t.OutputTokens > 1 {
		m.tpot.Observe(s.TPOT.Seconds())
	}
	for _, d := range t.ITLs {
		m.itl.Observe(d.Seconds())
	}
	if !t.PrefillStart.IsZero() {
		m.queue.Observe(s.Queue.Seconds())
	}
	if !t.PrefillEnd.IsZero() {
		m.prefill.Observe(s.Prefill.Seconds())
	}
	if !t.KVDone.IsZero() && !t.PrefillEnd.IsZero() {
		m.kvTransfer.Observe(s.KVTransfer.Seconds())
	}
	if t.KVBytesRaw > 0 || t.KVBytesWire > 0 {
		m.kvRawBytes.WithLabelValues(t.Codec).Add(float64(t.KVBytesRaw))
		m.kvWireBytes.WithLabelValues(t.Codec).Add(float64(t.KVBytesWire))
	}
	if c, ok := t.Cost(); ok {
		m.cost.Add(c.USD)
	}
	m.promptTokens.Add(float64(t.PromptTokens))
	m.outputTokens.Add(float64(t.OutputTokens))
	m.prefixHitTokens.Add(float64(t.PrefixHitTokens))
	m.prefixHitPredicted.Add(float64(min(t.RoutedPrefixHitTokens, t.PrefixHitTokens)))
	peer := min(max(t.PeerHitTokens, 0), t.PrefixHitTokens)
	host := min(max(t.HostHitTokens, 0), t.PrefixHitTokens-peer)
	disk := min(max(t.DiskHitTokens, 0), host)
	m.prefixTierHitTokens.WithLabelValues(TierEngine).Add(float64(t.PrefixHitTokens - peer - host))
	m.prefixTierHitTokens.WithLabelValues(TierHost).Add(float64(host - disk))
	m.prefixTierHitTokens.WithLabelValues(TierDisk).Add(float64(disk))
	m.prefixTierHitTokens.WithLabelValues(TierPeer).Add(float64(peer))
	m.recoveries.Add(float64(t.Recoveries))
	m.prefillRetries.Add(float64(t.PrefillRetries))
	if m.slo.set() {
		met := t.Status == budget.StatusOK && m.meetsSLO(s, t.OutputTokens)
		if met {
			m.goodput.Inc()
		}
		m.attainment.add(m.now(), met)
	}
}

func (m *Metrics) meetsSLO(s budget.Terms, out int) bool {
	// A reply of no token (its first token was its end) has no TTFT:
	// its end, at e2e, is the first thing the client got.
	first := s.TTFT
	if out == 0 {
		first = s.E2E
	}
	if m.slo.TTFT > 0 && first > m.slo.TTFT {
		return false
	}
	if m.slo.TPOT > 0 && out > 1 && s.TPOT > m.slo.TPOT {
		return false
	}
	return true
}

// AddInFlight moves the in-flight gauge by delta (+1 on admission, -1 at
// the end). A nil *Metrics records nothing.
func (m *Metrics) AddInFlight(delta int) {
	if m != nil {
		m.inFlight.Add(float64(delta))
	}
}

// StreamStalled counts a request cancelled because its client stopped
// reading. A nil *Metrics records nothing.
func (m *Metrics) StreamStalled() {
	if m != nil {
		m.streamStalled.Inc()
	}
}

// AuthReloadError counts a failed reload of an authentication file. A nil
// *Metrics records nothing.
func (m *Metrics) AuthReloadError() {
	if m != nil {
		m.authReloadErrors.Inc()
	}
}

// SetWorkers sets the number of live workers of role. A nil *Metrics
// records nothing.
func (m *Metrics) SetWorkers(role string, n int) {
	if m != nil {
		m.workers.WithLabelValues(role).Set(float64(n))
	}
}

// WatchResponseCache exports the response cache's state, read from stats
// at each scrape: pdserve_response_cache_entries, _bytes, and
// _evictions_total by reason (capacity: to make room; ttl: expired).
// Call it once, when the cache is on; it panics when called twice on one
// registry. A nil *Metrics records nothing.
func (m *Metrics) WatchResponseCache(stats func() respcache.Stats) {
	if m == nil {
		return
	}
	gauge := func(name, help string, f func(respcache.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "pdserve", Name: name, Help: help}, func() float64 { return f(stats()) })
	}
	evictions := func(reason string, f func(respcache.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "pdserve", Name: "response_cache_evictions_total",
			Help:        "Responses removed from the response cache, by reason: capacity (the entries or bytes bound) or ttl (expired).",
			ConstLabels: prometheus.Labels{"reason": reason}}, func() float64 { return float64(f(stats())) })
	}
	m.reg.MustRegister(
		gauge("response_cache_entries", "Responses held by the response cache.", func(s respcache.Stats) float64 { return float64(s.Entries) }),
		gauge("response_cache_bytes", "Estimated bytes held by the response cache's responses.", func(s respcache.Stats) float64 { return float64(s.Bytes) }),
		evictions("capacity", func(s respcache.Stats) uint64 { return s.Evictions }),
		evictions("ttl", func(s respcache.Stats) uint64 { return s.Expirations }),
	)
}
