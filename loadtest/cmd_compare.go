package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/loadtest/deploy"
	"github.com/pdserve/pdserve/loadtest/report"
	"github.com/pdserve/pdserve/pkg/enginecfg"
)

// compareOptions are compare's own flags.
type compareOptions struct {
	DisaggURL, ColocURL   string
	DisaggGPUs, ColocGPUs int
	DisaggDesc, ColocDesc string
	CommonRate            float64
}

// sideRun is one side of a comparison after its search.
type sideRun struct {
	side   report.Side
	sweep  sweepRun
	at     *runOut
	meta   report.Meta
	probes []report.Object
}

// cmdCompare is `loadtest compare`: the same workload and SLOs on a
// disaggregated and a colocated deployment of equal GPU count.
func cmdCompare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultBenchOptions()
	so := defaultSweepOptions()
	d := defaultDeployFlags()
	co := &compareOptions{}
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, stderr, "compare [--disagg-url URL --coloc-url URL] --gpus N --request-rates R1,R2,... [flags]",
		"Disaggregated vs colocated serving at equal GPUs: the same workload and SLOs swept over request\n"+
			"rates on both, each side's highest rate meeting the attainment target, and the two side by\n"+
			"side at --compare-rate. Without --disagg-url and --coloc-url both deployments are started here\n"+
			"on the performance-model engine (--profile; --pd-split P:D of the --gpus on the disaggregated\n"+
			"side, --codec and --link-gbps for its KV transfer; --pd-split auto: the split the planner predicts\n"+
			"serves the workload best, prefix hits counted), or on llama.cpp (--engine llamacpp\n"+
			"--model-file FILE.gguf): each worker a process pinned to its cores (--cpus), the disaggregated\n"+
			"workers splitting them, one colocated worker on all of them; rates per core. Each side's\n"+
			"crossing of --attainment is bisected until it is known within --rate-tolerance.",
		"  # 2 prefill + 1 decode vs 3 colocated workers, OPT-13B on A100-80GB, both started here:\n"+
			"  go run ./loadtest compare --profile a100-80g/opt-13b/tp1 --gpus 3 --pd-split 2:1 --codec zstd \\\n"+
			"    --link-gbps 100 --request-rates 1,2,3,4 --goodput ttft:250 tpot:100 --save-result\n"+
			"  # 1 prefill + 1 decode worker each on a core of its own vs one colocated worker on both:\n"+
			"  go run ./loadtest compare --engine llamacpp --model-file tiny.gguf --cpus 0,1 --pd-split 1:1 \\\n"+
			"    --request-rates 0.5,1 --num-prompts 20 --goodput ttft:2500 tpot:150\n"+
			"  # Two deployments already running:\n"+
			"  go run ./loadtest compare --disagg-url http://10.0.0.1:8080 --coloc-url http://10.0.0.2:8080 \\\n"+
			"    --gpus 8 --request-rates 2,4,8 --goodput ttft:500 tpot:50\n")
	o.addFlags(fs)
	so.addFlags(fs)
	d.addFlags(fs)
	fs.StringVar(&co.DisaggURL, "disagg-url", "", "target an existing disaggregated deployment at this base URL instead of starting one")
	fs.StringVar(&co.ColocURL, "coloc-url", "", "target an existing colocated deployment at this base URL instead of starting one")
	fs.IntVar(&co.DisaggGPUs, "disagg-gpus", 0, "GPUs of the --disagg-url deployment (default --gpus)")
	fs.IntVar(&co.ColocGPUs, "coloc-gpus", 0, "GPUs of the --coloc-url deployment (default --gpus)")
	fs.StringVar(&co.DisaggDesc, "disagg-desc", "", "what the --disagg-url deployment runs (profile, P:D, codec, link), for the report")
	fs.StringVar(&co.ColocDesc, "coloc-desc", "", "what the --coloc-url deployment runs (profile, step budget), for the report")
	fs.Float64Var(&co.CommonRate, "compare-rate", 0, "rate (req/s) at which both sides are shown side by side (0: the colocated side's max rate)")
	if err := parseFlags(fs, args, o); err != nil {
		return err
	}
	if err := so.complete(o); err != nil {
		return err
	}
	if err := d.checkUnit(); err != nil {
		return err
	}
	gpusSet := false
	fs.Visit(func(f *flag.Flag) { gpusSet = gpusSet || f.Name == "gpus" })
	if d.Engine == enginecfg.Llama && d.CPUs != "" && !gpusSet {
		cpus, err := parseCPUs(d.CPUs)
		if err != nil {
			return err
		}
		d.GPUs = len(cpus) // --gpus counts the cores
	}
	if co.DisaggGPUs == 0 {
		co.DisaggGPUs = d.GPUs
	}
	if co.ColocGPUs == 0 {
		co.ColocGPUs = d.GPUs
	}
	if co.DisaggGPUs != co.ColocGPUs {
		fmt.Fprintf(stderr, "warning: the sides have different GPU counts (%d vs %d); compare the per-GPU figures\n", co.DisaggGPUs, co.ColocGPUs)
	}
	log, closeLog, err := d.logger()
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	defer closeLog()

	type sideDef struct {
		name, mode, url, desc string
		gpus                  int
	}
	// Colocated first: its max rate is the default common rate.
	defs := []sideDef{
		{name: "colocated", mode: deploy.Colocated, url: co.ColocURL, desc: co.ColocDesc, gpus: co.ColocGPUs},
		{name: "disaggregated", mode: deploy.Disaggregated, url: co.DisaggURL, desc: co.DisaggDesc, gpus: co.DisaggGPUs},
	}
	// The split (the planner's with auto) and both local specs are
	// settled before anything starts.
	split, err := splitChoice(ctx, d, o, so.Target, co.DisaggURL)
	if err != nil {
		return err
	}
	if split != nil {
		fmt.Fprintf(stderr, "%s\n", split.Text())
	}
	specs := map[string]deploy.Spec{}
	for _, sd := range defs {
		if sd.url != "" {
			continue
		}
		s, err := d.spec(sd.mode, o.TimeScale)
		if err != nil {
			return err
		}
		if _, err := s.Options(); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		specs[sd.name] = s
	}

	common := co.CommonRate
	var sides []sideRun
	for _, sd := range defs {
		sr, err := compareSide(ctx, o, so, sd.name, sd.mode, sd.url, sd.desc, report.Count(sd.gpus, d.unit(sd.url == "")), sd.gpus, specs[sd.name], log, &common, stderr)
		if err != nil {
			return fmt.Errorf("%s side: %w", sd.name, err)
		}
		sr.side.Unit = d.unit(sd.url == "")
		if sd.url == "" && specs[sd.name].Engine == "sim" {
			sr.side.Profile = specs[sd.name].Profile
		}
		sides = append(sides, sr)
	}

	// Report disaggregated first.
	sides[0], sides[1] = sides[1], sides[0]
	meta := sides[0].meta
	meta.Arrival = arrivalKind(o)
	cmp := report.Comparison{Meta: meta, Target: so.Target, SLO: o.slo, CommonRate: common, Split: split}
	var probes [][]report.Object
	var ats []report.Object
	var cdfRuns []namedRun
	var sw []namedSweep
	for _, s := range sides {
		cmp.Sides = append(cmp.Sides, s.side)
		probes = append(probes, s.probes)
		var at report.Object
		if s.at != nil {
			at = report.Result(s.at.meta, s.at.sum, s.at.res.Outcomes, o.SaveDetailed)
			cdfRuns = append(cdfRuns, namedRun{name: s.side.Name, out: *s.at})
		}
		ats = append(ats, at)
		sw = append(sw, namedSweep{name: s.side.Name, gpus: s.side.GPUs, unit: s.side.Unit, res: s.side.Sweep})
	}
	if err := cmp.Markdown(stdout); err != nil {
		return err
	}
	base := compareBase(o, cmp.Meta)
	if o.SaveResult {
		p, err := saveJSON(o.ResultDir, base+".json", cmp.Result(probes, ats))
		if err != nil {
			return fmt.Errorf("save result: %w", err)
		}
		fmt.Fprintf(stderr, "result: %s\n", p)
	}
	if dir := plotDir(o); dir != "" {
		paths, err := writeSweepPlots(dir, plotBase(o, base), cmp.Meta, sw, so.Target, o.slo)
		if err != nil {
			return err
		}
		if len(cdfRuns) > 0 {
			more, err := writeCDFPlots(dir, plotBase(o, base), cdfRuns[0].out.meta, o.slo, cdfRuns)
			if err != nil {
				return err
			}
			paths = append(paths, more...)
		}
		for _, p := range paths {
			fmt.Fprintf(stderr, "plot: %s\n", p)
		}
	}
	return nil
}

