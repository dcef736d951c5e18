// Command gpucheck measures the llamacpp engine served standalone,
// disaggregated then colocated, and profiles it (package
// internal/gpucheck): the measuring half of scripts/gpu-check.sh, built
// static into `make gpu-bundle` for GPU nodes without Go. Run it with
// --help for its flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pdserve/pdserve/internal/gpucheck"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return main1(ctx, os.Args[1:], os.Stdout, os.Stderr)
}

func main1(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpucheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := gpucheck.Options{Meta: map[string]string{}}
	var deadline int64
	var modes, prompts, batches, engineArgs string
	fs.StringVar(&o.Coordinator, "coordinator", "", "coordinator binary (required)")
	fs.StringVar(&o.Model, "model", "", "GGUF model file (required)")
	fs.StringVar(&o.LlamaLib, "llama-lib", "", "directory of llama.cpp's shared libraries (required)")
	fs.StringVar(&o.Out, "out", "", "directory for gpucheck.json, profile.json and the logs (required)")
	fs.Int64Var(&deadline, "deadline", 0, "Unix time in seconds by which gpucheck returns (required); steps that would not finish are skipped and named")
	fs.StringVar(&modes, "modes", "disaggregated,colocated", "serving modes, in order")
	fs.StringVar(&prompts, "prompt-tokens", "512,2048,8192", "prompt lengths whose TTFT is measured")
	fs.StringVar(&batches, "batches", "1,16,64", "decode batch sizes measured")
	fs.IntVar(&o.TTFTOutputTokens, "ttft-output-tokens", 16, "max_tokens of a TTFT request (its greedy text is compared across modes)")
	fs.IntVar(&o.DecodeTokens, "decode-tokens", 64, "max_tokens of a decode request")
	fs.IntVar(&o.DecodePromptTokens, "decode-prompt-tokens", 128, "prompt length of a decode request")
	fs.IntVar(&o.CtxSize, "ctx-size", 32768, "the engine's --ctx-size")
	fs.IntVar(&o.MaxSeqs, "max-seqs", 64, "the engine's --max-seqs")
	fs.DurationVar(&o.ProfileBudget, "profile-budget", 90*time.Second, "coordinator profile's --budget, cut to the time left (0: no profile)")
	fs.DurationVar(&o.LoadTimeout, "load-timeout", 3*time.Minute, "longest wait for a server to load the model and get ready")
	fs.StringVar(&engineArgs, "engine-args", "", "extra engine flags for every coordinator run, space-separated (e.g. \"--no-repack --engine-threads 2\")")
	fs.Func("meta", "KEY=VALUE copied into the report's meta (repeatable)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE, got %q", s)
		}
		o.Meta[k] = v
		return nil
	})
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gpucheck: unexpected arguments %q\n", fs.Args())
		return 2
	}
	var err error
	if o.PromptTokens, err = gpucheck.ParseInts(prompts); err != nil {
		fmt.Fprintf(stderr, "gpucheck: --prompt-tokens: %v\n", err)
		return 2
	}
	if o.Batches, err = gpucheck.ParseInts(batches); err != nil {
		fmt.Fprintf(stderr, "gpucheck: --batches: %v\n", err)
		return 2
	}
	for _, m := range strings.Split(modes, ",") {
		if m = strings.TrimSpace(m); m != "" {
			o.Modes = append(o.Modes, m)
		}
	}
	o.EngineArgs = strings.Fields(engineArgs)
	if deadline > 0 {
		o.Deadline = time.Unix(deadline, 0)
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "gpucheck: %s, modes %v, prompts %v, batches %v, until %s (%s left)\n", o.Model, o.Modes, o.PromptTokens, o.Batches,
		o.Deadline.UTC().Format(time.RFC3339), time.Until(o.Deadline).Round(time.Second))
	r, err := gpucheck.Run(ctx, o)
	if r != nil {
		summary(stdout, r)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	return 0
}

// summary prints the report's figures as lines a person reads.
func summary(w io.Writer, r *gpucheck.Report) {
	for _, m := range r.Modes {
		fmt.Fprintf(w, "%s: loaded in %.1f s\n", m.Mode, m.LoadMs/1000)
		for _, p := range m.TTFT {
			fmt.Fprintf(w, "  TTFT %6d tokens: client %8.1f ms, budget %8.1f ms (prefill %.1f, kv transfer %.1f ms, %d B raw, %d B wire, %s)\n",
				p.PromptTokens, p.ClientTTFTMs, p.Budget.TTFTMs, p.Budget.PrefillMs, p.Budget.KVTransferMs, p.Budget.KVBytesRaw, p.Budget.KVBytesWire, p.Budget.Codec)
		}
		for _, d := range m.Decode {
			fmt.Fprintf(w, "  decode batch %3d: %8.1f tok/s aggregate, %6.1f tok/s per sequence (mean batch %.1f)\n", d.Batch, d.AggregateTokS, d.PerSeqTokS, d.MeanBatchSize)
		}
		for _, e := range m.Errors {
			fmt.Fprintf(w, "  error: %s\n", e)
		}
	}
	if r.GreedyMatch != nil {
		fmt.Fprintf(w, "greedy text the same in every mode: %s (%d prompts)\n", strconv.FormatBool(*r.GreedyMatch), r.GreedyCompared)
	}
	if r.Profile.Path != "" {
		fmt.Fprintf(w, "profile: %s (%.0f s)\n", r.Profile.Path, r.Profile.WallMs/1000)
	} else if r.Profile.Error != "" {
		fmt.Fprintf(w, "profile: %s\n", r.Profile.Error)
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "skipped: %s\n", s)
	}
	fmt.Fprintf(w, "gpucheck: done in %.1f s\n", r.WallMs/1000)
}
