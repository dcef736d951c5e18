package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/report"
	"github.com/pdserve/pdserve/loadtest/sweep"
)

// sweepOptions are the flags of a rate search (sweep and compare).
type sweepOptions struct {
	Rates     string
	Target    float64
	Steps     int
	Tolerance float64
	StopEarly bool

	rates []float64
}

// defaultSweepOptions: a 90 % target, bisected to 5 % in at most 8 runs
// past the grid.
func defaultSweepOptions() *sweepOptions {
	return &sweepOptions{Target: 0.9, Steps: 8, Tolerance: sweep.DefaultTolerance}
}

func (s *sweepOptions) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.Rates, "request-rates", s.Rates, "comma-separated request rates (req/s) to probe, e.g. 0.5,1,2,4")
	fs.Float64Var(&s.Target, "attainment", s.Target, "SLO attainment target in (0, 1]: the share of requests that must be good")
	fs.IntVar(&s.Steps, "search-steps", s.Steps, "most extra runs spent widening the grid and bisecting the bracket [last rate meeting the target, first rate failing] (0: the grid only)")
	fs.Float64Var(&s.Tolerance, "rate-tolerance", s.Tolerance, "bisect until the bracket's width relative to its lower end is at most this, in (0, 1)")
	fs.BoolVar(&s.StopEarly, "stop-early", s.StopEarly, "skip the grid rates above the first failing one")
}

func (s *sweepOptions) complete(o *benchOptions) error {
	var errs []string
	for _, f := range strings.Split(s.Rates, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		r, err := strconv.ParseFloat(f, 64)
		if err != nil || !(r > 0) || math.IsInf(r, 0) {
			errs = append(errs, fmt.Sprintf("--request-rates: %q is not a finite rate > 0", f))
			continue
		}
		s.rates = append(s.rates, r)
	}
	if len(s.rates) == 0 && len(errs) == 0 {
		errs = append(errs, "--request-rates: give at least one rate")
	}
	if !(s.Target > 0 && s.Target <= 1) {
		errs = append(errs, fmt.Sprintf("--attainment %v: want a share in (0, 1]", s.Target))
	}
	if s.Steps < 0 {
		errs = append(errs, fmt.Sprintf("--search-steps %d: want ≥ 0", s.Steps))
	}
	if !(s.Tolerance > 0 && s.Tolerance < 1) {
		errs = append(errs, fmt.Sprintf("--rate-tolerance %v: want a fraction in (0, 1)", s.Tolerance))
	}
	if !o.slo.Set() {
		errs = append(errs, "--goodput: a sweep needs SLOs (e.g. --goodput ttft:250 tpot:100)")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(errs, "; "))
	}
	return nil
}

func (s *sweepOptions) options() sweep.Options {
	return sweep.Options{Rates: s.rates, Target: s.Target, Steps: s.Steps, Tolerance: s.Tolerance, StopEarly: s.StopEarly}
}

// sweepRun is the outcome of searching one deployment.
type sweepRun struct {
	res    sweep.Result
	probes []report.Object // vLLM-style result of every probe, by rate
	meta   report.Meta     // of the last probe
	runs   map[float64]runOut
}

// search runs the rate search on b; every probe's run is kept.
func (b *bench) search(ctx context.Context, so *sweepOptions, title string) (sweepRun, error) {
	out := sweepRun{runs: map[float64]runOut{}}
	probe := func(ctx context.Context, rate float64) (metrics.Summary, error) {
		r, err := b.run(ctx, rate, fmt.Sprintf("%s %.3g req/s", title, rate))
		if err != nil {
			return metrics.Summary{}, err
		}
		out.runs[rate] = r
		out.meta = r.meta
		fmt.Fprintf(b.stderr, "%s: %.3g req/s: attainment %.1f%%, goodput %.3g req/s, %d failed\n",
			title, rate, 100*r.sum.Attainment, r.sum.RequestGoodput, r.sum.Failed)
		return r.sum, nil
	}
	res, err := sweep.Search(ctx, so.options(), probe)
	out.res = res
	for _, p := range res.Points {
		r := out.runs[p.Rate]
		out.probes = append(out.probes, report.Result(r.meta, r.sum, r.res.Outcomes, b.o.SaveDetailed))
	}
	return out, err
}