// compareSide searches one side (starting it locally when url is empty)
// and runs it at the common rate, which it sets from this side's max rate
// when still 0.
func compareSide(ctx context.Context, o *benchOptions, so *sweepOptions, name, mode, url, desc, count string, gpus int,
	spec deploy.Spec, log *zap.Logger, common *float64, stderr io.Writer) (sideRun, error) {
	out := sideRun{side: report.Side{Name: name, GPUs: gpus}}
	if url == "" {
		fmt.Fprintf(stderr, "starting the local %s deployment (%s)\n", name, count)
		l, err := deploy.Start(ctx, spec, log)
		if err != nil {
			return out, err
		}
		defer l.Close(context.Background())
		url = l.URL()
		out.side.Facts = spec.Facts()
	} else {
		out.side.Facts.Add("deployment", nonEmptyStr(desc, "given by URL "+url))
	}
	b, err := newBench(ctx, o, url, stderr)
	if err != nil {
		return out, err
	}
	defer b.cl.CloseIdle()
	sr, err := b.search(ctx, so, name)
	if err != nil {
		return out, err
	}
	out.sweep, out.side.Sweep, out.meta, out.probes = sr, sr.res, sr.meta, sr.probes
	if *common == 0 {
		*common = sr.res.MaxRate
		if *common == 0 && len(sr.res.Points) > 0 {
			*common = sr.res.Points[0].Rate
		}
	}
	if r, ok := sr.runs[*common]; ok {
		out.at = &r
	} else if *common > 0 {
		r, err := b.run(ctx, *common, fmt.Sprintf("%s at %.3g req/s", name, *common))
		if err != nil {
			return out, err
		}
		out.at = &r
	}
	if out.at != nil {
		out.side.At = &out.at.sum
		if out.at.sum.Budget != nil {
			for _, k := range []string{"codec", "first_token_policy", "mode"} {
				if v := out.at.sum.Budget.Label(k); v != "" {
					out.side.Facts.Add("server reports "+strings.ReplaceAll(k, "_", " "), v)
				}
			}
		}
	}
	return out, nil
}

func nonEmptyStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// compareBase returns the file name stem of a comparison's outputs.
func compareBase(o *benchOptions, m report.Meta) string {
	if o.ResultFilename != "" {
		return strings.TrimSuffix(o.ResultFilename, ".json")
	}
	label := "compare"
	if o.Label != "" {
		label = "compare-" + o.Label
	}
	return fmt.Sprintf("%s-%s-%s", label, o.DatasetName, m.Date)
}
