package workerrun

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/internal/cliflags"
)

// TestRenamedFlags: the workers' former flag name --config sets
// --flags-file (as the effective configuration logs the file's values)
// and logs one deprecation warning at start; former names in the flags
// file (a synthetic flag set here: the workers have none left) set their
// flags and are returned for their warnings; a former name and its flag
// given different values is an error naming both. The prefill worker's
// former --queue-limit and --link-gbps are gone: other binaries give those
// names other meanings (TestFlagVocabulary).
func TestRenamedFlags(t *testing.T) {
	dir := t.TempDir()
	file := func(name, yaml string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	vals := file("vals.yaml", "max-live-prefills: 9\npace-gbps: 3\n")
	gone := file("gone.yaml", "queue-limit: 9\n")
	t.Run("former keys in a flags file", func(t *testing.T) {
		fs := flag.NewFlagSet("w", flag.ContinueOnError)
		n := fs.Int("new", 0, "")
		cliflags.AddRenamed(fs, cliflags.Renamed{Old: "old", New: "new"})
		renamed, err := ApplyFlagsFile(fs, file("old.yaml", "old: 4\n"))
		if err != nil || *n != 4 || len(renamed) != 1 || renamed[0].Old != "old" {
			t.Errorf("ApplyFlagsFile = %v, %v; --new %d; want [old→new], nil, 4", renamed, err, *n)
		}
		if _, err := ApplyFlagsFile(fs, file("both.yaml", "old: 4\nnew: 5\n")); err == nil || !strings.Contains(err.Error(), "the same flag (--new) with two values") {
			t.Errorf("former key and its flag disagreeing: %v", err)
		}
	})
	type warning struct{ Msg, File string }
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		live     int64   // max_live_prefills logged
		pace     float64 // pace_gbps logged
		warnings []warning
		stderr   string // exit 2: the whole stderr
	}{
		{name: "new names", args: []string{"--max-live-prefills=7", "--pace-gbps=2.5"}, live: 7, pace: 2.5},
		{name: "the flags file by its former name", args: []string{"--config=" + vals}, live: 9, pace: 3,
			warnings: []warning{{"flag --config is deprecated, use --flags-file", ""}}},
		{name: "the command line wins over the file", args: []string{"--flags-file=" + vals, "--max-live-prefills=5"}, live: 5, pace: 3},
		{name: "both names disagree", args: []string{"--config=a.yaml", "--flags-file=b.yaml"}, code: 2,
			stderr: "prefill-worker: --config a.yaml and --flags-file b.yaml: --config is the former name of --flags-file; give one\n"},
		{name: "queue-limit is gone", args: []string{"--queue-limit=3"}, code: 2,
			stderr: "prefill-worker: flag provided but not defined: -queue-limit\nRun 'prefill-worker --help' for usage.\n"},
		{name: "link-gbps is gone", args: []string{"--link-gbps=3"}, code: 2,
			stderr: "prefill-worker: flag provided but not defined: -link-gbps\nRun 'prefill-worker --help' for usage.\n"},
		{name: "queue-limit is gone from the flags file", args: []string{"--flags-file=" + gone}, code: 2,
			stderr: "prefill-worker: --flags-file " + gone + ": unknown flag \"queue-limit\"\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // the worker stops as soon as it starts
			args := append([]string{"--grpc-addr=127.0.0.1:0", "--metrics-addr="}, tc.args...)
			var stdout, stderr bytes.Buffer
			code := mainWith(ctx, "prefill-worker", NewPrefillOptions(), args, &stdout, &stderr,
				func(string) (*zap.Logger, error) { return zap.New(core), nil })
			if tc.code == 2 {
				if code != 2 || stderr.String() != tc.stderr {
					t.Errorf("exit %d, stderr %q; want 2, %q", code, stderr.String(), tc.stderr)
				}
				return
			}
			var warnings []warning
			for _, e := range logs.FilterLevelExact(zap.WarnLevel).FilterMessageSnippet("deprecated").All() {
				f, _ := e.ContextMap()["flags_file"].(string)
				warnings = append(warnings, warning{e.Message, f})
			}
			if diff := cmp.Diff(tc.warnings, warnings); diff != "" {
				t.Errorf("deprecation warnings (-want +got):\n%s", diff)
			}
			cfg := logs.FilterMessage("effective configuration").All()
			if len(cfg) != 1 {
				t.Fatalf("%d effective configuration lines (exit %d, stderr %q)", len(cfg), code, stderr.String())
			}
			m := cfg[0].ContextMap()
			if m["max_live_prefills"] != tc.live || m["pace_gbps"] != tc.pace {
				t.Errorf("max_live_prefills %v, pace_gbps %v; want %d, %v", m["max_live_prefills"], m["pace_gbps"], tc.live, tc.pace)
			}
			if strings.Contains(stderr.String(), "deprecated") {
				t.Errorf("a warning went to stderr: %q", stderr.String())
			}
		})
	}
}
