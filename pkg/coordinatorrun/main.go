package coordinatorrun

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/logging"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner/plancli"
	"github.com/pdserve/pdserve/pkg/plannerhost"
	"github.com/pdserve/pdserve/pkg/profiler"
	"github.com/pdserve/pdserve/pkg/standalone"
)

// Subcommand is a mode of the coordinator binary other than serving,
// chosen by the first argument.
type Subcommand struct {
	Name    string
	Summary string
	// Run gets the arguments after the name; it returns the exit code.
	Run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// Subcommands returns the coordinator binary's subcommands.
func Subcommands() []Subcommand {
	return []Subcommand{
		{Name: "profiles", Summary: "print the performance-model profiles (GPU × model) the sim engine and the planner use",
			Run: tableCommand("profiles", "the performance-model profiles (GPU × model) the sim engine and the planner use", perfmodel.WriteProfiles)},
		{Name: "calibrate", Summary: "print the performance model's calibration report: model vs. source data points",
			Run: tableCommand("calibrate", "the performance model's calibration report: model vs. source data points", perfmodel.WriteCalibrationReport)},
		{Name: "plan", Summary: "size the prefill and decode pools offline for a workload and SLOs (plan --help)",
			Run: plancli.Run},
		{Name: "codecs", Summary: "measure the KV codecs on this machine and write a codec profile for plan --codec-profile (codecs --help)",
			Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
				return plancli.Codecs(ctx, args, stdout, stderr, profiler.HostInfo(1))
			}},
		{Name: "profile", Summary: "measure an engine (llama.cpp on a GGUF model) and write a profile for plan, sim and the planner (profile --help)",
			Run: profiler.Main},
		{Name: "keygen", Summary: "write an Ed25519 key pair for the per-call gRPC credentials: --grpc-signing-key and --grpc-verify-key (keygen --help)",
			Run: func(_ context.Context, args []string, stdout, stderr io.Writer) int {
				return Keygen(args, stdout, stderr)
			}},
		{Name: "secrets", Summary: "write a deployment's secrets, each worker's its own: mTLS certificates, NATS users, the gRPC key pair, the KV hash key (secrets --help)",
			Run: func(_ context.Context, args []string, stdout, stderr io.Writer) int {
				return Secrets(args, stdout, stderr)
			}},
		{Name: "hash-key", Summary: "read an API key on stdin and print its line for the --api-keys file (hash-key --help)",
			Run: func(_ context.Context, args []string, stdout, stderr io.Writer) int {
				return HashKey(args, os.Stdin, stdout, stderr)
			}},
	}
}

// tableCommand is a subcommand that takes no flags but --help and writes
// a table to stdout.
func tableCommand(name, summary string, write func(io.Writer) error) func(context.Context, []string, io.Writer, io.Writer) int {
	return func(_ context.Context, args []string, stdout, stderr io.Writer) int {
		fs := flag.NewFlagSet("coordinator "+name, flag.ContinueOnError)
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "Usage: coordinator %s\n\nPrints %s.\n", name, summary)
		}
		if code, ok := cliflags.Parse(fs, args, stdout, stderr); !ok {
			return code
		}
		if err := write(stdout); err != nil {
			fmt.Fprintf(stderr, "coordinator %s: %v\n", name, err)
			return 1
		}
		return 0
	}
}

// helpGroups are the sections of the coordinator's --help, by concern.
var helpGroups = []cliflags.Group{
	{Title: "OpenAI API (HTTP)", Flags: []string{"http-*", "max-body-bytes", "max-inflight-body-bytes",
		"retry-after", "model-name", "chat-template-file", "responses-*", "api-keys", "metrics-token-file", "auth-reload-interval", "shutdown-timeout"}},
	{Title: "Routing and serving", Flags: []string{"mode", "first-token-policy", "block-tokens", "kv-hash-key-file", "codec", "heartbeat-ttl", "policy",
		"worker-networks", "kv-index-*"}},
	{Title: "Standalone workers and their engine", Flags: []string{"standalone", "prefill-workers", "decode-workers", "elastic", "engine", "engine-threads",
		"preset", "profile", "seed", "time-scale", "payload-scale", "model", "ctx-size", "gpu-layers", "kv-type", "max-seqs", "llama-*", "no-repack"}},
	{Title: "NATS (control plane)", Flags: []string{"nats-*"}},
	{Title: "gRPC between components (TLS, credentials, keepalive)", Flags: []string{"tls-*", "grpc-*"}},
	{Title: "Regions (federation over NATS gateways, forwarding over mutual TLS)", Flags: []string{"region", "region-*"}},
	{Title: "Planner", Flags: []string{"planner*", "link-gbps", "gpu-budget"}},
	{Title: "Deprecated: settings of the policy file (--policy), kept for one release", Flags: []string{"max-tokens-cap", "max-admitted-requests",
		"queue-limit", "local-prefill-tokens", "response-cache-*", "gpu-cost-per-hour"}},
	{Title: "Tracing (OpenTelemetry)", Flags: []string{"otel-*"}},
	{Title: "Logging and version", Flags: []string{"log-level", "version"}},
}

