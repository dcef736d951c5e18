package metrics

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/pdserve/pdserve/loadtest/client"
)

// Budget aggregates the server's per-request budget objects ("pdserve") of
// completed requests. Fields are read by their spelling, so new ones are
// picked up without a change here:
//   - numbers named *_ms are budget terms: Stats per term;
//   - numbers whose name contains "bytes", and cost_usd and gpu_seconds,
//     are summed;
//   - other numbers are averaged;
//   - strings and booleans are collected as the set of values seen;
//   - "warnings" (a list of strings) counts the requests that carried
//     any, keeping the first warning seen.
type Budget struct {
	// Requests counts completed requests that carried a budget object.
	Requests int
	// Terms holds the Stats of each *_ms field, TermOrder their names in
	// report order: ttft, queue, prefill, kv_transfer, decode, e2e first.
	Terms     map[string]Stats
	TermOrder []string
	// Sums holds the totals of byte counts, e.g. kv_bytes_raw.
	Sums map[string]float64
	// Means holds the means of other numbers over all Requests (a field a
	// budget omits counts as 0 there), e.g. prompt_tokens.
	Means map[string]float64
	// Labels holds the distinct values of string fields, sorted, e.g.
	// codec → [zstd].
	Labels map[string][]string
	// Warned counts the requests whose budget carried warnings (e.g. a sim
	// engine that fell behind its model); Warning is the first of them.
	Warned  int
	Warning string
	// CacheLookups counts the requests whose budget had "cache" (the
	// server's response cache looked them up), CacheHits those that were
	// "hit"; HitTTFT holds the Stats of ttft_ms of the hits (nil without
	// any). ClientHitTTFT and ClientMissTTFT hold the Stats of the
	// client-measured TTFT (ms) of the hits and of the misses.
	CacheLookups, CacheHits int
	HitTTFT                 *Stats
	ClientHitTTFT           *Stats
	ClientMissTTFT          *Stats
}

// CacheHitRate returns CacheHits / CacheLookups, and false without
// lookups.
func (b *Budget) CacheHitRate() (float64, bool) {
	if b.CacheLookups == 0 {
		return 0, false
	}
	return float64(b.CacheHits) / float64(b.CacheLookups), true
}

// PrefixHitRatio returns the share of the prompt tokens of the requests
// with a budget that the serving workers took from a prefix cache
// (prefix_hit_tokens over prompt_tokens, summed over requests), and false
// when the budgets reported no prompt tokens or no hit count.
func (b *Budget) PrefixHitRatio() (float64, bool) {
	if b == nil {
		return 0, false
	}
	hit, okh := b.Means["prefix_hit_tokens"]
	prompt, okp := b.Means["prompt_tokens"]
	if !okh || !okp || !(prompt > 0) {
		return 0, false
	}
	return hit / prompt, true
}

// PrefixHitRatio is the run's Budget.PrefixHitRatio; false without a
// budget.
func (s Summary) PrefixHitRatio() (float64, bool) { return s.Budget.PrefixHitRatio() }

// summed reports whether a budget number is a total worth summing.
func summed(k string) bool {
	return strings.Contains(k, "bytes") || k == "cost_usd" || k == "gpu_seconds"
}

// termOrder puts the budget's main terms first.
var termOrder = []string{"ttft_ms", "queue_ms", "prefill_ms", "kv_transfer_ms", "kv_stream_ms", "first_token_ms", "decode_ms", "delivery_ms", "e2e_ms", "tpot_ms"}

// CompressionRatio returns kv_bytes_raw / kv_bytes_wire, or 0 when either is
// missing or zero.
func (b *Budget) CompressionRatio() float64 {
	raw, wire := b.Sums["kv_bytes_raw"], b.Sums["kv_bytes_wire"]
	if raw <= 0 || wire <= 0 {
		return 0
	}
	return raw / wire
}

