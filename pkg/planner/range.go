package planner

import (
	"fmt"
	"strings"

	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// profileRange is the span of a profile's step-time data points of its
// own shape: the largest prompt (chunk plus cached context), prompt
// tokens in one step, decode batch and decode context they cover. A zero
// field means no point covers that kind of step.
type profileRange struct {
	points int
	Steps
}

// rangeOf returns the span of p's step-time points (perfmodel
// MetricStepMs) on its own model shape and TP (calibration points of
// neighbouring models say nothing of this one's range).
func rangeOf(p *perfmodel.Profile) profileRange {
	var r profileRange
	for _, pt := range p.Points {
		if pt.Metric != perfmodel.MetricStepMs || pt.Spec != nil || (pt.TP != 0 && pt.TP != p.TP) {
			continue
		}
		r.points++
		r.note(pt.Batch())
	}
	return r
}

// need is what a plan asks of one profile, and for which pools.
type need struct {
	p     *perfmodel.Profile
	roles []string
	Steps
}

// rangeWarnings compares what the plan's workload and predictions ask of
// each profile with the range of the profile's data points. It returns a
// warning per profile that the plan leaves (step times there are
// extrapolated), and notes with a line per profile that has no step-time
// points of its own: its range is unknown, so no warning can be given (the
// roofline and DistServe's fits are meant to extrapolate, but nothing here
// says how far). Deterministic in its inputs.
//
// useDisagg and useColoc say which designs the plan weighs (both for Run,
// one for Evaluate): the profiles of the other are not checked.
func rangeWarnings(cfg *Config, st *stream, notes []string, disagg, coloc *Prediction, useDisagg, useColoc bool) (warnings, notesOut []string) {
	var maxIn, maxCtx int
	for _, l := range st.lens {
		maxIn, maxCtx = max(maxIn, l.In), max(maxCtx, l.In+l.Out)
	}
	var needs []*need
	add := func(p *perfmodel.Profile, role string, s Steps) {
		for _, n := range needs {
			if n.p == p || n.p.Name == p.Name {
				n.roles = append(n.roles, role)
				n.Steps = maxSteps(n.Steps, s)
				return
			}
		}
		needs = append(needs, &need{p: p, roles: []string{role}, Steps: s})
	}
	var d, c Steps
	if disagg != nil {
		d = disagg.Steps
	}
	if coloc != nil {
		c = coloc.Steps
	}
	if useDisagg {
		add(cfg.Prefill, "prefill", Steps{Prompt: max(maxIn, d.Prompt), PrefillTokens: d.PrefillTokens})
		add(cfg.decodeProfile(), "decode", Steps{DecodeBatch: d.DecodeBatch, DecodeContext: max(maxCtx, d.DecodeContext)})
	}
	if useColoc {
		add(cfg.colocatedProfile(), "colocated", maxSteps(c, Steps{Prompt: maxIn, DecodeContext: maxCtx}))
	}

	notesOut = notes
	for _, n := range needs {
		r := rangeOf(n.p)
		roles := strings.Join(n.roles, ", ")
		if r.points == 0 {
			notesOut = append(notesOut, fmt.Sprintf("profile %s (%s) has no step-time points of its own shape: the range its step times were checked over is unknown, so the plan cannot warn when the workload leaves it", n.p.Name, roles))
			continue
		}
		what := "calibration points"
		if n.p.Measured != nil {
			what = "measured range"
		}
		var out, unknown []string
		check := func(asked, have int, item, unit string) {
			switch {
			case asked == 0:
			case have == 0:
				unknown = append(unknown, item)
			case asked > have:
				out = append(out, fmt.Sprintf("%s up to %d%s (%s ≤ %d)", item, asked, unit, strings.TrimSuffix(what, " range"), have))
			}
		}
		check(n.Prompt, r.Prompt, "prompts", " tokens")
		check(n.PrefillTokens, r.PrefillTokens, "prefill steps", " tokens")
		check(n.DecodeBatch, r.DecodeBatch, "decode batches", " sequences")
		check(n.DecodeContext, r.DecodeContext, "decode contexts", " tokens")
		if len(out) > 0 {
			warnings = append(warnings, fmt.Sprintf("the workload leaves the %s of profile %s (%s): %s; step times there are extrapolated from the fit, so the plan is weaker there (measure a profile that covers it)",
				what, n.p.Name, roles, strings.Join(out, ", ")))
		}
		if len(unknown) > 0 {
			notesOut = append(notesOut, fmt.Sprintf("profile %s (%s) has no step-time points for %s: the range there is unknown", n.p.Name, roles, strings.Join(unknown, ", ")))
		}
	}
	return warnings, notesOut
}

func maxSteps(a, b Steps) Steps {
	return Steps{Prompt: max(a.Prompt, b.Prompt), PrefillTokens: max(a.PrefillTokens, b.PrefillTokens),
		DecodeBatch: max(a.DecodeBatch, b.DecodeBatch), DecodeContext: max(a.DecodeContext, b.DecodeContext)}
}
