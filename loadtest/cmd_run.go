package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/pdserve/pdserve/loadtest/report"
)

// cmdRun is `loadtest run`: one benchmark run.
func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultBenchOptions()
	d := defaultDeployFlags()
	var local string
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, stderr, "run [--base-url URL | --local MODE] [flags]",
		"One benchmark run against an OpenAI-compatible endpoint (pdserve, vLLM, SGLang), or against a\n"+
			"deployment started here on the performance-model engine (--local): a Markdown summary on\n"+
			"stdout with vLLM's metric definitions and pdserve's server-side budget, and with --save-result\n"+
			"the result JSON (vLLM's field names) and TTFT/TPOT CDF plots.",
		"  go run ./loadtest run --base-url http://127.0.0.1:8080 --dataset-name random \\\n"+
			"    --random-input-len 512 --random-output-len 64 --num-prompts 200 --request-rate 4 \\\n"+
			"    --goodput ttft:250 tpot:100 --save-result --result-filename /tmp/run.json\n")
	o.addFlags(fs)
	d.addFlags(fs)
	fs.StringVar(&local, "local", "", "start a local deployment for the run: colocated or disaggregated (default: use --base-url)")
	if err := parseFlags(fs, args, o); err != nil {
		return err
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
	out, runErr := b.run(ctx, o.RequestRate, "run")
	if len(out.res.Outcomes) == 0 && runErr != nil {
		return runErr
	}
	if err := report.Markdown(stdout, out.meta, out.sum); err != nil {
		return err
	}
	if err := b.saveRun(out, stderr); err != nil {
		return err
	}
	return runErr
}

// saveRun writes the result JSON and plots of a run when asked.
func (b *bench) saveRun(out runOut, stderr io.Writer) error {
	o := b.o
	name := o.ResultFilename
	if name == "" {
		name = report.DefaultFilename(out.meta)
	}
	if o.SaveResult {
		p, err := saveJSON(o.ResultDir, name, report.Result(out.meta, out.sum, out.res.Outcomes, o.SaveDetailed))
		if err != nil {
			return fmt.Errorf("save result: %w", err)
		}
		fmt.Fprintf(stderr, "result: %s\n", p)
	}
	dir := b.plotDir()
	if dir == "" {
		return nil
	}
	base := strings.TrimSuffix(name, ".json")
	paths, err := writeCDFPlots(dir, plotBase(b.o, base), out.meta, b.o.slo, []namedRun{{name: "", out: out}})
	if err != nil {
		return err
	}
	for _, p := range paths {
		fmt.Fprintf(stderr, "plot: %s\n", p)
	}
	return nil
}

// plotDir returns where plots go, or "" for none.
func (b *bench) plotDir() string {
	return plotDir(b.o)
}

// plotBase is the file name stem of the plots of outputs named base: in
// --plot-dir when given, else beside the result (base under --result-dir,
// or an absolute --result-filename's directory).
func plotBase(o *benchOptions, base string) string {
	if o.PlotDir != "" {
		return filepath.Base(base)
	}
	return base
}

// plotDir returns where plots go, or "" for none.
func plotDir(o *benchOptions) string {
	switch {
	case o.NoPlots:
		return ""
	case o.PlotDir != "":
		return o.PlotDir
	case o.SaveResult:
		return o.ResultDir
	}
	return ""
}
