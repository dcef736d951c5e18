package workerrun

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/logging"
)

// helpGroups are the sections of a worker's --help, by concern.
var helpGroups = []cliflags.Group{
	{Title: "Worker", Flags: []string{"id", "role", "grpc-addr", "advertise-addr", "metrics-addr", "heartbeat-interval", "drain-timeout", "elastic", "flags-file"}},
	{Title: "Engine", Flags: []string{"engine", "engine-threads", "preset", "profile", "seed", "time-scale", "payload-scale", "model",
		"ctx-size", "gpu-layers", "kv-type", "max-seqs", "llama-*", "no-repack"}},
	{Title: "KV, batching and transfer", Flags: []string{"block-tokens", "kv-blocks", "max-batch", "chunk-tokens", "max-batch-tokens",
		"reserve-ttl", "max-reservations-per-caller", "max-reserved-tokens-per-caller", "max-outbox-bytes", "stream-write-timeout",
		"prefix-cache-*", "host-cache-*", "disk-cache-*", "codec", "max-live-prefills", "retain-*", "max-live-kv-bytes", "kv-conns", "pace-gbps", "peer-link-gbps", "peer-pull-verify-blocks", "kv-hash-key-file"}},
	{Title: "NATS (control plane)", Flags: []string{"nats-*", "kv-events", "kv-snapshot-interval"}},
	{Title: "gRPC between components (TLS, credentials, keepalive)", Flags: []string{"tls-*", "grpc-*"}},
	{Title: "Tracing (OpenTelemetry)", Flags: []string{"otel-*"}},
	{Title: "Logging and version", Flags: []string{"log-level", "version"}},
}

// Main is the whole of a worker binary after signal handling: parse args
// into o's flags (and --flags-file), validate, log the effective settings,
// run until ctx ends, stop gracefully. A former name of a flag (see
// Options.AddFlags), on the command line or in the flags file, works as
// its flag does, with one warning logged at start. name is the binary's
// name (for --help); --help and --version print to stdout, errors before
// the logger exists go to stderr (one line per problem, see
// cliflags.PrintError). It returns
// the process exit code: 0 after a clean stop, --help or --version, 2 for
// bad flags or settings, 1 when the worker failed.
func Main(ctx context.Context, name string, o Options, args []string, stdout, stderr io.Writer) int {
	return mainWith(ctx, name, o, args, stdout, stderr, logging.New)
}

// mainWith is Main with the logger newLogger builds for the log level.
func mainWith(ctx context.Context, name string, o Options, args []string, stdout, stderr io.Writer, newLogger func(level string) (*zap.Logger, error)) int {
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
	renamed := cliflags.RenamedGiven(fs)
	var fileRenamed []cliflags.Renamed
	if o.FlagsFile != "" {
		var err error
		if fileRenamed, err = ApplyFlagsFile(fs, o.FlagsFile); err != nil {
			cliflags.PrintError(stderr, name, err)
			return 2
		}
	}
	if err := o.Validate(); err != nil {
		cliflags.PrintError(stderr, name, err)
		return 2
	}
	logger, err := newLogger(o.LogLevel)
	if err != nil {
		cliflags.PrintError(stderr, name, err)
		return 2
	}
	defer func() { _ = logger.Sync() }()
	for _, r := range renamed {
		logger.Warn(r.Deprecation())
	}
	for _, r := range fileRenamed {
		logger.Warn(r.Deprecation(), zap.String("flags_file", o.FlagsFile))
	}
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

// ApplyFlagsFile sets the flags of fs from the YAML mapping in path: each
// key is a flag name (without dashes), a former name too (see
// cliflags.AddRenamed), and each value a scalar in the flag's syntax
// ("1s", 512, "zstd"). Flags already set on the command line, under either
// name, keep their values. It returns the former names the file used,
// sorted, for their deprecation warnings. Errors, each naming the file
// ("--flags-file FILE: …"; several joined with errors.Join, in the order
// of the keys): unreadable file, not a mapping of scalars, unknown flag, a
// former name and its flag both given with different values, bad value.
func ApplyFlagsFile(fs *flag.FlagSet, path string) (renamed []cliflags.Renamed, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, cliflags.BadFlag("flags-file", path, err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, cliflags.BadFlag("flags-file", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	keys := slices.Sorted(maps.Keys(m))
	values := map[string]string{} // by current name
	given := map[string]string{}  // current name → the key that gave it
	var errs []error
	for _, key := range keys {
		k := strings.TrimLeft(key, "-")
		if fs.Lookup(k) == nil {
			errs = append(errs, fmt.Errorf("unknown flag %q", k))
			continue
		}
		switch m[key].(type) {
		case map[string]any, []any:
			errs = append(errs, fmt.Errorf("flag %q: value must be a scalar", k))
			continue
		}
		cur, old := cliflags.CurrentName(fs, k)
		if old {
			renamed = append(renamed, cliflags.Renamed{Old: k, New: cur})
		}
		v := fmt.Sprint(m[key])
		if prev, twice := given[cur]; twice {
			if values[cur] != v {
				errs = append(errs, fmt.Errorf("%s %s and %s %s: the same flag (--%s) with two values", prev, values[cur], k, v, cur))
			}
			continue
		}
		given[cur], values[cur] = k, v
	}
	for _, cur := range slices.Sorted(maps.Keys(values)) {
		if cur == "flags-file" || set[cur] {
			continue
		}
		if err := fs.Set(cur, values[cur]); err != nil {
			errs = append(errs, fmt.Errorf("flag %q: %w", given[cur], err))
		}
	}
	for i, err := range errs {
		errs[i] = cliflags.BadFlag("flags-file", path, err)
	}
	slices.SortFunc(renamed, func(a, b cliflags.Renamed) int { return strings.Compare(a.Old, b.Old) })
	return renamed, errors.Join(errs...)
}
