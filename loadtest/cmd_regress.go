package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/pdserve/pdserve/loadtest/report"
)

// errRegression is returned when regress finds a drift beyond its limit.
var errRegression = errors.New("regression")

// cmdRegress is `loadtest regress`: a run (or a saved result) against a
// baseline result.
func cmdRegress(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultBenchOptions()
	d := defaultDeployFlags()
	var (
		baseline, current, local, metricsSpec, stat string
		drift                                       report.Drift
		update                                      bool
	)
	fs := flag.NewFlagSet("regress", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, stderr, "regress --baseline FILE [--current FILE | --base-url URL | --local MODE] [flags]",
		"A run (or a saved result, --current) against a baseline result: exits 1 when a --regress-metrics\n"+
			"metric at --regress-stat got worse by more than --max-drift (and --drift-floor-ms);\n"+
			"--update-baseline writes the run as the new baseline instead.",
		"  go run ./loadtest regress --baseline loadtest/baselines/ci-sim-disagg.json --local disaggregated \\\n"+
			"    --profile a100-80g/opt-13b/tp1 --num-prompts 40 --request-rate 4\n")
	o.addFlags(fs)
	d.addFlags(fs)
	fs.StringVar(&baseline, "baseline", "", "baseline result JSON (required)")
	fs.StringVar(&current, "current", "", "compare this saved result instead of running")
	fs.StringVar(&local, "local", "", "start a local deployment for the run: colocated or disaggregated (default: use --base-url)")
	fs.StringVar(&metricsSpec, "regress-metrics", "ttft,tpot", "metrics to check: comma-separated ttft, tpot, itl, e2el, ttfo")
	fs.StringVar(&stat, "regress-stat", "p90", "statistic to check: mean, median or a percentile (p50, p90, 99, …)")
	fs.Float64Var(&drift.Max, "max-drift", 0.25, "largest allowed relative increase (0.25 = +25%)")
	fs.Float64Var(&drift.FloorMs, "drift-floor-ms", 2, "ignore changes smaller than this many milliseconds")
	fs.BoolVar(&drift.TwoSided, "two-sided", false, "also fail when a figure improves beyond --max-drift (stale baseline)")
	fs.BoolVar(&update, "update-baseline", false, "write the run's result to --baseline instead of checking")
	if err := parseFlags(fs, args, o); err != nil {
		return err
	}
	if baseline == "" {
		return fmt.Errorf("%w: --baseline is required", errUsage)
	}
	st, err := report.ParseStat(stat)
	if err != nil {
		return fmt.Errorf("%w: --regress-stat: %v", errUsage, err)
	}
	var checks []report.Check
	for _, m := range strings.Split(metricsSpec, ",") {
		if m = strings.TrimSpace(m); m != "" {
			checks = append(checks, report.Check{Metric: m, Stat: st})
		}
	}
	if len(checks) == 0 || !(drift.Max >= 0) {
		return fmt.Errorf("%w: --regress-metrics needs a metric and --max-drift must be ≥ 0", errUsage)
	}
	if current != "" && update {
		return fmt.Errorf("%w: --update-baseline needs a run, not --current", errUsage)
	}

	// The baseline is read (or its directory checked) before anything runs.
	var base map[string]any
	if update {
		if err := checkWritableDir(filepath.Dir(baseline)); err != nil {
			return fmt.Errorf("%w: --baseline: %v", errUsage, err)
		}
	} else if base, err = report.ReadResult(baseline); err != nil {
		return fmt.Errorf("%w: --baseline: %v", errUsage, err)
	}

	var cur map[string]any
	if current != "" {
		if cur, err = report.ReadResult(current); err != nil {
			return err
		}
	} else {
		res, err := regressRun(ctx, o, d, local, stderr)
		if err != nil {
			return err
		}
		if update {
			if err := os.MkdirAll(filepath.Dir(baseline), 0o755); err != nil {
				return err
			}
			p, err := saveJSON(filepath.Dir(baseline), filepath.Base(baseline), res)
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "baseline written: %s\n", p)
			return nil
		}
		data, err := json.Marshal(res)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(data, &cur); err != nil {
			return err
		}
	}
	findings, failed, err := report.Regress(base, cur, checks, drift)
	if err != nil {
		return err
	}
	if err := report.RegressMarkdown(stdout, baseline, findings, failed); err != nil {
		return err
	}
	if failed {
		return errRegression
	}
	return nil
}

// regressRun runs the workload once (on a local deployment when local is
// set) and returns its result object; the Markdown summary goes to stderr.
func regressRun(ctx context.Context, o *benchOptions, d *deployFlags, local string, stderr io.Writer) (report.Object, error) {
	url, facts, stop, err := d.startLocal(ctx, local, o.TimeScale, stderr)
	if err != nil {
		return nil, err
	}
	defer stop()
	b, err := newBench(ctx, o, url, stderr)
	if err != nil {
		return nil, err
	}
	defer b.cl.CloseIdle()
	out, err := b.run(ctx, o.RequestRate, "regress")
	if err != nil {
		return nil, err
	}
	if local != "" {
		out.meta.BaseURL = "local " + local // a loopback port differs per run
	}
	if err := report.Markdown(stderr, out.meta, out.sum); err != nil {
		return nil, err
	}
	res := report.Result(out.meta, out.sum, out.res.Outcomes, false)
	if facts != nil {
		res.Add("deployment", facts)
	}
	return res, nil
}
