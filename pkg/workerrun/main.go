package workerrun

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/logging"
)

// helpGroups are the sections of a worker's --help, by concern.
var helpGroups = []cliflags.Group{
	{Title: "Worker", Flags: []string{"id", "role", "grpc-addr", "advertise-addr", "metrics-addr", "heartbeat-interval", "drain-timeout", "config"}},
	{Title: "Engine", Flags: []string{"engine", "engine-threads", "preset", "profile", "seed", "time-scale", "payload-scale", "model",
		"ctx-size", "gpu-layers", "kv-type", "max-seqs", "llama-*", "no-repack"}},
	{Title: "KV, batching and transfer", Flags: []string{"block-tokens", "kv-blocks", "max-batch", "chunk-tokens", "max-batch-tokens",
		"reserve-ttl", "max-reservations-per-caller", "max-reserved-tokens-per-caller", "max-outbox-bytes", "stream-write-timeout",
		"prefix-cache-*", "codec", "queue-limit", "retain-*", "max-live-kv-bytes", "kv-conns", "link-gbps"}},
	{Title: "NATS (control plane)", Flags: []string{"nats-*", "kv-events", "kv-snapshot-interval"}},
	{Title: "gRPC between components (TLS, credentials, keepalive)", Flags: []string{"tls-*", "grpc-*"}},
	{Title: "Tracing (OpenTelemetry)", Flags: []string{"otel-*"}},
	{Title: "Logging and version", Flags: []string{"log-level", "version"}},
}

// Main is the whole of a worker binary after signal handling: parse args
// into o's flags (and --config), validate, log the effective settings, run
// until ctx ends, stop gracefully. name is the binary's name (for --help);
// --help and --version print to stdout, errors before the logger exists go
// to stderr (one line per problem, see cliflags.PrintError). It returns
// the process exit code: 0 after a clean stop, --help or --version, 2 for
// bad flags or settings, 1 when the worker failed.
func Main(ctx context.Context, name string, o Options, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.AddFlags(fs)
	cliflags.AddVersion(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s [flags]\n\nRuns a pdserve %s worker.\n\n", name, o.Role)
		cliflags.PrintGroups(fs.Output(), fs, helpGroups)
	}
	if code, ok := cliflags.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if o.ConfigFile != "" {
		if err := ApplyConfigFile(fs, o.ConfigFile); err != nil {
			cliflags.PrintError(stderr, name, err)
			return 2
		}
	}
	if err := o.Validate(); err != nil {
		cliflags.PrintError(stderr, name, err)
		return 2
	}
	logger, err := logging.New(o.LogLevel)
	if err != nil {
		cliflags.PrintError(stderr, name, err)
		return 2
	}
	defer func() { _ = logger.Sync() }()
	logger.Info("effective configuration", o.LogFields()...)
	if err := Run(ctx, o, logger, nil); err != nil {
		// A GPU worker on a node without one: one plain line, no trace.
		if ng := (*llamacpp.NoGPUError)(nil); errors.As(err, &ng) {
			fmt.Fprintf(stderr, "%s: %v\n", name, ng)
			return 1
		}
		logger.Error("worker failed", zap.Error(err))
		return 1
	}
	return 0
}

// ApplyConfigFile sets the flags of fs from the YAML mapping in path: each
// key is a flag name (without dashes) and each value a scalar in the flag's
// syntax ("1s", 512, "zstd"). Flags already set on the command line keep
// their values. Errors, each naming the file ("--config FILE: …"; several
// joined with errors.Join): unreadable file, not a mapping of scalars,
// unknown flag, bad value.
func ApplyConfigFile(fs *flag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return cliflags.BadFlag("config", path, err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		return cliflags.BadFlag("config", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	for k, v := range m {
		k = strings.TrimLeft(k, "-")
		if fs.Lookup(k) == nil {
			errs = append(errs, fmt.Errorf("unknown flag %q", k))
			continue
		}
		switch v.(type) {
		case map[string]any, []any:
			errs = append(errs, fmt.Errorf("flag %q: value must be a scalar", k))
			continue
		}
		if k == "config" || set[k] {
			continue
		}
		if err := fs.Set(k, fmt.Sprint(v)); err != nil {
			errs = append(errs, fmt.Errorf("flag %q: %w", k, err))
		}
	}
	for i, err := range errs {
		errs[i] = cliflags.BadFlag("config", path, err)
	}
	return errors.Join(errs...)
}
