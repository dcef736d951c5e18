package planner

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/pdserve/pdserve/pkg/plot"
)

// WriteJSON writes plans as indented JSON: the first plan's fields at the
// top level and, when there are several (a what-if across profiles), a
// "what_if" list with every plan's summary, the first included.
func WriteJSON(w io.Writer, plans ...*Plan) error {
	if len(plans) == 0 {
		return fmt.Errorf("planner: no plan to write")
	}
	type out struct {
		*Plan
		WhatIf []WhatIf `json:"what_if,omitempty"`
	}
	o := out{Plan: plans[0]}
	if len(plans) > 1 {
		for _, p := range plans {
			o.WhatIf = append(o.WhatIf, p.WhatIf())
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(o); err != nil {
		return fmt.Errorf("planner: write json: %w", err)
	}
	return nil
}

// WhatIf is one plan's summary for a side-by-side comparison.
type WhatIf struct {
	Profile         string    `json:"profile"`
	DecodeProfile   string    `json:"decode_profile"`
	Feasible        bool      `json:"feasible"`
	Recommended     string    `json:"recommended"`
	PrefillReplicas int       `json:"prefill_replicas"`
	DecodeReplicas  int       `json:"decode_replicas"`
	Colocated       int       `json:"colocated_replicas"`
	GPUs            PerDesign `json:"gpus"`
	GoodputPerGPU   PerDesign `json:"goodput_per_gpu"`
	CostPer1kTokens PerDesign `json:"cost_per_1k_tokens"`
	KVTransferMs    float64   `json:"kv_transfer_ms"`
}

// WhatIf returns the plan's summary.
func (p *Plan) WhatIf() WhatIf {
	return WhatIf{
		Profile: p.Profile, DecodeProfile: p.DecodeProfile, Feasible: p.Feasible, Recommended: p.Recommended,
		PrefillReplicas: p.PrefillReplicas, DecodeReplicas: p.DecodeReplicas, Colocated: p.ColocatedReplicas,
		GPUs: p.GPUs, GoodputPerGPU: p.GoodputPerGPU, CostPer1kTokens: p.CostPer1kTokens, KVTransferMs: p.KVTransferMs,
	}
}

// WriteTable writes plans as text tables: each plan in full, then, for
// several, the what-if comparison.
func WriteTable(w io.Writer, plans ...*Plan) error {
	ew := &errWriter{w: w}
	for i, p := range plans {
		if i > 0 {
			ew.printf("\n")
		}
		p.writeTable(ew)
	}
	if len(plans) > 1 {
		ew.printf("\nWhat-if, side by side\n")
		tw := tabwriter.NewWriter(ew, 2, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "PROFILE\tDISAGGREGATED\tGOODPUT/GPU\t$/1K TOK\tCOLOCATED\tGOODPUT/GPU\t$/1K TOK\tKV TRANSFER\tRECOMMENDED\n")
		for _, p := range plans {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s ms\t%s\n", p.profiles(),
				p.disaggReplicas(), num(p.GoodputPerGPU.Disaggregated), money(p.CostPer1kTokens.Disaggregated),
				p.colocReplicas(), num(p.GoodputPerGPU.Colocated), money(p.CostPer1kTokens.Colocated),
				num(p.KVTransferMs), or(p.Recommended, "none"))
		}
		if err := tw.Flush(); err != nil {
			ew.err = err
		}
	}
	return ew.err
}

func (p *Plan) profiles() string {
	if p.DecodeProfile == p.Profile {
		return p.Profile
	}
	return p.Profile + " + " + p.DecodeProfile
}

func (p *Plan) disaggReplicas() string {
	if p.Disaggregated == nil {
		return "none"
	}
	return fmt.Sprintf("%dP+%dD", p.PrefillReplicas, p.DecodeReplicas)
}

func (p *Plan) colocReplicas() string {
	if p.Colocated == nil {
		return "none"
	}
	return fmt.Sprintf("%dC", p.ColocatedReplicas)
}

// unit is what the plan's budget counts, singular: "GPU" or "core".
func (p *Plan) unit() string {
	if p.Unit == UnitCore {
		return "core"
	}
	return "GPU"
}

func (p *Plan) writeTable(ew *errWriter) {
	st := p.Workload.Lengths
	ew.printf("pdserve plan: %s", p.Profile)
	if p.DecodeProfile != p.Profile {
		ew.printf(" (prefill), %s (decode)", p.DecodeProfile)
	}
	if p.ColocatedProfile != p.Profile {
		ew.printf(", %s (colocated)", p.ColocatedProfile)
	}
	ew.printf("\n")
	ew.printf("  workload   %s\n", p.Workload.Description)
	ew.printf("             prompt mean %.0f p50 %d p99 %d, output mean %.0f p50 %d p99 %d tokens; %s arrivals\n",
		st.MeanIn, st.P50In, st.P99In, st.MeanOut, st.P50Out, st.P99Out, p.Workload.Arrivals)
	ew.printf("  SLO        TTFT %s ms, TPOT %s ms, %.4g%% of requests meeting both\n", num(p.SLOTTFTMs), num(p.SLOTPOTMs), p.Attainment*100)
	ew.printf("  KV link    %s Gb/s per worker, codec %s (%.2fx, %s, %d cores): %s GB/s of raw KV per transfer, %s MB per token\n",
		num(p.LinkGbps), p.Codec.Name, p.Codec.Ratio, lossy(p.Codec.Lossless), p.CodecCores, num(p.KVTransferGBps), num(float64(p.KVBytesPerToken)/1e6))
	ew.printf("  codec      %s\n", codecSpeeds(p.Codec))
	if c := p.PrefixCache; c != nil {
		ew.printf("  caches     %s\n", c.text())
	}
	if p.Policy == PolicyDecode {
		ew.printf("  policy     first token from the decode worker: kv_transfer is part of TTFT\n")
	} else {
		ew.printf("  policy     first token from the prefill worker: kv_transfer is in the first inter-token gap\n")
	}
	u := p.unit()
	ew.printf("  budget     %d %ss", p.GPUBudget, u)
	if p.Unit == UnitCore {
		ew.printf(" (a worker takes its profile's threads: prefill %d, decode %d, colocated %d)",
			p.UnitsPerWorker.Prefill, p.UnitsPerWorker.Decode, p.UnitsPerWorker.Colocated)
	}
	if p.RequestedRate > 0 {
		ew.printf(", planned for %s req/s", num(p.RequestedRate))
	} else {
		ew.printf(", searching for the highest goodput per %s", u)
	}
	ew.printf("\n\n")

	tw := tabwriter.NewWriter(ew, 2, 4, 2, ' ', 0)
	U := strings.ToUpper(u)
	fmt.Fprintf(tw, "DESIGN\tREPLICAS\t%sS\tMAX RATE\tGOODPUT/%s\t$/1K TOK\tAT RATE\tATTAIN\tTTFT p50/p90/p99 ms\tTPOT p50/p90/p99 ms\n", U, U)
	row := func(name, reps string, pr *Prediction, maxRate, perGPU, cost float64) {
		if pr == nil {
			fmt.Fprintf(tw, "%s\tnone meets the SLO\t\t\t\t\t\t\t\t\n", name)
			return
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%.1f%%\t%s / %s / %s\t%s / %s / %s\n", name, reps, pr.GPUs,
			num(maxRate), num(perGPU), money(cost), num(pr.Rate), pr.Attainment*100,
			num(pr.TTFTMs.P50), num(pr.TTFTMs.P90), num(pr.TTFTMs.P99), num(pr.TPOTMs.P50), num(pr.TPOTMs.P90), num(pr.TPOTMs.P99))
	}
	row("disaggregated", p.disaggReplicas(), p.Disaggregated, p.MaxRate.Disaggregated, p.GoodputPerGPU.Disaggregated, p.CostPer1kTokens.Disaggregated)
	chunk := ""
	if p.Colocated != nil {
		chunk = p.colocReplicas()
	}
	row("colocated", chunk, p.Colocated, p.MaxRate.Colocated, p.GoodputPerGPU.Colocated, p.CostPer1kTokens.Colocated)
	if err := tw.Flush(); err != nil {
		ew.err = err
	}
	if d, c := p.GoodputPerGPU.Disaggregated, p.GoodputPerGPU.Colocated; d > 0 && c > 0 && max(d, c)/min(d, c) < 1.05 {
		ew.printf("\nThe two designs are within 5%% of each other: that is within the simulation's noise; weigh both.")
	}
	ew.printf("\n%s\n", p.recommendation())
	l := p.Limits
	ew.printf("Batching limits: decode batch ≤ %d sequences, prefill ≤ %d tokens per step, colocated %s.\n",
		l.MaxDecodeBatch, l.MaxPrefillTokens, chunkText(l.ChunkTokens))
	ew.printf("GOODPUT/%s is MAX RATE per %s; cost, attainment and latencies are at AT RATE (the asked rate, else MAX RATE).\n", U, u)
	if c := p.PrefixCache; c != nil {
		for _, d := range []struct {
			name string
			pr   *Prediction
		}{{"disaggregated", p.Disaggregated}, {"colocated", p.Colocated}} {
			if d.pr != nil && d.pr.PrefixCache != nil {
				ew.printf("Prefix-cache hit ratio, %s at AT RATE: %.3f (%.2f of the ceiling, %s of the hit tokens from the host tier).\n",
					d.name, d.pr.PrefixCache.HitRatio, ratioOf(d.pr.PrefixCache.HitRatio, c.Ceiling), pct(d.pr.PrefixCache.HostHitTokens, d.pr.PrefixCache.HitTokens))
			}
		}
	}

	for _, d := range []struct {
		name string
		pr   *Prediction
	}{{"disaggregated", p.Disaggregated}, {"colocated", p.Colocated}} {
		if d.pr == nil {
			continue
		}
		ew.printf("\nTTFT budget, %s %s at %s req/s (ms)\n", d.name, d.pr.Design, num(d.pr.Rate))
		tw = tabwriter.NewWriter(ew, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "TERM\tMEAN\tP50\tP90\tP99\t\n")
		b := d.pr.Budget
		for _, t := range []struct {
			name string
			q    Quantiles
		}{{"ingress", b.Ingress}, {"queue", b.Queue}, {"prefill", b.Prefill}, {"kv_transfer", b.KVTransfer}, {"first_token", b.FirstToken}} {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", t.name, num(ms(t.q.Mean)), num(ms(t.q.P50)), num(ms(t.q.P90)), num(ms(t.q.P99)))
		}
		fmt.Fprintf(tw, "= TTFT\t%s\t%s\t%s\t%s\t\n", num(d.pr.TTFTMs.Mean), num(d.pr.TTFTMs.P50), num(d.pr.TTFTMs.P90), num(d.pr.TTFTMs.P99))
		if err := tw.Flush(); err != nil {
			ew.err = err
		}
		if d.pr.Design.Disaggregated() && p.Policy == PolicyPrefill {
			ew.printf("(kv_transfer is in the first inter-token gap under the prefill policy: mean %s ms, p99 %s ms)\n",
				num(ms(b.KVTransferAny.Mean)), num(ms(b.KVTransferAny.P99)))
		}
	}
	p.writeMatrix(ew)
	if len(p.CacheSweep) > 0 && ew.err == nil {
		ew.err = WriteCacheSweep(ew.w, p.CacheSweep, p.unit())
	}
	for _, n := range p.Notes {
		ew.printf("note: %s\n", n)
	}
	for _, w := range p.Warnings {
		ew.printf("warning: %s\n", w)
	}
	ew.printf("%d simulations of %d+ requests each (seed %d).\n", p.Simulations, p.SimulatedRequests, p.Seed)
}

// recommendation states the objective that decided and the recommended
// design, compared with the other design on that objective.
func (p *Plan) recommendation() string {
	u := p.unit()
	var b strings.Builder
	if p.Objective == ObjectiveFewestGPUs {
		fmt.Fprintf(&b, "Objective: the fewest %ss that serve %s req/s within the SLO (--rate); at equal %ss, the higher max rate.\n", u, num(p.RequestedRate), u)
	} else {
		fmt.Fprintf(&b, "Objective: the highest goodput per %s within %s (no --rate).\n", u, plural(p.GPUBudget, u))
	}
	if !p.Feasible {
		if p.Objective == ObjectiveFewestGPUs {
			fmt.Fprintf(&b, "No design within %s meets the SLO at %s req/s.", plural(p.GPUBudget, u), num(p.RequestedRate))
		} else {
			fmt.Fprintf(&b, "No design within %s meets the SLO.", plural(p.GPUBudget, u))
		}
		return b.String()
	}
	var rec, other *Prediction
	var recName, otherName, recReps string
	var recPer, otherPer, recMax, otherMax float64
	if p.Recommended == "disaggregated" {
		rec, other = p.Disaggregated, p.Colocated
		recName, otherName = "disaggregated", "colocated"
		recReps = fmt.Sprintf("%d prefill + %d decode replicas", p.PrefillReplicas, p.DecodeReplicas)
		recPer, otherPer = p.GoodputPerGPU.Disaggregated, p.GoodputPerGPU.Colocated
		recMax, otherMax = p.MaxRate.Disaggregated, p.MaxRate.Colocated
	} else {
		rec, other = p.Colocated, p.Disaggregated
		recName, otherName = "colocated", "disaggregated"
		recReps = plural(p.ColocatedReplicas, "replica")
		recPer, otherPer = p.GoodputPerGPU.Colocated, p.GoodputPerGPU.Disaggregated
		recMax, otherMax = p.MaxRate.Colocated, p.MaxRate.Disaggregated
	}
	fmt.Fprintf(&b, "Recommended: %s, %s", recName, recReps)
	switch {
	case p.Objective == ObjectiveFewestGPUs && other == nil:
		fmt.Fprintf(&b, ": %s at %s req/s (no %s design within %s meets the SLO at that rate).",
			plural(rec.GPUs, u), num(p.RequestedRate), otherName, plural(p.GPUBudget, u))
	case p.Objective == ObjectiveFewestGPUs && rec.GPUs < other.GPUs:
		fmt.Fprintf(&b, ": %s at %s req/s, against %s for %s %s.",
			plural(rec.GPUs, u), num(p.RequestedRate), plural(other.GPUs, u), otherName, short(other.Design))
	case p.Objective == ObjectiveFewestGPUs:
		fmt.Fprintf(&b, ": both designs need %s at %s req/s; %s reaches %s req/s at most, %s %s.",
			plural(rec.GPUs, u), num(p.RequestedRate), recName, num(recMax), otherName, num(otherMax))
	case other != nil && otherPer > 0:
		fmt.Fprintf(&b, " (%.2fx the goodput per %s of %s %s).", recPer/otherPer, u, otherName, short(other.Design))
	default:
		fmt.Fprintf(&b, " (no %s design within %s meets the SLO).", otherName, plural(p.GPUBudget, u))
	}
	if p.Objective == ObjectiveFewestGPUs {
		// The grid below is the per-unit search: say what it would
		// recommend, so that its figures do not read as a contradiction.
		d, dok := bestPerGPU(p.Candidates)
		c, cok := bestPerGPU(p.ColocatedCandidates)
		if dok || cok {
			fmt.Fprintf(&b, "\nWithout --rate (the highest goodput per %s) the grid's best are", u)
			if dok {
				fmt.Fprintf(&b, " disaggregated %s at %s req/s per %s", short(d.Design), num(d.GoodputPerGPU), u)
			}
			if dok && cok {
				b.WriteString(" and")
			}
			if cok {
				fmt.Fprintf(&b, " colocated %s at %s", short(c.Design), num(c.GoodputPerGPU))
			}
			fmt.Fprintf(&b, ": more %ss than %s req/s needs.", u, num(p.RequestedRate))
		}
	}
	return b.String()
}

// short names a design in a sentence: 4P+4D, 8C (without the chunk).
func short(d Design) string {
	if d.Disaggregated() {
		return d.String()
	}
	return fmt.Sprintf("%dC", d.Colocated)
}

// writeMatrix prints goodput per GPU of every disaggregated candidate, P
// down, D across.
func (p *Plan) writeMatrix(ew *errWriter) {
	maxP, maxD := 0, 0
	for _, c := range p.Candidates {
		maxP, maxD = max(maxP, c.Design.Prefill), max(maxD, c.Design.Decode)
	}
	if maxP == 0 {
		return
	}
	ew.printf("\nGoodput per %s (req/s) by prefill (rows) and decode (columns) replicas; '.' skipped by bound, '-' never meets the SLO\n", p.unit())
	tw := tabwriter.NewWriter(ew, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "P\\D\t")
	for d := 1; d <= maxD; d++ {
		fmt.Fprintf(tw, "%d\t", d)
	}
	fmt.Fprintf(tw, "\n")
	for pr := 1; pr <= maxP; pr++ {
		fmt.Fprintf(tw, "%d\t", pr)
		for d := 1; d <= maxD; d++ {
			cell := ""
			if i := slices.IndexFunc(p.Candidates, func(c Candidate) bool { return c.Design.Prefill == pr && c.Design.Decode == d }); i >= 0 {
				switch c := p.Candidates[i]; {
				case c.Skipped:
					cell = "."
				case c.MaxRate <= 0:
					cell = "-"
				default:
					cell = fmt.Sprintf("%.3g", c.GoodputPerGPU)
				}
			}
			fmt.Fprintf(tw, "%s\t", cell)
		}
		fmt.Fprintf(tw, "\n")
	}
	if err := tw.Flush(); err != nil {
		ew.err = err
	}
}

// Chart returns the chart of goodput per GPU against the P:D ratio: for
// every plan the best disaggregated candidate at each ratio, and the best
// colocated goodput per GPU as a reference line.
func Chart(plans ...*Plan) *plot.Chart {
	u := "GPU"
	if len(plans) > 0 {
		u = plans[0].unit()
	}
	c := &plot.Chart{
		Title:  "Goodput per " + u + " against the prefill:decode ratio",
		XLabel: "P:D ratio (prefill replicas / decode replicas)",
		YLabel: "goodput per " + u + " (req/s per " + u + ")",
	}
	var foot []string
	for _, p := range plans {
		best := map[float64]float64{}
		for _, cd := range p.Candidates {
			if cd.Skipped || cd.MaxRate <= 0 {
				continue
			}
			r := float64(cd.Design.Prefill) / float64(cd.Design.Decode)
			best[r] = max(best[r], cd.GoodputPerGPU)
		}
		xs := make([]float64, 0, len(best))
		for r := range best {
			xs = append(xs, r)
		}
		slices.Sort(xs)
		ys := make([]float64, len(xs))
		for i, x := range xs {
			ys[i] = best[x]
		}
		name := "disaggregated"
		if len(plans) > 1 {
			name = p.profiles()
		}
		c.Series = append(c.Series, plot.Series{Name: name, X: xs, Y: ys, Markers: true})
		if p.GoodputPerGPU.Colocated > 0 {
			label := "colocated"
			if len(plans) > 1 {
				label = "colocated " + p.ColocatedProfile
			}
			if p.Colocated != nil {
				label += fmt.Sprintf(" %s: %s req/s per %s", p.Colocated.Design, num(p.GoodputPerGPU.Colocated), p.unit())
			}
			c.Refs = append(c.Refs, plot.Ref{Y: p.GoodputPerGPU.Colocated, Label: label})
		}
		foot = append(foot, fmt.Sprintf("%s: %s; SLO TTFT %s ms, TPOT %s ms at %.4g%%; link %s Gb/s, codec %s",
			p.profiles(), p.Workload.Description, num(p.SLOTTFTMs), num(p.SLOTPOTMs), p.Attainment*100, num(p.LinkGbps), p.Codec.Name))
		for _, n := range p.Notes {
			if strings.Contains(n, "CC-BY") {
				foot = append(foot, n)
			}
		}
	}
	c.Footer = strings.Join(slices.Compact(foot), "\n")
	return c
}

// WritePNG draws Chart(plans...) as PNG to w.
func WritePNG(w io.Writer, plans ...*Plan) error { return Chart(plans...).WritePNG(w) }

// codecSpeeds says what speeds a plan used for its codec, and whence.
func codecSpeeds(c Codec) string {
	speed := func(x float64) string {
		if x == 0 {
			return "no limit"
		}
		return num(x/1e9) + " GB/s"
	}
	s := fmt.Sprintf("encode %s, decode %s per core", speed(c.EncodeBytesPerSec), speed(c.DecodeBytesPerSec))
	if c.EncodeBytesPerSec == 0 && c.DecodeBytesPerSec == 0 {
		s = "no CPU time: only the link limits a transfer"
	}
	if c.Source != "" {
		s += "; " + c.Source
	}
	return s
}

func chunkText(c int) string {
	switch {
	case c < 0:
		return "without chunked prefill (prefill-priority whole prompts)"
	case c == 0:
		return "chunk budget not chosen"
	}
	return fmt.Sprintf("chunked prefill, %d tokens per step", c)
}

func lossy(lossless bool) string {
	if lossless {
		return "lossless"
	}
	return "lossy"
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// num formats x with 3–4 significant digits, without exponent for usual
// magnitudes.
func num(x float64) string {
	switch a := math.Abs(x); {
	case x == 0:
		return "0"
	case a >= 1000:
		return fmt.Sprintf("%.0f", x)
	case a >= 100:
		return fmt.Sprintf("%.1f", x)
	case a >= 10:
		return fmt.Sprintf("%.2f", x)
	case a >= 0.01:
		return fmt.Sprintf("%.3f", x)
	}
	return fmt.Sprintf("%.3g", x)
}

// money formats a dollar amount with 3 significant digits and no
// exponent: $0.0000965, $0.0123, $1.23, $1234.50 ("-" for 0).
func money(x float64) string {
	switch {
	case x == 0:
		return "-"
	case math.IsNaN(x) || math.IsInf(x, 0):
		return "$" + fmt.Sprint(x)
	}
	dec := 2
	if a := math.Abs(x); a < 1 {
		// Digits after the point up to the third significant one.
		dec = max(2, 2-int(math.Floor(math.Log10(a))))
		if r := math.Round(a*math.Pow(10, float64(dec))) / math.Pow(10, float64(dec)); r >= math.Pow(10, math.Floor(math.Log10(a))+1) {
			dec = max(2, dec-1) // 0.000999 rounds up to 0.00100
		}
	}
	return "$" + strconv.FormatFloat(x, 'f', dec, 64)
}

// plural is "1 replica", "2 replicas".
func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }

// Evaluation is the prediction for one given design at one given rate,
// without a search: the model's figures to set next to a measured
// deployment of that design (`coordinator plan --design`).
type Evaluation struct {
	Profile          string          `json:"profile"`
	DecodeProfile    string          `json:"decode_profile"`
	ColocatedProfile string          `json:"colocated_profile"`
	Workload         WorkloadSummary `json:"workload"`
	SLOTTFTMs        float64         `json:"slo_ttft_ms"`
	SLOTPOTMs        float64         `json:"slo_tpot_ms"`
	// Target is the SLO's attainment target, in (0, 1].
	Target         float64 `json:"attainment_target"`
	LinkGbps       float64 `json:"link_gbps"`
	Codec          Codec   `json:"codec"`
	CodecCores     int     `json:"codec_cores"`
	KVTransferGBps float64 `json:"kv_transfer_raw_gb_per_s"`
	Policy         Policy  `json:"first_token_policy"`
	Limits         Limits  `json:"limits"`
	// MeetsSLO: Prediction.Attainment ≥ Target.
	MeetsSLO bool `json:"meets_slo"`
	// Measured is how many simulated requests count in the prediction
	// (those arriving after the warm-up and before the drain).
	Measured int `json:"measured_requests"`
	// Failed of them could not be served at all (longer than a worker's
	// KV memory).
	Failed     int         `json:"failed_requests"`
	Prediction *Prediction `json:"prediction"`
	// PrefixCache describes the simulated prefix caches (nil: none).
	PrefixCache *CacheSummary `json:"prefix_cache,omitempty"`
	Seed        uint64        `json:"seed"`
	Notes       []string      `json:"notes,omitempty"`
	// Warnings: the workload leaves a profile's measured range (as
	// Plan.Warnings).
	Warnings []string `json:"warnings,omitempty"`
}

// Evaluate simulates design d under cfg at cfg.Rate, which must be > 0,
// and returns the prediction; it searches nothing, so the GPU budget does
// not bound d. A colocated d needs its Chunk (-1 or > 0). Errors wrap
// ErrConfig. Deterministic in cfg and d.
func Evaluate(cfg *Config, d Design) (*Evaluation, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case !(cfg.Rate > 0):
		return nil, fmt.Errorf("%w: evaluating a design needs a rate > 0", ErrConfig)
	case d.Colocated == 0 && (d.Prefill < 1 || d.Decode < 1):
		return nil, fmt.Errorf("%w: design %s: a disaggregated design needs ≥ 1 prefill and ≥ 1 decode worker", ErrConfig, d)
	case d.Colocated != 0 && (d.Colocated < 1 || d.Prefill != 0 || d.Decode != 0 || d.Chunk == 0 || d.Chunk < -1):
		return nil, fmt.Errorf("%w: design %s: a colocated design needs ≥ 1 worker and a chunk budget of -1 or > 0", ErrConfig, d)
	}
	s := newSearcher(cfg)
	pl := s.newPlan()
	r := s.sim.run(d, cfg.Rate, false)
	e := &Evaluation{
		Profile: pl.Profile, DecodeProfile: pl.DecodeProfile, ColocatedProfile: pl.ColocatedProfile,
		Workload: pl.Workload, SLOTTFTMs: pl.SLOTTFTMs, SLOTPOTMs: pl.SLOTPOTMs, Target: pl.Attainment,
		LinkGbps: pl.LinkGbps, Codec: pl.Codec, CodecCores: pl.CodecCores, KVTransferGBps: pl.KVTransferGBps,
		Policy: pl.Policy, Limits: pl.Limits, MeetsSLO: r.Attainment >= cfg.SLO.Attainment,
		Measured: r.Requests, Failed: r.Failed, Seed: pl.Seed, Notes: pl.Notes,
		Prediction: s.sim.prediction(r, s.gpus(d)), PrefixCache: pl.PrefixCache,
	}
	if d.Colocated == 0 {
		e.Warnings, e.Notes = rangeWarnings(cfg, s.sim.st, slices.Clone(e.Notes), e.Prediction, nil, true, false)
	} else {
		e.Warnings, e.Notes = rangeWarnings(cfg, s.sim.st, slices.Clone(e.Notes), nil, e.Prediction, false, true)
	}
	if d.Colocated == 0 {
		e.Limits.ChunkTokens = 0 // not used by a disaggregated design
	} else {
		e.Limits.ChunkTokens = d.Chunk
	}
	return e, nil
}