// Main is the whole coordinator binary after signal handling (except
// SIGHUP: with an API key or metrics token file configured Main catches
// it, and it reloads the files). args are the arguments without the
// program name: a subcommand name and its arguments, or the serve flags.
// --help and --version print to stdout; errors before the logger exists
// go to stderr, one line per problem (cliflags.PrintError). A former flag
// of a policy setting (coordinator.PolicyFlags: --max-admitted-requests,
// --gpu-cost-per-hour, …) sets that setting over the policy file, with
// one warning logged at start. It returns the exit code: 0 after a clean
// stop, --help or --version, 2 for bad flags, settings or policy file, 1
// when serving failed.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return mainWith(ctx, args, stdout, stderr, logging.New)
}

// mainWith is Main with the logger newLogger builds for the log level.
func mainWith(ctx context.Context, args []string, stdout, stderr io.Writer, newLogger func(level string) (*zap.Logger, error)) int {
	subs := Subcommands()
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		for _, s := range subs {
			if s.Name == args[0] {
				return s.Run(ctx, args[1:], stdout, stderr)
			}
		}
		fmt.Fprintf(stderr, "coordinator: unknown subcommand %q (run with --help)\n", args[0])
		return 2
	}

	o := coordinator.DefaultOptions()
	po := plannerhost.DefaultOptions()
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.AddFlags(fs)
	po.AddFlags(fs)
	cliflags.AddVersion(fs)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: coordinator [flags]\n       coordinator SUBCOMMAND\n\n"+
			"Serves the OpenAI-compatible API of pdserve and routes requests to prefill and\n"+
			"decode workers found through NATS heartbeats. --standalone also runs the workers\n"+
			"in this process.\n\nSubcommands:\n")
		for _, s := range subs {
			fmt.Fprintf(w, "  %-10s %s\n", s.Name, s.Summary)
		}
		fmt.Fprintln(w)
		cliflags.PrintGroups(w, fs, helpGroups)
	}
	if code, ok := cliflags.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	o.SetFlags(fs)
	if err := o.Complete(); err != nil {
		cliflags.PrintError(stderr, "coordinator", err)
		return 2
	}
	if err := errors.Join(o.Validate(), po.Validate(o)); err != nil {
		cliflags.PrintError(stderr, "coordinator", err)
		return 2
	}
	log, err := newLogger(o.LogLevel)
	if err != nil {
		cliflags.PrintError(stderr, "coordinator", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	for _, r := range cliflags.RenamedGiven(fs) {
		log.Warn(r.Deprecation())
	}
	for _, f := range coordinator.PolicyFlagsGiven(fs) {
		log.Warn(f.Deprecation())
	}
	log.Info("effective configuration", append(o.LogFields(), po.LogFields(o)...)...)
	if a := o.Policy.Auth; (a.APIKeysFile != "" || a.MetricsTokenFile != "") && o.Auth.ReloadSignals == nil {
		// SIGHUP reloads the auth files. Only then: otherwise it stops
		// the coordinator as it always did (a closed terminal).
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		o.Auth.ReloadSignals = hup
	}
	host, err := plannerhost.New(po, o, log)
	if err != nil {
		log.Error("coordinator failed", zap.Error(err))
		return 1
	}
	if host != nil {
		o.Extensions = append(o.Extensions, host)
	}
	run := coordinator.Run
	if o.Standalone {
		run = func(ctx context.Context, o coordinator.Options, log *zap.Logger) error {
			return standalone.Run(ctx, o, log)
		}
	}
	if err := run(ctx, o, log); err != nil {
		log.Error("coordinator failed", zap.Error(err))
		return 1
	}
	return 0
}
