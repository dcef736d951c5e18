package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAbsoluteResultFilename: an absolute --result-filename is kept as it
// is (as vLLM does), not joined under --result-dir; its directory is
// created, and the plots go beside it.
func TestAbsoluteResultFilename(t *testing.T) {
	srv := newFakeServer(t)
	t.Chdir(t.TempDir()) // where a wrongly joined relative path would land
	out := filepath.Join(t.TempDir(), "sub", "out.json")
	code, _, stderr := runCLI(t, "run", "--base-url", srv.URL, "--num-prompts", "3", "--random-input-len", "8",
		"--random-output-len", "2", "--save-result", "--result-filename", out)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if m := readJSON(t, out); m["completed"] != 3.0 {
		t.Errorf("result at %s: completed %v, want 3", out, m["completed"])
	}
	checkPNG(t, filepath.Join(filepath.Dir(out), "out-ttft-cdf.png"))
	if !strings.Contains(stderr, "result: "+out) {
		t.Errorf("stderr does not name %s:\n%s", out, stderr)
	}
	if _, err := os.Stat("tmp"); err == nil {
		t.Error("a relative tmp/ was created")
	}
}

func TestOutPath(t *testing.T) {
	abs := filepath.Join(t.TempDir(), "r.json")
	for _, tc := range []struct{ dir, name, want string }{
		{".", "r.json", "r.json"},
		{"results", "r.json", filepath.Join("results", "r.json")},
		{"results", abs, abs},
		{".", abs, abs},
	} {
		if got := outPath(tc.dir, tc.name); got != tc.want {
			t.Errorf("outPath(%q, %q) = %q, want %q", tc.dir, tc.name, got, tc.want)
		}
	}
}

// TestHelpDescribesEachCommand: -help of every command says what it does
// and shows an example before the flags.
func TestHelpDescribesEachCommand(t *testing.T) {
	for _, cmd := range []string{"run", "sweep", "compare", "regress"} {
		t.Run(cmd, func(t *testing.T) {
			code, _, stderr := runCLI(t, cmd, "--help")
			if code != exitOK {
				t.Fatalf("exit %d", code)
			}
			for _, want := range []string{"Usage: go run ./loadtest " + cmd, "Examples:\n", "  go run ./loadtest " + cmd + " ", "Flags:\n"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("help lacks %q:\n%s", want, stderr)
				}
			}
		})
	}
}
