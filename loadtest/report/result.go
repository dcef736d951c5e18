package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/pdserve/pdserve/loadtest/client"
	"github.com/pdserve/pdserve/loadtest/metrics"
)

// AzureAttribution is the citation the Azure trace's licence (CC-BY 4.0)
// asks for wherever results built on it are shown.
const AzureAttribution = "Azure LLM inference trace 2023 (CC-BY 4.0): Patel et al., Splitwise: Efficient generative LLM inference using phase splitting, ISCA 2024"

// Meta says what a run was: where it sent requests and what it sent.
type Meta struct {
	Date        string // "20060102-150405", local time of the run
	Backend     string // "openai" or "openai-chat" (vLLM's backend names)
	Label       string
	BaseURL     string
	Endpoint    string
	Model       string
	Tokenizer   string // "bytes" or "approx"
	Format      string // "text" or "tokens"
	NumPrompts  int
	RequestRate float64 // +Inf for all at once
	Burstiness  float64
	// MaxConcurrency is 0 when unlimited.
	MaxConcurrency int
	// Arrival describes the send schedule, e.g. "poisson 4 req/s" or
	// "azure trace timestamps ×0.5".
	Arrival     string
	DatasetName string
	DatasetPath string
	Workload    string   // the workload's description
	Notes       []string // adjustments the loaders or the run made
	Seed        uint64
	// Probe is the run's index among the runs of one sweep or comparison
	// side (0 for a single run); ContentSeed the seed its prompt content
	// was drawn from (Seed for probe 0, one derived from Seed and Probe
	// after it, Seed on every probe with SamePrompts).
	Probe       int
	ContentSeed uint64
	SamePrompts bool
	// SharedPrefix is the tokens of the prefix every prompt starts with by
	// request (--random-prefix-len), 0 when none.
	SharedPrefix int
	IgnoreEOS    bool
	// TimeScale is the performance-model engine's time scale the times
	// were divided by (1 when none).
	TimeScale float64
	// Interrupted reports a run cut short (Ctrl-C).
	Interrupted bool
	// Metadata holds --metadata KEY=VALUE pairs.
	Metadata map[string]string
}

// Attribution returns the data citation the run's dataset needs, or "".
func (m Meta) Attribution() string {
	if m.DatasetName == "azure" {
		return AzureAttribution
	}
	return ""
}

// rate returns the request rate as vLLM writes it: a number, or "inf".
func rate(r float64) any {
	if math.IsInf(r, 1) {
		return "inf"
	}
	return r
}

