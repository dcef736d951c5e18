package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBadInputFailsBeforeAnythingStarts: a bad dataset, trace, output
// directory or baseline stops every command with a usage error before it
// starts a local deployment or sends a request. Each command is given a
// local deployment (or a server that counts requests) that it would start
// or call first if the input were checked late.
func TestBadInputFailsBeforeAnythingStarts(t *testing.T) {
	srv := newFakeServer(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "missing.csv")
	badCSV := write("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\nyesterday,10,2\n")
	notJSON := write("baseline.txt", "not a result\n")
	aFile := write("a-file", "x")
	compare := []string{"compare", "--profile", "a100-80g/opt-13b/tp1", "--gpus", "3", "--pd-split", "2:1",
		"--request-rates", "1", "--goodput", "ttft:250", "tpot:100", "--num-prompts", "3", "--quiet"}
	local := []string{"--local", "disaggregated", "--gpus", "2", "--pd-split", "1:1", "--num-prompts", "3", "--quiet"}
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"compare, missing trace", append(compare, "--dataset-name", "azure", "--dataset-path", missing), "missing.csv"},
		{"compare, malformed trace", append(compare, "--dataset-name", "azure", "--dataset-path", badCSV), "line 3"},
		{"compare, sharegpt without a file", append(compare, "--dataset-name", "sharegpt"), "--dataset-name sharegpt"},
		{"compare, result dir is a file", append(compare, "--save-result", "--result-dir", filepath.Join(aFile, "sub")), "--result-dir"},
		{"compare, plot dir is a file", append(compare, "--plot-dir", aFile), "--plot-dir"},
		{"sweep, missing trace", append([]string{"sweep", "--request-rates", "1", "--goodput", "ttft:250", "--dataset-name", "mooncake", "--dataset-path", missing}, local...), "missing.csv"},
		{"run, missing trace", append([]string{"run", "--dataset-name", "azure", "--dataset-path", missing}, local...), "missing.csv"},
		{"regress, missing baseline", append([]string{"regress", "--baseline", filepath.Join(dir, "none.json")}, local...), "--baseline"},
		{"regress, baseline not JSON", append([]string{"regress", "--baseline", notJSON}, local...), "--baseline"},
		{"run against a server, malformed trace", []string{"run", "--base-url", srv.URL, "--dataset-name", "azure", "--dataset-path", badCSV}, "line 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, _, stderr := runCLI(t, tc.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d (bad input); stderr:\n%s", code, exitUsage, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr does not name %q:\n%s", tc.want, stderr)
			}
			if strings.Contains(stderr, "starting") {
				t.Errorf("a deployment was started before the input was checked:\n%s", stderr)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v to refuse a bad input", d)
			}
		})
	}
	if n := srv.requests.Load(); n != 0 {
		t.Errorf("the server got %d requests for a bad input", n)
	}
}

// TestPreflightKeepsTheWorkload: the workload preflight loaded is the one
// the run sends, and each bench gets its own copy of the requests (compare
// runs two, and repeatRequests rewrites them).
func TestPreflightKeepsTheWorkload(t *testing.T) {
	o := defaultBenchOptions()
	o.NumPrompts, o.RandomInputLen, o.RandomOutputLen = 5, 8, 2
	if err := o.complete(); err != nil {
		t.Fatal(err)
	}
	if o.loaded == nil || len(o.loaded.Requests) != 5 {
		t.Fatalf("preflight kept %v, want 5 requests", o.loaded)
	}
	a, err := o.loadedWorkload()
	if err != nil {
		t.Fatal(err)
	}
	a.Requests[0] = a.Requests[1]
	b, err := o.loadedWorkload()
	if err != nil {
		t.Fatal(err)
	}
	if b.Requests[0].Index == a.Requests[0].Index {
		t.Errorf("a change to one copy's requests reached the next copy")
	}
}
