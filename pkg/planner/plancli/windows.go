package plancli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pdserve/pdserve/pkg/planner"
)

// WindowPlan is the plan of one window of a trace (--window).
type WindowPlan struct {
	Start    time.Duration `json:"-"`
	End      time.Duration `json:"-"`
	StartS   float64       `json:"start_s"`
	EndS     float64       `json:"end_s"`
	Requests int           `json:"requests"`
	Rate     float64       `json:"rate"` // req/s of the window
	// Design is the disaggregated design (the P:D ratio) of the plan;
	// zero when the window was not planned (fewer than two requests).
	// When nothing met the SLO it is the design that came closest.
	Design planner.Design `json:"design"`
	GPUs   int            `json:"gpus"`
	// Attainment is Design's predicted SLO attainment.
	Attainment float64 `json:"attainment"`
	Feasible   bool    `json:"feasible"`
	// Colocated is the plan's colocated design when the plan recommends
	// it over Design (fewer GPUs at the window's rate), else zero.
	Colocated planner.Design `json:"colocated_recommended"`
	// Skipped says why the window was not planned; "" when it was.
	Skipped string `json:"skipped,omitempty"`
	// RoleChanges is planner.RoleChanges from the design planned last
	// before this window (0 for the first planned window).
	RoleChanges int `json:"role_changes"`
	// Goodput is Design's predicted goodput, req/s meeting both SLOs
	// (Attainment × Rate).
	Goodput float64 `json:"goodput"`
}

// WindowsReport is what --window prints.
type WindowsReport struct {
	Profile string  `json:"profile"`
	WindowS float64 `json:"window_s"`
	// FixedGPUs is --gpus: every window's design uses exactly these GPUs
	// (0: each window got the fewest GPUs that meet the SLO).
	FixedGPUs int          `json:"fixed_gpus,omitempty"`
	Windows   []WindowPlan `json:"windows"`
	Changes   int          `json:"role_changes"`
	Transits  int          `json:"transitions"`
	PerDay    float64      `json:"role_changes_per_day"`
	Workload  string       `json:"workload"`
	Attribute []string     `json:"notes,omitempty"`
}

