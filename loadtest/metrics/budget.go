package metrics

import (
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/pdserve/pdserve/loadtest/client"
)

// Budget aggregates the server's per-request budget objects ("pdserve") of
// completed requests. Fields are read by their spelling, so new ones are
// picked up without a change here:
//   - numbers named *_ms are budget terms: Stats per term;
//   - numbers whose name contains "bytes" are summed;
//   - other numbers are averaged;
//   - strings and booleans are collected as the set of values seen.
type Budget struct {
	// Requests counts completed requests that carried a budget object.
	Requests int
	// Terms holds the Stats of each *_ms field, TermOrder their names in
	// report order: ttft, queue, prefill, kv_transfer, decode, e2e first.
	Terms     map[string]Stats
	TermOrder []string
	// Sums holds the totals of byte counts, e.g. kv_bytes_raw.
	Sums map[string]float64
	// Means holds the means of other numbers, e.g. prompt_tokens.
	Means map[string]float64
	// Labels holds the distinct values of string fields, sorted, e.g.
	// codec → [zstd].
	Labels map[string][]string
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

// Label returns the values of a string field joined by "+", or "".
func (b *Budget) Label(name string) string {
	return strings.Join(b.Labels[name], "+")
}

func aggregateBudget(outs []client.Outcome, ps []float64) *Budget {
	terms := map[string][]float64{}
	sums := map[string]float64{}
	means := map[string][]float64{}
	labels := map[string]map[string]bool{}
	n := 0
	for i := range outs {
		o := &outs[i]
		if !o.Success || o.Budget == nil {
			continue
		}
		n++
		for k, v := range o.Budget {
			switch x := v.(type) {
			case float64:
				if math.IsNaN(x) || math.IsInf(x, 0) {
					continue
				}
				switch {
				case strings.HasSuffix(k, "_ms"):
					terms[k] = append(terms[k], x)
				case strings.Contains(k, "bytes"):
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
			}
		}
	}
	if n == 0 {
		return nil
	}
	b := &Budget{Requests: n, Terms: map[string]Stats{}, Sums: sums, Means: map[string]float64{}, Labels: map[string][]string{}}
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
		b.Means[k] = s / float64(len(xs))
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