// Result builds the result JSON of a run. With detailed, the per-request
// arrays (input_lens, output_lens, ttfts, itls, generated_texts, errors)
// are included, as vLLM's --save-detailed does.
func Result(m Meta, s metrics.Summary, outs []client.Outcome, detailed bool) Object {
	var o Object
	o.Add("date", m.Date)
	o.Add("backend", m.Backend)
	o.Add("label", m.Label)
	o.Add("model_id", m.Model)
	o.Add("tokenizer_id", m.Tokenizer)
	o.Add("num_prompts", m.NumPrompts)
	o.Add("request_rate", rate(m.RequestRate))
	o.Add("burstiness", m.Burstiness)
	if m.MaxConcurrency > 0 {
		o.Add("max_concurrency", m.MaxConcurrency)
	} else {
		o.Add("max_concurrency", nil)
	}
	o.Add("duration", s.Duration.Seconds())
	o.Add("completed", s.Completed)
	o.Add("failed", s.Failed)
	o.Add("total_input_tokens", s.TotalInput)
	o.Add("total_output_tokens", s.TotalOutput)
	o.Add("request_throughput", s.RequestThroughput)
	if s.SLO.Set() {
		o.Add("request_goodput", s.RequestGoodput)
	} else {
		o.Add("request_goodput", nil)
	}
	o.Add("output_throughput", s.OutputThroughput)
	o.Add("total_token_throughput", s.TotalTokenThroughput)
	o.Add("max_output_tokens_per_s", s.MaxOutputTokensPerS)
	o.Add("max_concurrent_requests", s.MaxConcurrentRequests)
	for _, name := range s.MetricOrder {
		addStats(&o, name+"_ms", s.Metrics[name], s.Percentiles)
	}
	if detailed {
		addDetails(&o, outs)
	}
	// pdserve additions.
	if s.SLO.Set() {
		o.Add("goodput_slos_ms", s.SLO.Map())
		o.Add("slo_attainment", s.Attainment)
		o.Add("slo_misses", s.Misses)
	}
	o.Add("failures", FailuresJSON(s.Failures))
	o.Add("endpoint", m.Endpoint)
	o.Add("base_url", m.BaseURL)
	o.Add("prompt_format", m.Format)
	o.Add("ignore_eos", m.IgnoreEOS)
	o.Add("arrival", m.Arrival)
	o.Add("dataset_name", m.DatasetName)
	o.Add("dataset_path", m.DatasetPath)
	o.Add("workload", m.Workload)
	if a := m.Attribution(); a != "" {
		o.Add("data_attribution", a)
	}
	o.Add("seed", m.Seed)
	o.Add("probe", m.Probe)
	o.Add("content_seed", m.ContentSeed)
	if m.SamePrompts {
		o.Add("same_prompts", true)
	}
	o.Add("shared_prefix_tokens", m.SharedPrefix)
	if r, ok := s.PrefixHitRatio(); ok {
		o.Add("prefix_hit_ratio", r)
	} else {
		o.Add("prefix_hit_ratio", nil)
	}
	o.Add("time_scale", m.TimeScale)
	o.Add("percentiles", s.Percentiles)
	o.Add("output_len_mismatches", outputMismatches(outs))
	if len(m.Notes) > 0 {
		o.Add("notes", m.Notes)
	}
	if m.Interrupted {
		o.Add("interrupted", true)
	}
	if len(m.Metadata) > 0 {
		o.Add("metadata", m.Metadata)
	}
	if s.Budget != nil {
		o.Add("pdserve", budgetObject(s.Budget, s.Percentiles))
	}
	return o
}

// statsKey returns vLLM's key: mean_ttft_ms, p99_ttft_ms, …
func statsKey(kind, suffix string) string { return kind + "_" + suffix }

func addStats(o *Object, suffix string, st metrics.Stats, ps []float64) {
	o.Add(statsKey("mean", suffix), st.Mean)
	o.Add(statsKey("median", suffix), st.Median)
	o.Add(statsKey("std", suffix), st.Std)
	for _, p := range ps {
		v, _ := st.Get(p)
		o.Add(statsKey(metrics.PercentileName(p), suffix), v)
	}
}

func addDetails(o *Object, outs []client.Outcome) {
	n := len(outs)
	inputs, outputs := make([]int, n), make([]int, n)
	ttfts, starts := make([]float64, n), make([]float64, n)
	itls := make([][]float64, n)
	texts, errs := make([]string, n), make([]string, n)
	var t0 time.Time
	for _, out := range outs {
		if !out.Start.IsZero() && (t0.IsZero() || out.Start.Before(t0)) {
			t0 = out.Start
		}
	}
	for i, out := range outs {
		inputs[i] = out.PromptLen
		if !out.Start.IsZero() {
			starts[i] = out.Start.Sub(t0).Seconds()
		}
		if out.Success {
			outputs[i] = out.OutputTokens
			ttfts[i] = out.TTFT.Seconds()
		}
		itls[i] = make([]float64, len(out.ITL))
		for k, g := range out.ITL {
			itls[i][k] = g.Seconds()
		}
		texts[i], errs[i] = out.GeneratedText, out.Error
	}
	o.Add("input_lens", inputs)
	o.Add("output_lens", outputs)
	o.Add("ttfts", ttfts)
	// When each request was sent, seconds from the first: the arrivals
	// `coordinator plan --workload RESULT.json` replays.
	o.Add("start_times", starts)
	o.Add("itls", itls)
	o.Add("generated_texts", texts)
	o.Add("errors", errs)
}