// planWindows is Run with --window: the trace cut into windows, each
// planned at its own rate, then the role changes between consecutive
// windows' designs, scaled to a day.
func planWindows(ctx context.Context, o Options, stdout, stderr io.Writer) int {
	usage := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "coordinator plan: "+format+"\n", args...)
		return 2
	}
	switch {
	case o.Window < 0:
		return usage("--window %v must be > 0", o.Window)
	case len(o.Profiles) != 1:
		return usage("--window plans one --profile")
	case o.Rate != 0:
		return usage("--window plans each window at its own rate: drop --rate")
	case o.Design != "" || o.Plot != "":
		return usage("--window searches each window and draws no plot: drop --design and --plot")
	case o.GPUs < 0:
		return usage("--gpus %d must be ≥ 0", o.GPUs)
	case o.GPUs > 0 && o.GPUBudget != 0 && o.GPUBudget != o.GPUs:
		return usage("--gpus %d fixes the pool; --gpu-budget %d caps it: give one", o.GPUs, o.GPUBudget)
	}
	if o.GPUs > 0 {
		o.GPUBudget = o.GPUs
	}
	cfgs, err := o.Configs()
	if err != nil {
		return usage("%v", strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
	}
	var splits []planner.Design
	if o.GPUs > 0 {
		if splits = poolSplits(cfgs[0], o.GPUs); len(splits) == 0 {
			return usage("--gpus %d: no split into ≥ 1 prefill and ≥ 1 decode worker of %d and %d GPUs each", o.GPUs, cfgs[0].Prefill.Units(), decodeUnits(cfgs[0]))
		}
	}
	wins, err := planner.LoadTraceWindows(o.Workload, o.Window)
	if err != nil {
		return usage("--workload: %v", err)
	}
	start := time.Now()
	var rep WindowsReport
	var code int
	if o.GPUs > 0 {
		rep, code, err = fixedWindowPlans(ctx, cfgs[0], wins, o.Window, o.GPUs, splits)
	} else {
		rep, code, err = windowPlans(ctx, cfgs[0], wins, o.Window)
	}
	if err != nil {
		fmt.Fprintf(stderr, "coordinator plan: %v\n", err)
		return 1
	}
	rep.Workload = cfgs[0].Workload.Description
	rep.Attribute = cfgs[0].Workload.Notes
	if o.Output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = writeWindows(stdout, rep)
	}
	if err != nil {
		fmt.Fprintf(stderr, "coordinator plan: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "coordinator plan: %d windows planned in %.2f s\n", len(wins), time.Since(start).Seconds())
	return code
}

// windowPlans plans each window of wins with base (its workload and rate
// replaced by the window's) and counts the role changes between the
// disaggregated designs of consecutive planned windows. code is 1 when a
// window had no feasible design (its closest design still counts).
func windowPlans(ctx context.Context, base *planner.Config, wins []planner.TraceWindow, window time.Duration) (rep WindowsReport, code int, err error) {
	rep = WindowsReport{Profile: base.Prefill.Name, WindowS: window.Seconds()}
	var prev *planner.Design
	for _, tw := range wins {
		wp, c, ok := startWindow(base, tw)
		if !ok {
			rep.Windows = append(rep.Windows, wp)
			continue
		}
		p, err := planner.Run(ctx, &c)
		switch {
		case errors.Is(err, planner.ErrInfeasible):
			code = 1
		case err != nil:
			return rep, 1, fmt.Errorf("window %v–%v: %w", tw.Start, tw.End, err)
		}
		if pred := p.Disaggregated; pred != nil {
			wp.Design, wp.GPUs, wp.Attainment = pred.Design, pred.GPUs, pred.Attainment
			wp.Feasible = pred.Attainment >= c.SLO.Attainment
			wp.Goodput = pred.Attainment * wp.Rate
		}
		if p.Recommended == "colocated" && p.Colocated != nil {
			wp.Colocated = p.Colocated.Design
		}
		prev = rep.add(wp, prev)
	}
	rep.PerDay = planner.ChangesPerDay(rep.Changes, rep.Transits, window)
	return rep, code, nil
}

// decodeUnits is the GPUs (cores) of one decode worker of c.
func decodeUnits(c *planner.Config) int {
	if c.Decode != nil {
		return c.Decode.Units()
	}
	return c.Prefill.Units()
}

// poolSplits are the disaggregated designs that use exactly gpus GPUs
// (cores) of c's workers, ≥ 1 of each role, fewest prefill workers first.
func poolSplits(c *planner.Config, gpus int) []planner.Design {
	pu, du := c.Prefill.Units(), decodeUnits(c)
	var out []planner.Design
	for p := 1; p*pu < gpus; p++ {
		if rest := gpus - p*pu; rest%du == 0 {
			out = append(out, planner.Design{Prefill: p, Decode: rest / du})
		}
	}
	return out
}

// bestSplit picks among splits (predicted attainments att, one per
// split) the one with the highest attainment; at a tie it keeps prev,
// the previous window's split, when prev is among the best (a planner
// moves no worker for no predicted gain), else the first of the best.
func bestSplit(splits []planner.Design, att []float64, prev *planner.Design) int {
	best := 0
	for i := range splits {
		switch {
		case att[i] > att[best]:
			best = i
		case att[i] == att[best] && prev != nil && splits[i] == *prev:
			best = i
		}
	}
	return best
}

// fixedWindowPlans is windowPlans on a fixed pool of gpus GPUs (--gpus):
// each window evaluates every split of the pool (splits, from
// poolSplits) at the window's rate and takes bestSplit, so the total
// never changes and every difference between consecutive windows'
// designs is workers moved. code is 1 when a window's best split misses
// the attainment target (it still counts).
func fixedWindowPlans(ctx context.Context, base *planner.Config, wins []planner.TraceWindow, window time.Duration, gpus int, splits []planner.Design) (rep WindowsReport, code int, err error) {
	rep = WindowsReport{Profile: base.Prefill.Name, WindowS: window.Seconds(), FixedGPUs: gpus}
	var prev *planner.Design
	att := make([]float64, len(splits))
	for _, tw := range wins {
		wp, c, ok := startWindow(base, tw)
		if !ok {
			rep.Windows = append(rep.Windows, wp)
			continue
		}
		for i, d := range splits {
			if err := ctx.Err(); err != nil {
				return rep, 1, err
			}
			e, err := planner.Evaluate(&c, d)
			if err != nil {
				return rep, 1, fmt.Errorf("window %v–%v: split %s: %w", tw.Start, tw.End, d, err)
			}
			att[i] = e.Prediction.Attainment
		}
		k := bestSplit(splits, att, prev)
		wp.Design, wp.GPUs, wp.Attainment = splits[k], gpus, att[k]
		wp.Feasible = att[k] >= c.SLO.Attainment
		wp.Goodput = att[k] * wp.Rate
		if !wp.Feasible {
			code = 1
		}
		prev = rep.add(wp, prev)
	}
	rep.PerDay = planner.ChangesPerDay(rep.Changes, rep.Transits, window)
	return rep, code, nil
}

// add appends wp to the report, counting the role changes from the
// previous window's design prev (nil: wp is the first), and returns wp's
// design as the next window's prev.
func (rep *WindowsReport) add(wp WindowPlan, prev *planner.Design) *planner.Design {
	if prev != nil {
		wp.RoleChanges = planner.RoleChanges(*prev, wp.Design)
		rep.Changes += wp.RoleChanges
		rep.Transits++
	}
	rep.Windows = append(rep.Windows, wp)
	d := wp.Design
	return &d
}

func writeWindows(w io.Writer, rep WindowsReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "pdserve plan by window of %v: %s\nworkload: %s\n", time.Duration(rep.WindowS*float64(time.Second)), rep.Profile, rep.Workload)
	if rep.FixedGPUs > 0 {
		fmt.Fprintf(&b, "pool: %d GPUs in every window, split as each window's best predicted attainment asks\n", rep.FixedGPUs)
	} else {
		b.WriteString("pool: each window the fewest GPUs that meet the SLO\n")
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "window\trequests\treq/s\tP:D\tGPUs\tpredicted attainment\tpredicted goodput\trole changes\tcolocated, when fewer GPUs")
	for _, wp := range rep.Windows {
		span := fmt.Sprintf("%v–%v", wp.Start, wp.End)
		if wp.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%d\t—\t— (%s)\t—\t—\t—\t—\t—\n", span, wp.Requests, wp.Skipped)
			continue
		}
		design := fmt.Sprintf("%d:%d", wp.Design.Prefill, wp.Design.Decode)
		if !wp.Feasible {
			design += " (misses the SLO)"
		}
		coloc := "—"
		if wp.Colocated.Colocated > 0 {
			coloc = wp.Colocated.String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%s\t%d\t%.3f\t%.2f\t%d\t%s\n", span, wp.Requests, wp.Rate, design, wp.GPUs, wp.Attainment, wp.Goodput, wp.RoleChanges, coloc)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rep.Transits == 0 {
		fmt.Fprintf(&b, "\nRole changes: none (one window planned: no transition)\n")
	} else {
		fmt.Fprintf(&b, "\nRole changes (workers moved between prefill and decode from one window's P:D to the next): %d over %d transitions of %v → %.1f a day\n", rep.Changes, rep.Transits, time.Duration(rep.WindowS*float64(time.Second)), rep.PerDay)
	}
	for _, n := range rep.Attribute {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// startWindow returns the report's entry of tw and the configuration
// that plans it; ok is false, the entry marked skipped, for a window of
// fewer than 2 requests.
func startWindow(base *planner.Config, tw planner.TraceWindow) (wp WindowPlan, c planner.Config, ok bool) {
	wp = WindowPlan{Start: tw.Start, End: tw.End, StartS: tw.Start.Seconds(), EndS: tw.End.Seconds(), Requests: tw.Requests}
	if tw.Workload == nil || tw.Requests < 2 || !(tw.Workload.Rate > 0) {
		wp.Skipped = "fewer than 2 requests"
		return wp, c, false
	}
	wp.Rate = tw.Workload.Rate
	c = *base
	c.Workload, c.Rate = tw.Workload, tw.Workload.Rate
	return wp, c, true
}
