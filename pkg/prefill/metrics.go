package prefill

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// metrics are the prefill worker's Prometheus collectors:
//
//	pdserve_prefill_step_seconds            histogram  time of one prefill step
//	pdserve_prefill_step_batch_size         histogram  requests in one step
//	pdserve_prefill_queue_length            gauge      requests queued or prefilling
//	pdserve_prefill_queued_tokens           gauge      prompt tokens not yet prefilled
//	pdserve_prefill_retained_bytes          gauge      KV bytes held (in flight and retained)
//	pdserve_prefill_kv_raw_bytes_total      counter    canonical KV bytes sent, by codec
//	pdserve_prefill_kv_wire_bytes_total     counter    KV bytes on the wire, by codec
//	pdserve_prefill_peers_untrusted         gauge      peers whose pulled KV failed a spot check (no longer pulled from)
//	pdserve_prefill_prefix_cache_*                     the prefix cache's (prefixcache.Collectors)
//
// A nil *metrics records nothing.
type metrics struct {
	steps     *batching.StepMetrics
	bytesRaw  *prometheus.CounterVec
	bytesWire *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, s *Server) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		steps: batching.NewStepMetrics(batching.StepMetricsOpts{
			Role:         "prefill",
			StepHelp:     "Time of one prefill step (one engine batch), in seconds.",
			BatchHelp:    "Requests in one prefill step.",
			StepBuckets:  prometheus.ExponentialBuckets(0.001, 2, 16),
			BatchBuckets: prometheus.ExponentialBuckets(1, 2, 9),
		}),
		bytesRaw: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_prefill_kv_raw_bytes_total",
			Help: "Canonical (uncompressed) KV bytes sent to decode workers.",
		}, []string{"codec"}),
		bytesWire: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_prefill_kv_wire_bytes_total",
			Help: "KV bytes sent to decode workers on the wire (frames after the codec).",
		}, []string{"codec"}),
	}
	cs := append(m.steps.Collectors(),
		m.bytesRaw, m.bytesWire,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pdserve_prefill_queue_length",
			Help: "Requests queued or being prefilled.",
		}, func() float64 { return float64(s.Stats().QueuedRequests) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pdserve_prefill_queued_tokens",
			Help: "Prompt tokens queued and not yet prefilled.",
		}, func() float64 { return float64(s.Stats().QueuedPrefillTokens) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pdserve_prefill_retained_bytes",
			Help: "KV bytes held for requests in flight and retained for Resend.",
		}, func() float64 { return float64(s.Stats().RetainedBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pdserve_prefill_peers_untrusted",
			Help: "Peer workers whose pulled KV failed a spot check; they are no longer pulled from.",
		}, func() float64 { return float64(s.UntrustedPeers()) }),
	)
	cs = append(cs, prefixcache.Collectors("prefill", func() prefixcache.Stats { return s.cache.Stats() }, s.cache.Host() != nil, s.cache.Host().Disk() != nil)...)
	if err := batching.Register(reg, "prefill", cs...); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) observeStep(d time.Duration, batch int) {
	if m == nil {
		return
	}
	m.steps.Observe(d, batch)
}

func (m *metrics) addBytes(codecName string, raw, wire int64) {
	if m == nil || (raw == 0 && wire == 0) {
		return
	}
	m.bytesRaw.WithLabelValues(codecName).Add(float64(raw))
	m.bytesWire.WithLabelValues(codecName).Add(float64(wire))
}