// CostPer1kTokens returns the summed cost_usd per 1000 prompt and output
// tokens of the requests, and false when the server priced none.
func (b *Budget) CostPer1kTokens() (float64, bool) {
	usd, ok := b.Sums["cost_usd"]
	tokens := (b.Means["prompt_tokens"] + b.Means["output_tokens"]) * float64(b.Requests)
	if !ok || tokens <= 0 {
		return 0, false
	}
	return usd / tokens * 1000, true
}

// Label returns the values of a string field joined by "+", or "".
func (b *Budget) Label(name string) string {
	return strings.Join(b.Labels[name], "+")
}

// summarizeAny returns the Stats of xs, or nil when xs is empty.
func summarizeAny(xs []float64, ps []float64) *Stats {
	if len(xs) == 0 {
		return nil
	}
	s := Summarize(xs, ps)
	return &s
}

func aggregateBudget(outs []client.Outcome, ps []float64) *Budget {
	terms := map[string][]float64{}
	sums := map[string]float64{}
	means := map[string][]float64{}
	labels := map[string]map[string]bool{}
	n, warned, warning := 0, 0, ""
	lookups, hits := 0, 0
	var hitTTFT, clientHit, clientMiss []float64
	for i := range outs {
		o := &outs[i]
		if !o.Success || o.Budget == nil {
			continue
		}
		n++
		if c, ok := o.Budget["cache"].(string); ok {
			lookups++
			ttft := float64(o.TTFT) / float64(time.Millisecond)
			if c == "hit" {
				hits++
				if x, ok := o.Budget["ttft_ms"].(float64); ok {
					hitTTFT = append(hitTTFT, x)
				}
				clientHit = append(clientHit, ttft)
			} else {
				clientMiss = append(clientMiss, ttft)
			}
		}
		for k, v := range o.Budget {
			switch x := v.(type) {
			case float64:
				if math.IsNaN(x) || math.IsInf(x, 0) {
					continue
				}
				switch {
				case strings.HasSuffix(k, "_ms"):
					terms[k] = append(terms[k], x)
				case summed(k):
					sums[k] += x
				default:
					means[k] = append(means[k], x)
				}
			case string:
				addLabel(labels, k, x)
			case bool:
				if x {
					addLabel(labels, k, "true")
				} else {
					addLabel(labels, k, "false")
				}
			case []any:
				if k == "warnings" && len(x) > 0 {
					if warned == 0 {
						warning = fmt.Sprint(x[0])
					}
					warned++
				}
			}
		}
	}
	if n == 0 {
		return nil
	}
	b := &Budget{Requests: n, Terms: map[string]Stats{}, Sums: sums, Means: map[string]float64{}, Labels: map[string][]string{}, Warned: warned, Warning: warning,
		CacheLookups: lookups, CacheHits: hits}
	b.HitTTFT, b.ClientHitTTFT, b.ClientMissTTFT = summarizeAny(hitTTFT, ps), summarizeAny(clientHit, ps), summarizeAny(clientMiss, ps)
	var rest []string
	for k := range terms {
		if !slices.Contains(termOrder, k) {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range append(slices.Clone(termOrder), rest...) {
		if xs, ok := terms[k]; ok {
			b.TermOrder = append(b.TermOrder, k)
			b.Terms[k] = Summarize(xs, ps)
		}
	}
	for k, xs := range means {
		var s float64
		for _, x := range xs {
			s += x
		}
		// Over every request with a budget: a count the budget omits
		// when 0 (decode_prefix_hit_tokens) is 0 there, not missing.
		b.Means[k] = s / float64(n)
	}
	for k, set := range labels {
		var vs []string
		for v := range set {
			vs = append(vs, v)
		}
		sort.Strings(vs)
		b.Labels[k] = vs
	}
	return b
}

func addLabel(m map[string]map[string]bool, k, v string) {
	if m[k] == nil {
		m[k] = map[string]bool{}
	}
	m[k][v] = true
}
