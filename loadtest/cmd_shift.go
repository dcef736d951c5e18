package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/loadtest/client"
	"github.com/pdserve/pdserve/loadtest/deploy"
	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/runner"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner"
	"github.com/pdserve/pdserve/pkg/plannerhost"
	"github.com/pdserve/pdserve/pkg/workload"
)

// The configurations `loadtest shift` runs.
const (
	shiftFixedFirst = "fixed-first" // the best fixed split for the first half
	shiftFixedWhole = "fixed-whole" // the best fixed split for the whole trace
	shiftDeploy     = "deployments" // the planner moving GPUs by replacing pods
	shiftElastic    = "elastic"     // the planner moving elastic workers' roles
)

var shiftConfigs = []string{shiftFixedFirst, shiftFixedWhole, shiftDeploy, shiftElastic}

// shiftOptions are `loadtest shift`'s flags.
type shiftOptions struct {
	Profile       string
	GPUs          int
	LinkGbps      float64
	PayloadScale  float64
	First, Second string
	Phase         time.Duration
	Rates         [2]float64
	TTFT, TPOT    time.Duration
	PodStart      time.Duration
	Configs       []string
	Interval      time.Duration
	Window        time.Duration
	Dwell         time.Duration
	MinGain       float64
	Seed          uint64
	Quiet         bool
	// Predict prints the planner's prediction of every split and the
	// bound on moving roles, and runs nothing.
	Predict bool
	// Log is the deployments' logger (--deploy-log).
	Log deployFlags
	// Start is the planner configurations' first split; zero: the first
	// half's best.
	Start planner.Design
}

func defaultShiftOptions() *shiftOptions {
	return &shiftOptions{
		Profile: "h100/llama-3-8b/tp1", GPUs: 3, LinkGbps: 100, PayloadScale: 1.0 / 1024,
		First:  "data/azure-llm-2023/AzureLLMInferenceTrace_code.csv",
		Second: "data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
		Phase:  90 * time.Second, TTFT: time.Second, TPOT: 25 * time.Millisecond,
		PodStart: 30 * time.Second, Configs: shiftConfigs,
		Interval: 5 * time.Second, Window: 20 * time.Second, Dwell: 15 * time.Second, MinGain: 0.02, Seed: 1,
	}
}

func (so *shiftOptions) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&so.Profile, "profile", so.Profile, "sim engine profile GPU/MODEL/tpN of every worker")
	fs.IntVar(&so.GPUs, "gpus", so.GPUs, "GPUs of the deployment (local: workers × tp; for rates per GPU)")
	fs.Float64Var(&so.LinkGbps, "link-gbps", so.LinkGbps, "KV link bandwidth in Gbit/s; transfers are paced for the true KV size")
	fs.Float64Var(&so.PayloadScale, "payload-scale", so.PayloadScale, "fraction of the true KV bytes actually moved, in (0, 1]; transfers are still paced for the true size")
	fs.StringVar(&so.First, "first-trace", so.First, "Azure trace .csv of the first half")
	fs.StringVar(&so.Second, "second-trace", so.Second, "Azure trace .csv of the second half")
	fs.DurationVar(&so.Phase, "phase", so.Phase, "wall time of each half: its trace's first requests, their arrival times rescaled to fill it at its rate")
	fs.Func("rates", "request rates of the halves, req/s: R1,R2 (required)", func(s string) error {
		a, b, ok := strings.Cut(s, ",")
		r1, err1 := strconv.ParseFloat(a, 64)
		r2, err2 := strconv.ParseFloat(b, 64)
		if !ok || err1 != nil || err2 != nil || !(r1 > 0) || !(r2 > 0) || math.IsInf(r1, 0) || math.IsInf(r2, 0) {
			return fmt.Errorf("want R1,R2 with rates > 0, got %q", s)
		}
		so.Rates = [2]float64{r1, r2}
		return nil
	})
	fs.DurationVar(&so.TTFT, "slo-ttft", so.TTFT, "time-to-first-token SLO")
	fs.DurationVar(&so.TPOT, "slo-tpot", so.TPOT, "time-per-output-token SLO")
	fs.DurationVar(&so.PodStart, "pod-start", so.PodStart, "deployments configuration: time from a drained worker to its replacement serving (pod start and model load)")
	fs.Func("configs", "configurations to run, comma-separated: "+strings.Join(shiftConfigs, ", ")+" (default all)", func(s string) error {
		var cs []string
		for _, c := range strings.Split(s, ",") {
			c = strings.TrimSpace(c)
			if !slices.Contains(shiftConfigs, c) {
				return fmt.Errorf("unknown configuration %q: want %s", c, strings.Join(shiftConfigs, ", "))
			}
			if !slices.Contains(cs, c) {
				cs = append(cs, c)
			}
		}
		so.Configs = cs
		return nil
	})
	fs.DurationVar(&so.Interval, "planner-interval", so.Interval, "time between re-plans")
	fs.DurationVar(&so.Window, "planner-window", so.Window, "how far back finished requests count for the planner")
	fs.DurationVar(&so.Dwell, "planner-role-dwell", so.Dwell, "least time between two role moves")
	fs.Float64Var(&so.MinGain, "planner-role-min-gain", so.MinGain, "least predicted SLO attainment gain (a fraction) of a role move")
	fs.Func("planner-start", "P:D the deployments and elastic configurations start on (default: the split best for the first half)", func(v string) error {
		a, b, ok := strings.Cut(v, ":")
		p, err1 := strconv.Atoi(a)
		d, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || p < 1 || d < 1 {
			return fmt.Errorf("want P:D with P, D ≥ 1, got %q", v)
		}
		so.Start = planner.Design{Prefill: p, Decode: d}
		return nil
	})
	fs.Uint64Var(&so.Seed, "seed", so.Seed, "seed of the prompts' content (the second half's: seed + 1)")
	fs.BoolVar(&so.Quiet, "quiet", so.Quiet, "no progress bar")
	fs.BoolVar(&so.Predict, "predict", so.Predict, "print only the planner's predicted attainment of every split on each half and its bound on the gain of moving roles (the best split of each half against the best fixed split, moves free); start no deployment")
	fs.StringVar(&so.Log.LogFile, "deploy-log", so.Log.LogFile, "local deployments: write their logs to this file (default: discard)")
}

