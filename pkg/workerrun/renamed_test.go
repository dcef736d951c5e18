package workerrun

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestRenamedFlags: the workers' former flag names (--queue-limit,
// --link-gbps, --config), on the command line or as keys of the flags
// file, set their flags' values (as the effective configuration logs
// them) and log one deprecation warning each at start; a former name
// and its flag given different values is an error naming both.
func TestRenamedFlags(t *testing.T) {
	dir := t.TempDir()
	file := func(name, yaml string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	old := file("old.yaml", "queue-limit: 9\nlink-gbps: 3\n")
	both := file("both.yaml", "queue-limit: 9\nmax-live-prefills: 8\n")
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
		{name: "former names", args: []string{"--queue-limit=7", "--link-gbps=2.5"}, live: 7, pace: 2.5,
			warnings: []warning{{"flag --link-gbps is deprecated, use --pace-gbps", ""}, {"flag --queue-limit is deprecated, use --max-live-prefills", ""}}},
		{name: "former keys in the flags file, given by its former name", args: []string{"--config=" + old}, live: 9, pace: 3,
			warnings: []warning{{"flag --config is deprecated, use --flags-file", ""},
				{"flag --link-gbps is deprecated, use --pace-gbps", old}, {"flag --queue-limit is deprecated, use --max-live-prefills", old}}},
		{name: "the command line wins over a former key", args: []string{"--flags-file=" + old, "--max-live-prefills=5", "--link-gbps=1"}, live: 5, pace: 1,
			warnings: []warning{{"flag --link-gbps is deprecated, use --pace-gbps", ""},
				{"flag --link-gbps is deprecated, use --pace-gbps", old}, {"flag --queue-limit is deprecated, use --max-live-prefills", old}}},
		{name: "both names disagree", args: []string{"--queue-limit=3", "--max-live-prefills=4"}, code: 2,
			stderr: "prefill-worker: --queue-limit 3 and --max-live-prefills 4: --queue-limit is the former name of --max-live-prefills; give one\n"},
		{name: "both keys disagree", args: []string{"--flags-file=" + both}, code: 2,
			stderr: "prefill-worker: --flags-file " + both + ": max-live-prefills 8 and queue-limit 9: the same flag (--max-live-prefills) with two values\n"},
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
