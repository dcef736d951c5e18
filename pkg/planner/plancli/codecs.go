package plancli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner"
)

// Codecs is `coordinator codecs ARGS`: it runs the codec self-benchmark
// that the prefill workers run for --codec auto (pkg/kv/codec SelfBench)
// on this machine and prints each codec's ratio and per-core speeds, or
// with --out writes them as a codec profile for `coordinator plan
// --codec-profile FILE`. Run it on the machine whose CPUs will code KV (a
// node of the target cluster). Exit codes: 0 measured; 1 the benchmark or
// the write failed; 2 bad flags. host describes this machine for the
// profile (the coordinator passes profiler.HostInfo(1): the benchmark runs
// on one core).
func Codecs(ctx context.Context, args []string, stdout, stderr io.Writer, host perfmodel.Host) int {
	fs := flag.NewFlagSet("coordinator codecs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	budget := fs.Duration("budget", 5*time.Second, "time the benchmark takes in all (workers take "+codec.DefaultBenchBudget.String()+"; longer is steadier)")
	out := fs.String("out", "", "write the codec profile (JSON) to this file for `coordinator plan --codec-profile`")
	output := fs.String("output", "table", "what to print on stdout: table or json")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: coordinator codecs [--budget 5s] [--out FILE] [--output table|json]\n\n"+
			"Measures the KV codecs on this machine, one core, as the prefill workers do for --codec auto:\n"+
			"ratio and raw bytes/s encoded and decoded per core, on synthetic bf16 KV. Run it on a node of\n"+
			"the target cluster and plan with `coordinator plan --codec-profile FILE`.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := cliflags.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "coordinator codecs: --output %q: want table or json\n", *output)
		return 2
	}
	if *budget <= 0 {
		fmt.Fprintf(stderr, "coordinator codecs: --budget %v must be > 0\n", *budget)
		return 2
	}
	cmd := "coordinator codecs --budget " + budget.String()
	if *out != "" {
		cmd += " --out " + baseName(*out)
	}
	p, err := planner.MeasureCodecProfile(ctx, *budget, host, cmd)
	if err != nil {
		fmt.Fprintf(stderr, "coordinator codecs: %v\n", err)
		return 1
	}
	data, err := p.Marshal()
	if err != nil {
		fmt.Fprintf(stderr, "coordinator codecs: %v\n", err)
		return 1
	}
	if *out != "" {
		if err := os.WriteFile(*out, data, 0o644); err != nil {
			fmt.Fprintf(stderr, "coordinator codecs: %v\n", err)
			return 1
		}
	}
	if *output == "json" {
		_, err = stdout.Write(data)
	} else {
		err = writeCodecTable(stdout, p)
	}
	if err != nil {
		fmt.Fprintf(stderr, "coordinator codecs: %v\n", err)
		return 1
	}
	return 0
}

// baseName is name, or for an absolute path its last element, so that a
// profile does not record the directories of the machine that measured it.
func baseName(name string) string {
	if !filepath.IsAbs(name) {
		return name
	}
	return filepath.Base(name)
}

func writeCodecTable(w io.Writer, p *planner.CodecProfile) error {
	timing := "wall time"
	if p.CPUTime {
		timing = "thread CPU time"
	}
	if _, err := fmt.Fprintf(w, "codecs on %s (%d logical CPUs, %s/%s, %s), %s KV, one core's %s, %.3g s:\n",
		or(p.Hardware.CPU, "an unnamed CPU"), p.Hardware.LogicalCPUs, p.Hardware.OS, p.Hardware.Arch, p.GoVersion, p.DType, timing, p.BudgetS); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "CODEC\tLOSSLESS\tRATIO\tENCODE GB/s/core\tDECODE GB/s/core\n")
	for _, c := range p.Codecs {
		enc, dec := fmt.Sprintf("%.3g", c.EncodeBytesPerSec/1e9), fmt.Sprintf("%.3g", c.DecodeBytesPerSec/1e9)
		if c.Name == planner.CodecNone {
			enc, dec = "no CPU", "no CPU"
		}
		fmt.Fprintf(tw, "%s\t%v\t%.3f\t%s\t%s\n", c.Name, c.Lossless, c.Ratio, enc, dec)
	}
	return tw.Flush()
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
