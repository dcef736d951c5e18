package llamacpp

import "github.com/prometheus/client_golang/prometheus"

// Collector returns a Prometheus collector of the engine's KV cache:
//
//	pdserve_engine_kv_cells_used   gauge  cells llama.cpp holds, over every slot
//	pdserve_engine_kv_cells_total  gauge  cells of the context's KV cache
//	pdserve_engine_sequences       gauge  sequences the engine holds
//
// The values are those after the last step, import or free (the engine
// refreshes them then), so scraping never calls into llama.cpp and is safe
// while steps run.
func (e *Engine) Collector() prometheus.Collector {
	return &collector{
		e:     e,
		used:  prometheus.NewDesc("pdserve_engine_kv_cells_used", "KV cells llama.cpp holds over all sequence slots (a leak shows here).", nil, nil),
		total: prometheus.NewDesc("pdserve_engine_kv_cells_total", "KV cells of the llama.cpp context.", nil, nil),
		seqs:  prometheus.NewDesc("pdserve_engine_sequences", "Sequences the llama.cpp engine holds.", nil, nil),
	}
}

type collector struct {
	e                 *Engine
	used, total, seqs *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.used
	ch <- c.total
	ch <- c.seqs
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(c.e.cellsUsed.Load()))
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(c.e.cellsTotal))
	ch <- prometheus.MustNewConstMetric(c.seqs, prometheus.GaugeValue, float64(c.e.seqsLive.Load()))
}

// refreshGauges records the cells and sequences now held, for Collector.
func (e *Engine) refreshGauges() {
	e.cellsUsed.Store(int64(e.UsedCells()))
	e.seqsLive.Store(int64(len(e.seqs)))
}
