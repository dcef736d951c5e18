package report

import (
	"fmt"
	"strings"
	"time"

	"github.com/pdserve/pdserve/loadtest/metrics"
)

// failureEvidence is what one side's probe at its first failing rate
// shows.
type failureEvidence struct {
	side  Side
	rate  float64
	sum   metrics.Summary
	n429  int
	sheds bool // refuses at least 1 % of the requests with 429
	// queue and ttft are the server-side means (ms) over completed
	// requests; ok when both were reported.
	queue, ttft float64
	budgetOK    bool
	// decodeRefusals and prefillRefusals count the 429s whose message
	// names the decode side (its KV cache) or the prefill side.
	decodeRefusals, prefillRefusals int
}

func evidence(s Side) (failureEvidence, bool) {
	p, ok := s.failPoint()
	if !ok {
		return failureEvidence{}, false
	}
	e := failureEvidence{side: s, rate: p.Rate, sum: p.Summary, n429: p.Summary.FailureCount(429)}
	e.sheds = e.n429 > 0 && 100*e.n429 >= e.sum.Total
	if b := p.Summary.Budget; b != nil {
		q, okq := b.Terms["queue_ms"]
		t, okt := b.Terms["ttft_ms"]
		if okq && okt && t.Mean > 0 {
			e.queue, e.ttft, e.budgetOK = q.Mean, t.Mean, true
		}
	}
	for _, f := range p.Summary.Failures {
		if f.Status != 429 {
			continue
		}
		r := strings.ToLower(f.Reason)
		switch {
		case strings.Contains(r, "decode") || strings.Contains(r, "kv cache"):
			e.decodeRefusals += f.Count
		case strings.Contains(r, "prefill"):
			e.prefillRefusals += f.Count
		}
	}
	return e, true
}

// disaggregated reports whether s splits prefill and decode: the mode the
// server reports, else the side's name.
func disaggregated(s Side) bool {
	if s.At != nil && s.At.Budget != nil {
		if m := s.At.Budget.Label("mode"); m != "" {
			return m == "disaggregated"
		}
	}
	return strings.HasPrefix(s.Name, "disagg")
}