func (so *shiftOptions) validate() error {
	switch {
	case so.GPUs < 2:
		return fmt.Errorf("%w: --gpus %d: want ≥ 2", errUsage, so.GPUs)
	case so.Rates[0] == 0:
		return fmt.Errorf("%w: --rates R1,R2 is required", errUsage)
	case so.Phase <= 0 || so.TTFT <= 0 || so.TPOT <= 0 || so.PodStart < 0:
		return fmt.Errorf("%w: --phase, --slo-ttft and --slo-tpot must be > 0, --pod-start ≥ 0", errUsage)
	case so.Interval <= 0 || so.Window <= 0 || so.Dwell <= 0:
		return fmt.Errorf("%w: --planner-interval, --planner-window and --planner-role-dwell must be > 0", errUsage)
	case !(so.PayloadScale > 0 && so.PayloadScale <= 1):
		return fmt.Errorf("%w: --payload-scale %v: want (0, 1]", errUsage, so.PayloadScale)
	case !(so.LinkGbps > 0):
		return fmt.Errorf("%w: --link-gbps must be > 0", errUsage)
	}
	return nil
}

// shiftHalf is one half of the shifting trace.
type shiftHalf struct {
	name  string
	reqs  []workload.Request
	sched []time.Duration // send offsets from the half's start
	rate  float64
}

