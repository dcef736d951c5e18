package report

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/pdserve/pdserve/loadtest/metrics"
)

// metricTitle is the row title of a client-side metric.
var metricTitle = map[string]string{
	"ttft": "TTFT", "ttfo": "TTFO", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL",
}

// termTitle returns a budget term's row title: "queue_ms" → "queue".
func termTitle(k string) string { return strings.TrimSuffix(k, "_ms") }

// Markdown writes a run's summary as Markdown tables.
func Markdown(w io.Writer, m Meta, s metrics.Summary) error {
	var b strings.Builder
	title := "Benchmark result"
	if m.Label != "" {
		title += ": " + m.Label
	}
	fmt.Fprintf(&b, "## %s\n\n", title)
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	row := func(k string, v any) { fmt.Fprintf(&b, "| %s | %v |\n", k, v) }
	row("Endpoint", fmt.Sprintf("%s%s (model %s)", m.BaseURL, m.Endpoint, m.Model))
	row("Workload", m.Workload)
	row("Arrivals", m.Arrival)
	prompts := fmt.Sprintf("%s, tokenizer %s, ignore_eos %v, seed %d", m.Format, m.Tokenizer, m.IgnoreEOS, m.Seed)
	if m.ContentSeed != m.Seed {
		prompts += fmt.Sprintf(", content seed %d (probe %d)", m.ContentSeed, m.Probe)
	}
	row("Prompts", prompts)
	if m.TimeScale != 1 && m.TimeScale > 0 {
		row("Time scale", fmt.Sprintf("%g (times below are modelled: wall times ÷ %g)", m.TimeScale, m.TimeScale))
	}
	row("Successful requests", s.Completed)
	row("Failed requests", s.Failed)
	for _, f := range s.Failures {
		row("  failed: "+f.Reason, f.Count)
	}
	if len(s.Misses) > 0 {
		row("Completed but missed an SLO", missText(s.Misses))
	}
	row("Benchmark duration (s)", f2(s.Duration.Seconds()))
	row("Total input tokens", s.TotalInput)
	row("Total generated tokens", s.TotalOutput)
	row("Request throughput (req/s)", f2(s.RequestThroughput))
	if s.SLO.Set() {
		row(fmt.Sprintf("Request goodput (req/s), SLOs %s ms", s.SLO), f2(s.RequestGoodput))
		row("SLO attainment", pct(s.Attainment))
	}
	if _, ok := s.PrefixHitRatio(); ok {
		hits := HitText(s) + " of the prompt tokens served from a prefix cache"
		if m.SharedPrefix > 0 {
			hits += fmt.Sprintf(" (every prompt shares a %d-token prefix)", m.SharedPrefix)
		}
		row("Prefix hit ratio", hits)
	}
	row("Output token throughput (tok/s)", f2(s.OutputThroughput))
	row("Total token throughput (tok/s)", f2(s.TotalTokenThroughput))
	row("Peak output tokens/s (1 s buckets)", f2(s.MaxOutputTokensPerS))
	row("Peak concurrent requests", s.MaxConcurrentRequests)
	if m.Interrupted {
		row("Interrupted", "yes: the run was stopped before every request was sent")
	}
	b.WriteString("\n")
	statsTable(&b, "Metric (ms)", s.MetricOrder, func(k string) string { return metricTitle[k] }, s.Metrics, s.Percentiles)
	if s.Budget != nil {
		b.WriteString("\n")
		BudgetMarkdown(&b, s.Budget, s.Percentiles)
	}
	for _, n := range m.Notes {
		fmt.Fprintf(&b, "\nNote: %s\n", n)
	}
	if a := m.Attribution(); a != "" {
		fmt.Fprintf(&b, "\nData: %s.\n", a)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// BudgetMarkdown writes the server-side budget table.
func BudgetMarkdown(b *strings.Builder, bud *metrics.Budget, ps []float64) {
	var facts []string
	for _, k := range []string{"mode", "codec", "first_token_policy"} {
		if v := bud.Label(k); v != "" {
			facts = append(facts, fmt.Sprintf("%s %s", strings.ReplaceAll(k, "_", " "), v))
		}
	}
	fmt.Fprintf(b, "### Server-side budget (pdserve object of %d requests", bud.Requests)
	if len(facts) > 0 {
		fmt.Fprintf(b, "; %s", strings.Join(facts, ", "))
	}
	b.WriteString(")\n\n")
	statsTable(b, "Term (ms)", bud.TermOrder, termTitle, bud.Terms, ps)
	if raw := bud.Sums["kv_bytes_raw"]; raw > 0 {
		fmt.Fprintf(b, "\nKV moved: %s raw, %s on the wire", bytesIEC(raw), bytesIEC(bud.Sums["kv_bytes_wire"]))
		if r := bud.CompressionRatio(); r > 0 {
			fmt.Fprintf(b, " (%.2f×)", r)
		}
		b.WriteString(".\n")
	}
	if per1k, ok := bud.CostPer1kTokens(); ok {
		fmt.Fprintf(b, "\nCost (server pricing): $%.4g over %d requests, $%.4g per 1k tokens.\n", bud.Sums["cost_usd"], bud.Requests, per1k)
	}
	if rate, ok := bud.CacheHitRate(); ok {
		fmt.Fprintf(b, "\nResponse cache: %d hits of %d lookups (%.1f%%)", bud.CacheHits, bud.CacheLookups, 100*rate)
		if h := bud.HitTTFT; h != nil {
			fmt.Fprintf(b, ", TTFT of hits mean %.3g ms, median %.3g ms (server)", h.Mean, h.Median)
		}
		if h, m := bud.ClientHitTTFT, bud.ClientMissTTFT; h != nil && m != nil {
			fmt.Fprintf(b, "; client TTFT median %.3g ms for hits, %.3g ms for misses", h.Median, m.Median)
		}
		b.WriteString(".\n")
	}
	if bud.Warned > 0 {
		fmt.Fprintf(b, "\n**Server warnings on %d of %d requests**, e.g.: %s\n", bud.Warned, bud.Requests, bud.Warning)
	}
}

func statsTable(b *strings.Builder, head string, order []string, title func(string) string, st map[string]metrics.Stats, ps []float64) {
	fmt.Fprintf(b, "| %s | mean | median | std |", head)
	for _, p := range ps {
		fmt.Fprintf(b, " %s |", metrics.PercentileName(p))
	}
	b.WriteString("\n|---|---:|---:|---:|")
	for range ps {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, k := range order {
		s := st[k]
		fmt.Fprintf(b, "| %s | %s | %s | %s |", title(k), f2(s.Mean), f2(s.Median), f2(s.Std))
		for _, p := range ps {
			v, _ := s.Get(p)
			fmt.Fprintf(b, " %s |", f2(v))
		}
		b.WriteString("\n")
	}
}

func f2(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	if math.IsInf(x, 1) {
		return "inf"
	}
	return fmt.Sprintf("%.2f", x)
}

// missText writes SLO misses by name: "TTFT 12, TPOT 3".
func missText(m map[string]int) string {
	var parts []string
	for _, k := range []string{"ttft", "tpot", "e2el"} {
		if n, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %d", metricTitle[k], n))
		}
	}
	return strings.Join(parts, ", ")
}

func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

// bytesIEC prints a byte count with a binary prefix.
func bytesIEC(n float64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%.0f B", n)
	}
	exp := 0
	for v := n / unit; v >= unit && exp < 5; v /= unit {
		exp++
	}
	return fmt.Sprintf("%.2f %ciB", n/math.Pow(unit, float64(exp+1)), "KMGTPE"[exp])
}
