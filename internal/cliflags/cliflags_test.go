package cliflags

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		code           int
		ok             bool
		stdout, stderr string // whole outputs
		wantFlag       int
	}{
		{[]string{"--n", "3"}, 0, true, "", "", 3},
		{[]string{"-h"}, 0, false, "Usage: tool\n", "", 0},
		{[]string{"--help"}, 0, false, "Usage: tool\n", "", 0},
		{[]string{"--nope"}, 2, false, "", "tool: flag provided but not defined: -nope\nRun 'tool --help' for usage.\n", 0},
		{[]string{"--n", "x"}, 2, false, "", "tool: invalid value \"x\" for flag -n: parse error\nRun 'tool --help' for usage.\n", 0},
		{[]string{"--n", "1", "extra"}, 2, false, "", "tool: unexpected arguments [\"extra\"]\n", 1},
		{[]string{"--version", "extra"}, 0, false, Version("tool") + "\n", "", 0},
		{[]string{"--version=false"}, 0, true, "", "", 0},
		{[]string{"--version=maybe"}, 2, false, "", "tool: invalid boolean value \"maybe\" for -version: parse error\nRun 'tool --help' for usage.\n", 0},
	} {
		var stdout, stderr strings.Builder
		fs := flag.NewFlagSet("tool", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Usage = func() { io.WriteString(fs.Output(), "Usage: tool\n") }
		n := fs.Int("n", 0, "a number")
		AddVersion(fs)
		code, ok := Parse(fs, tc.args, &stdout, &stderr)
		if code != tc.code || ok != tc.ok || *n != tc.wantFlag || stdout.String() != tc.stdout || stderr.String() != tc.stderr {
			t.Errorf("Parse(%q) = %d, %v, n=%d, stdout %q, stderr %q; want %d, %v, n=%d, stdout %q, stderr %q",
				tc.args, code, ok, *n, stdout.String(), stderr.String(), tc.code, tc.ok, tc.wantFlag, tc.stdout, tc.stderr)
		}
		if fs.Output() != &stderr {
			t.Errorf("Parse(%q) left the flag set's output elsewhere than stderr", tc.args)
		}
	}
}

// TestParseDefaultUsage: a flag set without a Usage function gets the
// flag package's usage, on stdout.
func TestParseDefaultUsage(t *testing.T) {
	var stdout, stderr strings.Builder
	fs := flag.NewFlagSet("tool", flag.ContinueOnError)
	fs.Int("n", 0, "a number")
	if code, ok := Parse(fs, []string{"-h"}, &stdout, &stderr); code != 0 || ok {
		t.Errorf("Parse(-h) = %d, %v", code, ok)
	}
	if want := "Usage of tool:\n  -n int\n    \ta number\n"; stdout.String() != want || stderr.Len() != 0 {
		t.Errorf("stdout %q, stderr %q; want stdout %q", stdout.String(), stderr.String(), want)
	}
}

func TestFormatVersion(t *testing.T) {
	goVer := runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	rev := "4154476e2f1a3b5c6d7e8f9a0b1c2d3e4f5a6b7c"
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "x (unknown) " + goVer},
		{"no vcs (-buildvcs=false)", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "x (devel) " + goVer},
		{"clean checkout", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}},
			"x v1.2.0 revision " + rev + " " + goVer},
		{"dirty checkout", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}},
			"x (devel) revision " + rev + "+dirty " + goVer},
	} {
		if got := formatVersion("x", tc.bi); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestBadFlag(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "m.gguf")
	_, statErr := os.Stat(missing)
	_, _, addrErr := net.SplitHostPort("9000")
	for _, tc := range []struct {
		err  error
		want string
		is   error
	}{
		{BadFlag("model", missing, fmt.Errorf("pkg: load: %w", statErr)), "--model " + missing + ": no such file or directory", fs.ErrNotExist},
		{BadFlag("grpc-addr", "9000", addrErr), "--grpc-addr 9000: missing port in address", nil},
		{BadFlag("engine", "gpu", errors.New(`must be ref, sim or llamacpp`)), "--engine gpu: must be ref, sim or llamacpp", nil},
		{BadFlag("id", "", errors.New("must not be empty")), `--id "": must not be empty`, nil},
		{BadFlag("name", "a b", errors.New("bad")), `--name "a b": bad`, nil},
		// A path error on another file keeps its whole message.
		{BadFlag("config", "c.yaml", &fs.PathError{Op: "open", Path: "other", Err: fs.ErrNotExist}), "--config c.yaml: open other: file does not exist", fs.ErrNotExist},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
		if tc.is != nil && !errors.Is(tc.err, tc.is) {
			t.Errorf("%v is not %v", tc.err, tc.is)
		}
	}
	var pe *fs.PathError
	if err := BadFlag("model", missing, statErr); !errors.As(err, &pe) || pe.Path != missing {
		t.Errorf("errors.As(%v, *fs.PathError) = %v", err, pe)
	}
}

func TestPrintError(t *testing.T) {
	sentinel := errors.New("sentinel")
	inner := fmt.Errorf("enginecfg: invalid options: %w", errors.Join(BadFlag("model", "m.gguf", sentinel), errors.New("--max-seqs 0 must lie in [1, 256]")))
	outer := fmt.Errorf("coordinator: invalid options: %w", errors.Join(
		errors.New("--mode sideways: must be disaggregated or colocated"),
		inner,
		fmt.Errorf("decode: invalid options: %w", errors.Join(errors.New("kv-blocks 0 must be positive"))),
		fmt.Errorf("tls-cert: %w", errors.New("open x: denied")), // context, not a header: kept
		errors.New("coordinator: api keys: bad line 3"),          // already names the command
	))
	var out strings.Builder
	PrintError(&out, "coordinator", outer)
	want := "coordinator: --mode sideways: must be disaggregated or colocated\n" +
		"coordinator: --model m.gguf: sentinel\n" +
		"coordinator: --max-seqs 0 must lie in [1, 256]\n" +
		"coordinator: kv-blocks 0 must be positive\n" +
		"coordinator: tls-cert: open x: denied\n" +
		"coordinator: api keys: bad line 3\n"
	if out.String() != want {
		t.Errorf("PrintError:\n%s\nwant:\n%s", out.String(), want)
	}
	if !errors.Is(outer, sentinel) {
		t.Error("the wrapped errors lost the sentinel")
	}
	if got := Problems(nil); got != nil {
		t.Errorf("Problems(nil) = %v", got)
	}
	single := errors.New("x: y")
	if got := Problems(single); len(got) != 1 || got[0] != single {
		t.Errorf("Problems(%v) = %v", single, got)
	}
}