// WriteEvaluationJSON writes e as indented JSON.
func WriteEvaluationJSON(w io.Writer, e *Evaluation) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(e); err != nil {
		return fmt.Errorf("planner: write json: %w", err)
	}
	return nil
}

// WriteEvaluationTable writes e as text: the design, rate and predicted
// attainment with TTFT and TPOT percentiles and the TTFT budget.
func WriteEvaluationTable(w io.Writer, e *Evaluation) error {
	ew := &errWriter{w: w}
	p := e.Prediction
	ew.printf("pdserve plan --design: %s on %s, %s, %s arrivals\n", p.Design, e.Profile, e.Workload.Description, e.Workload.Arrivals)
	ew.printf("  SLO TTFT %s ms, TPOT %s ms; policy %s; link %s Gb/s, codec %s\n",
		num(e.SLOTTFTMs), num(e.SLOTPOTMs), e.Policy, num(e.LinkGbps), e.Codec.Name)
	ew.printf("  at %s req/s: attainment %.1f%% (target %.4g%%, %d requests measured, %d failed), TTFT alone %.1f%%\n",
		num(p.Rate), p.Attainment*100, e.Target*100, e.Measured, e.Failed, p.TTFTAttainment*100)
	ew.printf("  TTFT p50/p90/p99 %s / %s / %s ms, TPOT p50/p90/p99 %s / %s / %s ms\n",
		num(p.TTFTMs.P50), num(p.TTFTMs.P90), num(p.TTFTMs.P99), num(p.TPOTMs.P50), num(p.TPOTMs.P90), num(p.TPOTMs.P99))
	if c := e.PrefixCache; c != nil {
		ew.printf("  %s\n", c.text())
		ew.printf("  prefix-cache hit ratio %.3f (%.2f of the ceiling), %s of the hit tokens loaded from the host tier\n",
			p.PrefixCache.HitRatio, ratioOf(p.PrefixCache.HitRatio, c.Ceiling), pct(p.PrefixCache.HostHitTokens, p.PrefixCache.HitTokens))
	}
	b := budgetMs(p.Budget)
	ew.printf("  mean TTFT budget (ms): ingress %s, queue %s, prefill %s, kv_transfer %s, first_token %s (exposed transfer, any policy: %s)\n",
		num(b.Ingress), num(b.Queue), num(b.Prefill), num(b.KVTransfer), num(b.FirstToken), num(ms(p.Budget.KVTransferAny.Mean)))
	l := e.Limits
	ew.printf("  limits: decode batch ≤ %d, prefill ≤ %d tokens per step", l.MaxDecodeBatch, l.MaxPrefillTokens)
	if p.Design.Colocated > 0 {
		ew.printf(", colocated %s", chunkText(l.ChunkTokens))
	}
	ew.printf("\n")
	for _, w := range e.Warnings {
		ew.printf("warning: %s\n", w)
	}
	return ew.err
}