// outputMismatches counts completed requests whose output token count (as
// the server reported it) differs from what was asked: a server that
// ignored ignore_eos or capped max_tokens.
func outputMismatches(outs []client.Outcome) int {
	n := 0
	for _, o := range outs {
		if o.Success && o.UsageReported && o.Asked > 0 && o.OutputTokens != o.Asked {
			n++
		}
	}
	return n
}

// budgetObject is the result's "pdserve" section.
func budgetObject(b *metrics.Budget, ps []float64) Object {
	var o Object
	o.Add("requests_with_budget", b.Requests)
	for _, k := range sortedKeys(b.Labels) {
		if strings.HasSuffix(k, "_worker") {
			continue // per-request routing, not a property of the run
		}
		o.Add(k, b.Label(k))
	}
	for _, k := range sortedKeys(b.Sums) {
		o.Add(k, b.Sums[k])
	}
	if r := b.CompressionRatio(); r > 0 {
		o.Add("kv_compression_ratio", r)
	}
	if per1k, ok := b.CostPer1kTokens(); ok {
		o.Add("cost_usd_per_1k_tokens", per1k)
	}
	if rate, ok := b.CacheHitRate(); ok {
		o.Add("response_cache_lookups", b.CacheLookups)
		o.Add("response_cache_hits", b.CacheHits)
		o.Add("response_cache_hit_rate", rate)
		if b.HitTTFT != nil {
			addStats(&o, "response_cache_hit_ttft_ms", *b.HitTTFT, ps)
		}
		if b.ClientHitTTFT != nil {
			addStats(&o, "response_cache_hit_client_ttft_ms", *b.ClientHitTTFT, ps)
		}
		if b.ClientMissTTFT != nil {
			addStats(&o, "response_cache_miss_client_ttft_ms", *b.ClientMissTTFT, ps)
		}
	}
	if b.Warned > 0 {
		o.Add("requests_with_warnings", b.Warned)
		o.Add("warning", b.Warning)
	}
	for _, k := range sortedKeys(b.Means) {
		o.Add("mean_"+k, b.Means[k])
	}
	for _, term := range b.TermOrder {
		addStats(&o, term, b.Terms[term], ps)
	}
	return o
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// FailuresJSON lists failures by reason as JSON objects: reason, kind,
// http_status (null without a response), code and count; [] when none.
func FailuresJSON(fs []metrics.Failure) []Object {
	out := []Object{}
	for _, f := range fs {
		var o Object
		o.Add("reason", f.Reason)
		o.Add("kind", f.Kind)
		if f.Status > 0 {
			o.Add("http_status", f.Status)
		} else {
			o.Add("http_status", nil)
		}
		o.Add("code", f.Code)
		o.Add("count", f.Count)
		out = append(out, o)
	}
	return out
}

// WriteJSON writes v as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("report: write json: %w", err)
	}
	return nil
}

// DefaultFilename returns vLLM's result file name:
// BACKEND-RATEqps[-concurrencyN]-MODEL-DATE.json (MODEL's last path
// element).
func DefaultFilename(m Meta) string {
	r := "inf"
	if !math.IsInf(m.RequestRate, 1) {
		r = fmt.Sprintf("%g", m.RequestRate)
	}
	c := ""
	if m.MaxConcurrency > 0 {
		c = fmt.Sprintf("-concurrency%d", m.MaxConcurrency)
	}
	model := m.Model
	if i := strings.LastIndexByte(model, '/'); i >= 0 {
		model = model[i+1:]
	}
	if model == "" {
		model = "model"
	}
	label := m.Backend
	if m.Label != "" {
		label = m.Label
	}
	return fmt.Sprintf("%s-%sqps%s-%s-%s.json", label, r, c, model, m.Date)
}