// loadHalf takes the first rate × phase requests of the Azure trace at
// path and rescales their arrivals to span phase.
func loadHalf(path string, rate float64, phase time.Duration, seed uint64) (shiftHalf, error) {
	f, err := os.Open(path)
	if err != nil {
		return shiftHalf{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	defer f.Close()
	rows, err := workload.ParseAzure(f)
	if err != nil {
		return shiftHalf{}, fmt.Errorf("%w: %s: %v", errUsage, path, err)
	}
	n := int(math.Round(rate * phase.Seconds()))
	if n < 2 || n > len(rows) {
		return shiftHalf{}, fmt.Errorf("%w: %s: %.3g req/s for %v is %d requests; the trace has %d (want 2 or more)", errUsage, path, rate, phase, n, len(rows))
	}
	wl, err := workload.FromTrace(path, rows, workload.TraceOptions{}, n, seed, workload.Synth{})
	if err != nil {
		return shiftHalf{}, err
	}
	span := wl.Requests[n-1].Arrival
	h := shiftHalf{name: path, reqs: wl.Requests, rate: rate, sched: make([]time.Duration, n)}
	for i, r := range wl.Requests {
		// n requests at rate: the last one leaves (n-1)/rate after the first.
		if span > 0 {
			h.sched[i] = time.Duration(float64(r.Arrival) / float64(span) * float64(n-1) / rate * float64(time.Second))
		} else {
			h.sched[i] = time.Duration(float64(i) / rate * float64(time.Second))
		}
	}
	return h, nil
}

// plannerWorkload is a half as the planner sees it: its lengths, rate and
// normalised gaps.
func plannerWorkload(h shiftHalf) *planner.Workload {
	w := &planner.Workload{Description: h.name, Rate: h.rate}
	for _, r := range h.reqs {
		w.Lengths = append(w.Lengths, planner.Lengths{In: r.PromptLen, Out: r.OutputLen})
	}
	var sum float64
	gaps := make([]float64, len(h.sched)-1)
	for i := 1; i < len(h.sched); i++ {
		gaps[i-1] = (h.sched[i] - h.sched[i-1]).Seconds()
		sum += gaps[i-1]
	}
	if sum > 0 {
		for i := range gaps {
			gaps[i] /= sum / float64(len(gaps))
		}
		w.Gaps = gaps
	}
	return w
}

// shiftSplits is the planner's predicted attainment of each P:D split of
// the GPUs on each half, and the best split for the first half and for
// both halves together (pickSplits).
type shiftSplits struct {
	splits      []planner.Design
	att         [][2]float64 // per split, per half
	rates       [2]float64   // of the halves, req/s
	first, both int          // indexes into splits
}

// pickSplits sets c.first to the split with the highest attainment on
// the first half and c.both to the one with the highest predicted
// goodput over the whole trace: attainment × rate summed over the halves
// (they last as long), so a half at a higher rate weighs more. A tie
// keeps the split with fewer prefill workers (the earlier one).
func (c *shiftSplits) pickSplits() {
	c.first, c.both = 0, 0
	for k, a := range c.att {
		if a[0] > c.att[c.first][0] {
			c.first = k
		}
		if c.goodput(k) > c.goodput(c.both) {
			c.both = k
		}
	}
}

// goodput is split k's predicted goodput summed over the halves, req/s
// (twice its mean over the trace).
func (c *shiftSplits) goodput(k int) float64 {
	return c.att[k][0]*c.rates[0] + c.att[k][1]*c.rates[1]
}

// bound is the planner's bound on moving roles: the predicted goodput of
// the best split of each half, each in its half (moves free), over that
// of the best fixed split (c.both); 0 when the fixed split meets no SLO.
func (c *shiftSplits) bound() (best [2]float64, gain float64) {
	for _, a := range c.att {
		best[0], best[1] = max(best[0], a[0]), max(best[1], a[1])
	}
	if fixed := c.goodput(c.both); fixed > 0 {
		gain = (best[0]*c.rates[0] + best[1]*c.rates[1]) / fixed
	}
	return best, gain
}

func chooseSplits(so *shiftOptions, halves [2]shiftHalf) (shiftSplits, error) {
	prof, err := perfmodel.Resolve(so.Profile)
	if err != nil {
		return shiftSplits{}, fmt.Errorf("%w: --profile: %v", errUsage, err)
	}
	workers := so.GPUs / prof.TP
	if workers < 2 || workers*prof.TP != so.GPUs {
		return shiftSplits{}, fmt.Errorf("%w: --gpus %d is not ≥ 2 workers of tp %d", errUsage, so.GPUs, prof.TP)
	}
	codec, err := planner.CodecFor("none", so.LinkGbps*1e9/8, 0)
	if err != nil {
		return shiftSplits{}, err
	}
	c := shiftSplits{rates: [2]float64{halves[0].rate, halves[1].rate}}
	for p := 1; p < workers; p++ {
		d := planner.Design{Prefill: p, Decode: workers - p}
		var att [2]float64
		for i, h := range halves {
			cfg := &planner.Config{
				Prefill: prof, Workload: plannerWorkload(h), Rate: h.rate,
				SLO:             planner.SLO{TTFT: so.TTFT, TPOT: so.TPOT, Attainment: config.DefaultAttainment},
				LinkBytesPerSec: so.LinkGbps * 1e9 / 8, Codec: codec, Policy: planner.PolicyPrefill,
				GPUBudget: so.GPUs, Requests: min(len(h.reqs), 1000), Seed: 1,
			}
			e, err := planner.Evaluate(cfg, d)
			if err != nil {
				return shiftSplits{}, fmt.Errorf("planner: %s on %s: %w", d, h.name, err)
			}
			att[i] = e.Prediction.Attainment
		}
		c.splits = append(c.splits, d)
		c.att = append(c.att, att)
	}
	c.pickSplits()
	return c, nil
}

// shiftMinute is one minute of a run, by send time.
type shiftMinute struct {
	sent, good int
}

// shiftRun is one configuration's run.
type shiftRun struct {
	name, desc string
	minutes    []shiftMinute
	sent, good int
	span       time.Duration // of the schedule
	maxITL     time.Duration // the largest inter-token gap of any stream
	moves      int           // role changes the workers made
	firstSum   float64       // seconds from a role command to the first request in the new role, summed
	firstN     uint64
}

func (r shiftRun) goodput() float64 { return float64(r.good) / r.span.Seconds() }
func (r shiftRun) attainment() float64 {
	if r.sent == 0 {
		return 0
	}
	return float64(r.good) / float64(r.sent)
}

// cmdShift is `loadtest shift`.
func cmdShift(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	so := defaultShiftOptions()
	fs := flag.NewFlagSet("shift", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, stderr, "shift --rates R1,R2 [flags]",
		"A trace whose mix moves half-way (default: Azure code, then Azure conversation), each half its\n"+
			"trace's first requests at its rate, their arrivals rescaled to --phase. It runs on local sim\n"+
			"deployments of --gpus GPUs each: the best fixed P:D split for the first half, the best fixed\n"+
			"split for the whole trace (both chosen by the planner's simulation of every split), the\n"+
			"online planner moving GPUs between the pools by replacing pods (a moved worker finishes its\n"+
			"sequences, then serves its new role --pod-start later), and the planner moving elastic\n"+
			"workers (running sequences migrate with their KV). Both planner configurations start on the\n"+
			"first half's split. It prints per-minute and overall goodput and SLO attainment, the role\n"+
			"moves, the time from a role command to the first request in the new role, and the largest\n"+
			"inter-token gap of any stream.",
		"  go run ./loadtest shift --rates 5,30 --gpus 3 --phase 90s --slo-ttft 1s --slo-tpot 25ms\n")
	so.addFlags(fs)
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	if err := so.validate(); err != nil {
		return err
	}
	if tp := 1; so.Start.Prefill > 0 {
		if p, err := perfmodel.Resolve(so.Profile); err == nil {
			tp = p.TP
		}
		if (so.Start.Prefill+so.Start.Decode)*tp != so.GPUs {
			return fmt.Errorf("%w: --planner-start %d:%d is not --gpus %d", errUsage, so.Start.Prefill, so.Start.Decode, so.GPUs)
		}
	}
	var halves [2]shiftHalf
	for i, p := range []string{so.First, so.Second} {
		h, err := loadHalf(p, so.Rates[i], so.Phase, so.Seed+uint64(i))
		if err != nil {
			return err
		}
		halves[i] = h
	}
	choice, err := chooseSplits(so, halves)
	if err != nil {
		return err
	}
	if so.Predict {
		return writeShift(stdout, so, halves, choice, nil)
	}
	log, closeLog, err := so.Log.logger()
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	defer closeLog()
	reqs, sched := joinHalves(halves, so.Phase)
	slo := metrics.SLO{TTFT: so.TTFT, TPOT: so.TPOT}

	var runs []shiftRun
	ran := map[string]int{} // a split's fixed run, by design
	for _, name := range so.Configs {
		spec := deploy.Spec{
			Mode: deploy.Disaggregated, Engine: "sim", Profile: so.Profile, TimeScale: 1, PayloadScale: so.PayloadScale,
			LinkGbps: so.LinkGbps, FirstTokenPolicy: "prefill",
		}
		d := choice.splits[choice.first]
		desc := ""
		switch name {
		case shiftFixedFirst:
			desc = fmt.Sprintf("fixed %d:%d (best for the first half)", d.Prefill, d.Decode)
		case shiftFixedWhole:
			d = choice.splits[choice.both]
			desc = fmt.Sprintf("fixed %d:%d (best for the whole trace)", d.Prefill, d.Decode)
		case shiftDeploy, shiftElastic:
			if so.Start.Prefill > 0 {
				d = so.Start
			}
			spec.Elastic, spec.SLO = true, config.SLO{TTFTMs: float64(so.TTFT) / 1e6, TPOTMs: float64(so.TPOT) / 1e6}
			po := plannerhost.DefaultOptions()
			po.Mode, po.Roles, po.RoleDwell, po.RoleMinGain = plannerhost.Log, true, so.Dwell, so.MinGain
			po.Interval, po.Window, po.Cooldown, po.LinkGbps, po.GPUBudget = so.Interval, so.Window, so.Dwell, so.LinkGbps, so.GPUs
			po.MinObservations = 20
			spec.Planner = &po
			desc = fmt.Sprintf("planner role moves from %d:%d, elastic (sequences migrate)", d.Prefill, d.Decode)
			if name == shiftDeploy {
				spec.RoleChangeRestart = so.PodStart
				desc = fmt.Sprintf("planner role moves from %d:%d, each a pod replaced (sequences finish, then %v pod start and model load)", d.Prefill, d.Decode, so.PodStart)
			}
		}
		spec.PrefillWorkers, spec.DecodeWorkers = d.Prefill, d.Decode
		if k, ok := ran[d.String()]; ok && !spec.Elastic {
			r := runs[k]
			r.name, r.desc = name, desc+" (the same split: the run above)"
			runs = append(runs, r)
			continue
		}
		if !so.Quiet {
			fmt.Fprintf(stderr, "shift: %s: %s\n", name, desc)
		}
		r, err := shiftOne(ctx, spec, reqs, sched, slo, log.With(zap.String("configuration", name)), stderr, so.Quiet)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		r.name, r.desc, r.span = name, desc, 2*so.Phase
		if !spec.Elastic {
			ran[d.String()] = len(runs)
		}
		runs = append(runs, r)
	}
	return writeShift(stdout, so, halves, choice, runs)
}

// joinHalves puts the second half's requests after the first's, phase
// later, and numbers them in order.
func joinHalves(halves [2]shiftHalf, phase time.Duration) ([]workload.Request, []time.Duration) {
	var reqs []workload.Request
	var sched []time.Duration
	for i, h := range halves {
		for j, r := range h.reqs {
			r.Index = len(reqs)
			reqs = append(reqs, r)
			sched = append(sched, time.Duration(i)*phase+h.sched[j])
		}
	}
	return reqs, sched
}

// shiftOne starts spec, sends reqs on sched, and summarises the run by
// minute of send time.
func shiftOne(ctx context.Context, spec deploy.Spec, reqs []workload.Request, sched []time.Duration, slo metrics.SLO, log *zap.Logger, stderr io.Writer, quiet bool) (shiftRun, error) {
	reg := prometheus.NewRegistry()
	spec.Metrics = reg
	l, err := deploy.Start(ctx, spec, log)
	if err != nil {
		return shiftRun{}, err
	}
	defer l.Close(context.Background())
	model, err := discoverModel(ctx, l.URL(), "")
	if err != nil {
		return shiftRun{}, err
	}
	cl, err := client.New(client.Options{BaseURL: l.URL(), Model: model, IgnoreEOS: true})
	if err != nil {
		return shiftRun{}, err
	}
	defer cl.CloseIdle()
	bar := newProgress(stderr, quiet, spec.Mode)
	res, err := runner.Run(ctx, reqs, cl.Do, runner.Config{Schedule: sched, RequestTimeout: 5 * time.Minute, Progress: bar.update})
	bar.finish()
	if err != nil {
		return shiftRun{}, err
	}
	if res.Interrupted {
		return shiftRun{}, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	var r shiftRun
	for i := range res.Outcomes {
		o := &res.Outcomes[i]
		m := int(sched[o.Index] / time.Minute)
		for len(r.minutes) <= m {
			r.minutes = append(r.minutes, shiftMinute{})
		}
		r.minutes[m].sent++
		r.sent++
		if slo.Good(o) {
			r.minutes[m].good++
			r.good++
		}
		for _, g := range o.ITL {
			r.maxITL = max(r.maxITL, g)
		}
	}
	r.moves, r.firstSum, r.firstN, err = roleFigures(reg)
	return r, err
}

// roleFigures reads the workers' role changes and the time from each role
// command to the first request in the new role from their metrics.
func roleFigures(g prometheus.Gatherer) (moves int, firstSum float64, firstN uint64, err error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("worker metrics: %w", err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "pdserve_worker_role_changes_total":
				moves += int(m.GetCounter().GetValue())
			case "pdserve_worker_role_change_first_request_seconds":
				h := m.GetHistogram()
				firstSum += h.GetSampleSum()
				firstN += h.GetSampleCount()
			}
		}
	}
	return moves, firstSum, firstN, nil
}

func writeShift(w io.Writer, so *shiftOptions, halves [2]shiftHalf, c shiftSplits, runs []shiftRun) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Shifting trace: %s at %.3g req/s, then %s at %.3g req/s, %v each\n\n", halves[0].name, halves[0].rate, halves[1].name, halves[1].rate, so.Phase)
	fmt.Fprintf(&b, "sim %s, %d GPUs per configuration, KV at its true size paced at %g Gb/s (payload scale %.3g), first token from the prefill worker; SLO TTFT %v, TPOT %v\n\n",
		so.Profile, so.GPUs, so.LinkGbps, so.PayloadScale, so.TTFT, so.TPOT)
	b.WriteString("Planner's predicted attainment of each split, and its goodput over the whole trace (the fixed configurations' choice):\n\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "split\tfirst half\tsecond half\tgoodput, req/s")
	for i, d := range c.splits {
		a := c.att[i]
		fmt.Fprintf(tw, "%d:%d\t%.3f\t%.3f\t%.3f\n", d.Prefill, d.Decode, a[0], a[1], c.goodput(i)/2)
	}
	tw.Flush()
	if best, gain := c.bound(); gain > 0 {
		fmt.Fprintf(&b, "\nThe planner's bound on moving roles: the best split of each half (attainment %.3f, %.3f) against the best fixed split (%d:%d, %.3f req/s) gives at most %.2f× its goodput, moves free.\n",
			best[0], best[1], c.splits[c.both].Prefill, c.splits[c.both].Decode, c.goodput(c.both)/2, gain)
	} else {
		b.WriteString("\nThe planner's bound on moving roles: — (no fixed split meets an SLO).\n")
	}
	if runs == nil {
		fmt.Fprintf(&b, "\nnote: %s\n", planner.AzureAttribution)
		_, err := io.WriteString(w, b.String())
		return err
	}
	b.WriteString("\nGoodput (req/s meeting both SLOs) and attainment, per minute of send time and overall:\n\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	hdr := "configuration"
	minutes := 0
	for _, r := range runs {
		minutes = max(minutes, len(r.minutes))
	}
	for m := range minutes {
		hdr += fmt.Sprintf("\tmin %d", m+1)
	}
	fmt.Fprintln(tw, hdr+"\toverall goodput\toverall attainment\trole moves\tcommand → first request (mean)\tlargest inter-token gap")
	for _, r := range runs {
		line := r.name
		for m := range minutes {
			if m >= len(r.minutes) || r.minutes[m].sent == 0 {
				line += "\t—"
				continue
			}
			mm := r.minutes[m]
			line += fmt.Sprintf("\t%.2f (%.0f%%)", float64(mm.good)/60, 100*float64(mm.good)/float64(mm.sent))
		}
		first := "—"
		if r.firstN > 0 {
			first = fmt.Sprintf("%.2f s (%d)", r.firstSum/float64(r.firstN), r.firstN)
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.1f%%\t%d\t%s\t%v\n", line, r.goodput(), 100*r.attainment(), r.moves, first, r.maxITL.Round(time.Millisecond))
	}
	tw.Flush()
	b.WriteString("\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "- %s: %s\n", r.name, r.desc)
	}
	base := map[string]shiftRun{}
	for _, r := range runs {
		base[r.name] = r
	}
	if e, ok := base[shiftElastic]; ok {
		for _, other := range []string{shiftFixedWhole, shiftFixedFirst, shiftDeploy} {
			switch o, ok := base[other]; {
			case ok && o.good > 0:
				fmt.Fprintf(&b, "\nelastic / %s goodput: %.2f×", other, float64(e.good)/float64(o.good))
			case ok:
				fmt.Fprintf(&b, "\nelastic / %s goodput: — (%s met no SLO)", other, other)
			}
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "\nnote: %s\n", planner.AzureAttribution)
	_, err := io.WriteString(w, b.String())
	return err
}