// cmdSweep is `loadtest sweep`.
func cmdSweep(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultBenchOptions()
	so := defaultSweepOptions()
	d := defaultDeployFlags()
	d.GPUs = 1
	var local string
	fs := flag.NewFlagSet("sweep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, stderr, "sweep [--base-url URL | --local MODE] --request-rates R1,R2,... [flags]",
		"Runs over a series of request rates: the SLO attainment at each, and the highest rate at which\n"+
			"--attainment of the requests meet every --goodput SLO, bisected until the bracket [last rate\n"+
			"meeting, first rate failing] is within --rate-tolerance (at most --search-steps extra runs),\n"+
			"per GPU (--gpus).",
		"  go run ./loadtest sweep --base-url http://127.0.0.1:8080 --gpus 3 --request-rates 1,2,4,8 \\\n"+
			"    --search-steps 3 --attainment 0.9 --goodput ttft:250 tpot:100\n")
	o.addFlags(fs)
	so.addFlags(fs)
	d.addFlags(fs)
	fs.StringVar(&local, "local", "", "start a local deployment to sweep: colocated or disaggregated (default: use --base-url)")
	if err := parseFlags(fs, args, o); err != nil {
		return err
	}
	if err := so.complete(o); err != nil {
		return err
	}
	if err := d.checkUnit(); err != nil {
		return err
	}
	gpus := d.GPUs
	if gpus < 1 {
		return fmt.Errorf("%w: --gpus %d: want ≥ 1", errUsage, gpus)
	}
	url, _, stop, err := d.startLocal(ctx, local, o.TimeScale, stderr)
	if err != nil {
		return err
	}
	defer stop()
	b, err := newBench(ctx, o, url, stderr)
	if err != nil {
		return err
	}
	defer b.cl.CloseIdle()
	sr, err := b.search(ctx, so, "sweep")
	if len(sr.res.Points) == 0 {
		return err
	}
	sr.meta.Arrival = arrivalKind(o)
	if werr := report.SweepMarkdown(stdout, sr.meta, sr.res, so.Target, o.slo, gpus, d.unit(local != "")); werr != nil {
		return werr
	}
	base := sweepBase(o, sr.meta)
	if o.SaveResult {
		p, werr := saveJSON(o.ResultDir, base+".json", report.SweepResult(sr.meta, sr.res, so.Target, gpus, d.unit(local != ""), sr.probes))
		if werr != nil {
			return fmt.Errorf("save result: %w", werr)
		}
		fmt.Fprintf(stderr, "result: %s\n", p)
	}
	if dir := b.plotDir(); dir != "" {
		paths, werr := writeSweepPlots(dir, plotBase(o, base), sr.meta, []namedSweep{{name: o.Label, gpus: gpus, unit: d.unit(local != ""), res: sr.res}}, so.Target, o.slo)
		if werr != nil {
			return werr
		}
		for _, p := range paths {
			fmt.Fprintf(stderr, "plot: %s\n", p)
		}
	}
	return err
}

// sweepBase returns the file name stem of a sweep's outputs.
func sweepBase(o *benchOptions, m report.Meta) string {
	if o.ResultFilename != "" {
		return strings.TrimSuffix(o.ResultFilename, ".json")
	}
	label := m.Backend
	if o.Label != "" {
		label = o.Label
	}
	model := m.Model
	if i := strings.LastIndexByte(model, '/'); i >= 0 {
		model = model[i+1:]
	}
	return fmt.Sprintf("sweep-%s-%s-%s", label, model, m.Date)
}