// Diagnosis explains, from each side's probe at its first failing rate,
// why it fails there: failures by reason and SLO misses; whether one side
// sheds load (429) while the other queues; and, on a disaggregated side,
// which pool is the bottleneck, from the budget split and the refusals:
// prefill when queueing dominates TTFT or prefill queues refuse, decode
// when decode KV refusals or TPOT misses dominate, with the offline
// planner command that sizes the pools. Empty when no side failed.
func (c Comparison) Diagnosis() []string {
	var out []string
	var evs []failureEvidence
	for _, s := range c.Sides {
		e, ok := evidence(s)
		if !ok {
			continue
		}
		evs = append(evs, e)
		out = append(out, e.describe())
	}
	for _, a := range evs {
		for _, b := range evs {
			if a.sheds && b.n429 == 0 && a.side.Name != b.side.Name {
				// "Queues" only when waiting is a large part of its TTFT.
				how := "admits every request"
				if b.budgetOK && b.queue >= 0.3*b.ttft {
					how = "queues it"
				}
				out = append(out, fmt.Sprintf("The %s side sheds load (%d of %d requests refused with HTTP 429 at %.3g req/s) where the %s side %s: no 429 at %.3g req/s, its requests miss the SLOs instead%s.",
					a.side.Name, a.n429, a.sum.Total, a.rate, b.side.Name, how, b.rate, b.queueText()))
			}
		}
	}
	for _, e := range evs {
		if l := c.bottleneck(e); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func (e failureEvidence) queueText() string {
	if !e.budgetOK {
		return ""
	}
	return fmt.Sprintf(" (server side: mean queue %.0f ms of a %.0f ms mean TTFT)", e.queue, e.ttft)
}

func (e failureEvidence) describe() string {
	s := e.sum
	var b strings.Builder
	fmt.Fprintf(&b, "%s, first failing at %.3g req/s (%s attainment): ", e.side.Name, e.rate, pct(s.Attainment))
	var parts []string
	if s.Failed > 0 {
		var fs []string
		for _, f := range s.Failures {
			fs = append(fs, fmt.Sprintf("%d × %s", f.Count, f.Reason))
		}
		parts = append(parts, fmt.Sprintf("%d of %d requests failed (%s)", s.Failed, s.Total, strings.Join(fs, "; ")))
	} else {
		parts = append(parts, fmt.Sprintf("no request of %d failed", s.Total))
	}
	if len(s.Misses) > 0 {
		parts = append(parts, "completed requests missed "+missText(s.Misses))
	}
	if e.budgetOK {
		parts = append(parts, fmt.Sprintf("server-side mean queue %.0f ms of a %.0f ms mean TTFT", e.queue, e.ttft))
	}
	b.WriteString(strings.Join(parts, "; "))
	b.WriteString(".")
	return b.String()
}

// bottleneck names the pool that limits a disaggregated side, "" when
// the evidence names none.
func (c Comparison) bottleneck(e failureEvidence) string {
	if !disaggregated(e.side) {
		return ""
	}
	ttftMiss, tpotMiss := e.sum.Misses["ttft"], e.sum.Misses["tpot"]
	queueDominates := e.budgetOK && e.queue >= e.ttft/2
	prefill := e.prefillRefusals
	if queueDominates {
		prefill += ttftMiss
	}
	decode := e.decodeRefusals + tpotMiss
	var pool, why string
	switch {
	case decode > prefill:
		pool = "decode"
		var ws []string
		if e.decodeRefusals > 0 {
			ws = append(ws, fmt.Sprintf("%d requests refused with 429 for lack of decode KV cache", e.decodeRefusals))
		}
		if tpotMiss > 0 {
			ws = append(ws, fmt.Sprintf("%d completed requests missed TPOT (decode batches too slow)", tpotMiss))
		}
		why = strings.Join(ws, " and ")
	case prefill > decode:
		pool = "prefill"
		var ws []string
		if e.prefillRefusals > 0 {
			ws = append(ws, fmt.Sprintf("%d requests refused with 429 by full prefill queues", e.prefillRefusals))
		}
		if queueDominates && ttftMiss > 0 {
			ws = append(ws, fmt.Sprintf("%d completed requests missed TTFT while queueing for prefill took %.0f of %.0f ms of the mean TTFT", ttftMiss, e.queue, e.ttft))
		}
		why = strings.Join(ws, " and ")
	default:
		return ""
	}
	return fmt.Sprintf("The %s pool is the %s side's bottleneck at %.3g req/s: %s. Size the pools for this load with `%s`.",
		pool, e.side.Name, e.rate, why, c.planCommand(e))
}

// planCommand returns the offline planner command for e's side, on the
// mean lengths of the requests it completed.
func (c Comparison) planCommand(e failureEvidence) string {
	cmd := "coordinator plan"
	if e.side.Profile != "" {
		cmd += " --profile " + e.side.Profile
	} else {
		cmd += " --profile PROFILE"
	}
	cmd += fmt.Sprintf(" --gpu-budget %d", e.side.GPUs)
	if c.SLO.TTFT > 0 {
		cmd += " --slo-ttft " + durText(c.SLO.TTFT)
	}
	if c.SLO.TPOT > 0 {
		cmd += " --slo-tpot " + durText(c.SLO.TPOT)
	}
	cmd += fmt.Sprintf(" --rate %.3g", e.rate)
	if n := e.sum.Completed; n > 0 {
		// The mean lengths of the requests it completed.
		cmd += fmt.Sprintf(" --workload fixed:%d/%d", (e.sum.TotalInput+n/2)/n, (e.sum.TotalOutput+n/2)/n)
	}
	return cmd
}

func durText(d time.Duration) string {
	return fmt.Sprintf("%gms", float64(d)/float64(time.Millisecond))
}
