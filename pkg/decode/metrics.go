package decode

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// metrics are the decode worker's Prometheus collectors:
//
//	pdserve_decode_step_seconds      histogram  time of one step (decode tokens and local prefill chunks)
//	pdserve_decode_step_batch_size   histogram  sequences in one step
//	pdserve_decode_running           gauge      sequences in the batch
//	pdserve_decode_queue_length      gauge      sequences ready to join, waiting for a slot
//	pdserve_decode_kv_transfers      gauge      requests whose KV is arriving now
//	pdserve_kv_blocks_free           gauge      free KV blocks of the pool
//	pdserve_kv_blocks_capacity       gauge      KV blocks of the pool (not a counter: no _total)
//	pdserve_decode_kv_bytes_saved_total counter KV bytes (true size) prefill workers did not send: this worker held the prefix
//	pdserve_decode_stream_stalled_cancels_total counter requests cancelled because their caller did not read, by reason: outbox (over --max-outbox-bytes waiting), write_timeout (a send blocked for --stream-write-timeout)
//	pdserve_decode_peers_untrusted              gauge   peers whose pulled KV failed a spot check (no longer pulled from)
//	pdserve_decode_migration_pulls_total        counter migrated sequences continued here, by result: pulled (their KV from the worker they left) or computed (the pull failed or was refused: prompt and output so far prefilled here)
//	pdserve_decode_prefix_cache_*               the prefix cache's (prefixcache.Collectors)
//
// A nil *metrics records nothing.
type metrics struct {
	steps         *batching.StepMetrics
	stalledCancel *prometheus.CounterVec
	migration     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, s *Server) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		steps: batching.NewStepMetrics(batching.StepMetricsOpts{
			Role:         "decode",
			StepHelp:     "Time of one decode step (decode tokens and local prefill chunks), in seconds.",
			BatchHelp:    "Sequences in one decode step.",
			StepBuckets:  prometheus.ExponentialBuckets(0.0005, 2, 16),
			BatchBuckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		stalledCancel: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_decode_stream_stalled_cancels_total",
			Help: "Requests cancelled because their caller did not read their stream, by reason: outbox (too much output waiting) or write_timeout (a send blocked too long).",
		}, []string{"reason"}),
		migration: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_decode_migration_pulls_total",
			Help: "Migrated sequences this worker continued, by result: pulled (their KV from the worker they left) or computed (the pull failed or was refused; the prompt and the output so far were prefilled here).",
		}, []string{"result"}),
	}
	gauge := func(name, help string, f func(Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(f(s.Stats())) })
	}
	cs := append(m.steps.Collectors(),
		m.stalledCancel, m.migration,
		gauge("pdserve_decode_running", "Sequences in the running batch.", func(st Stats) int { return st.Running }),
		gauge("pdserve_decode_queue_length", "Sequences ready to join the batch, waiting for a slot.", func(st Stats) int { return st.Waiting }),
		gauge("pdserve_decode_kv_transfers", "Requests whose KV is arriving now (an open transfer).", func(st Stats) int { return st.KVTransfers }),
		gauge("pdserve_kv_blocks_free", "Free KV blocks of the worker's pool.", func(st Stats) int { return st.KVBlocksFree }),
		gauge("pdserve_kv_blocks_capacity", "KV blocks of the worker's pool.", func(st Stats) int { return st.KVBlocksTotal }),
	)
	cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "pdserve_decode_kv_bytes_saved_total",
		Help: "KV bytes (the model's true size) prefill workers did not send because this worker held the prompt's prefix in its prefix cache.",
	}, func() float64 { return float64(s.kvSaved.Load()) }))
	cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pdserve_decode_peers_untrusted",
		Help: "Peer workers whose pulled KV failed a spot check; they are no longer pulled from.",
	}, func() float64 { return float64(s.UntrustedPeers()) }))
	cs = append(cs, prefixcache.Collectors("decode", func() prefixcache.Stats { return s.cache.Stats() }, s.cache.Host() != nil, s.cache.Host().Disk() != nil)...)
	if err := batching.Register(reg, "decode", cs...); err != nil {
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

func (m *metrics) stalled(reason string) {
	if m == nil {
		return
	}
	m.stalledCancel.WithLabelValues(reason).Inc()
}

// Results of a migration's pull (pdserve_decode_migration_pulls_total).
const (
	migrationPulled   = "pulled"
	migrationComputed = "computed"
)

func (m *metrics) migrationPull(result string) {
	if m == nil {
		return
	}
	m.migration.WithLabelValues(result).Inc()
}
