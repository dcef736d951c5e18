package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/loadtest/deploy"
	"github.com/pdserve/pdserve/pkg/workload"
)

func main() {
	deploy.RunChild() // a worker process of a local llama.cpp deployment
	regionsChild()    // a load client of the regions command
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: go run ./loadtest COMMAND [flags]

Commands:
  run       one benchmark run against an OpenAI-compatible endpoint
  sweep     runs over a series of request rates: SLO attainment curve and the
            highest rate meeting the attainment target
  compare   disaggregated vs colocated at equal GPUs (started locally on the
            performance-model engine, or given by URL), side by side
  regress   a run (or a saved result) against a baseline result; exits 1 when
            TTFT or TPOT at the chosen statistic drifts beyond the limit
  check     one completion, its reply checked (the chart's helm test)
  prefix-hits
            a Mooncake trace's prefix-cache hit ratio with its requests spread
            over tenants whose caches are apart (offline, no server)
  agentloop concurrent agent loops, one tool call per turn: continued over the
            Responses API's WebSocket vs the whole conversation resent over HTTP
  shift     a trace whose mix moves half-way on local sim deployments: the best
            fixed splits, the planner replacing pods, elastic roles (goodput
            and attainment per minute)
  regions   three federated regions in network namespaces over netem-shaped
            links, with and without federation, under faults (needs root)

Run "go run ./loadtest COMMAND -h" for a command's flags, "--version" for the
version. See loadtest/README.md.
`

// Exit codes.
const (
	exitOK        = 0
	exitFail      = 1 // the run failed, or regress found a regression
	exitUsage     = 2 // bad flags
	exitInterrupt = 130
)

// run executes a command and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, rest := args[0], joinNargs(args[1:]); cmd {
	case "run":
		err = cmdRun(ctx, rest, stdout, stderr)
	case "sweep":
		err = cmdSweep(ctx, rest, stdout, stderr)
	case "compare":
		err = cmdCompare(ctx, rest, stdout, stderr)
	case "regress":
		err = cmdRegress(ctx, rest, stdout, stderr)
	case "check":
		err = cmdCheck(ctx, rest, stdout, stderr)
	case "prefix-hits":
		err = cmdPrefixHits(ctx, rest, stdout, stderr)
	case "agentloop":
		err = cmdAgentLoop(ctx, rest, stdout, stderr)
	case "regions":
		err = cmdRegions(ctx, rest, stdout, stderr)
	case "shift":
		err = cmdShift(ctx, rest, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "-version", "--version", "version":
		fmt.Fprintln(stdout, cliflags.Version("loadtest"))
		return exitOK
	default:
		fmt.Fprintf(stderr, "loadtest: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errUsage), errors.Is(err, workload.ErrBadOption):
		fmt.Fprintf(stderr, "loadtest: %v\n", err)
		return exitUsage
	case errors.Is(err, errRegression):
		return exitFail
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "loadtest: interrupted: %v\n", err)
		return exitInterrupt
	default:
		fmt.Fprintf(stderr, "loadtest: %v\n", err)
		return exitFail
	}
}

// setUsage makes fs's -help print the command's synopsis, what it does,
// examples and then its flags.
func setUsage(fs *flag.FlagSet, w io.Writer, synopsis, about, examples string) {
	fs.Usage = func() {
		fmt.Fprintf(w, "Usage: go run ./loadtest %s\n\n%s\n\nExamples:\n%s\nFlags:\n", synopsis, about, examples)
		fs.PrintDefaults()
	}
}

// parseFlags parses args into fs and completes the shared options. Flag
// errors are usage errors.
func parseFlags(fs *flag.FlagSet, args []string, o *benchOptions) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if o == nil {
		return nil
	}
	if err := o.complete(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}
