package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/gguf"
)

// needVocab fails the test when CI=true and the llama.cpp vocab GGUFs are
// missing, and skips it otherwise.
func needVocab(t *testing.T) {
	t.Helper()
	if _, err := gguf.VocabDir(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: the vocab GGUFs are required)", err)
		}
		t.Skipf("%v: run make llama", err)
	}
}

func runCmd(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = mkgguf(ctx, args, &o, &e)
	return code, o.String(), e.String()
}

func TestFlagErrors(t *testing.T) {
	out := filepath.Join(t.TempDir(), "m.gguf")
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"help", []string{"--help"}, 0, "qwen2.5-0.5b"},
		{"no out", []string{"--shape", "tiny-llama"}, 2, "--out is required"},
		{"unknown flag", []string{"--bogus"}, 2, "flag provided but not defined"},
		{"extra argument", []string{"--out", out, "x"}, 2, "unexpected arguments"},
		{"unknown shape", []string{"--shape", "gpt-5", "--out", out}, 2, `unknown shape "gpt-5"`},
		{"bad type", []string{"--shape", "tiny-llama", "--type", "q3", "--out", out}, 2, `unknown tensor type "q3"`},
		{"missing sizes", []string{"--arch", "llama", "--vocab", "v.gguf", "--out", out}, 2, "--layers, --hidden, --heads, --ffn must be set"},
		{"unknown arch", []string{"--arch", "mamba", "--vocab", "v.gguf", "--layers", "1", "--hidden", "64", "--heads", "4", "--ffn", "64", "--out", out}, 2, `unknown arch "mamba"`},
		{"bad kv heads", []string{"--shape", "tiny-llama", "--kv-heads", "3", "--out", out}, 2, "kv heads 3 does not divide heads 4"},
		{"q8_0 needs blocks", []string{"--shape", "tiny-llama", "--type", "q8_0", "--ffn", "100", "--out", out}, 2, "multiples of 32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(context.Background(), tt.args...)
			got, other := stderr, stdout // errors on stderr, --help on stdout
			if tt.code == 0 {
				got, other = stdout, stderr
			}
			if code != tt.code || !strings.Contains(got, tt.want) || other != "" {
				t.Errorf("exit %d, stdout:\n%s\nstderr:\n%s\nwant exit %d and %q", code, stdout, stderr, tt.code, tt.want)
			}
		})
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a failed run left %s (%v)", out, err)
	}
}

func TestWritesModel(t *testing.T) {
	needVocab(t)
	dir := t.TempDir()
	tests := []struct {
		name  string
		args  []string
		check map[string]any
	}{
		{"shape with overrides", []string{"--shape", "tiny-qwen2", "--layers", "1", "--type", "q8_0", "--seed", "9"},
			map[string]any{"general.architecture": "qwen2", "qwen2.block_count": uint32(1), "general.file_type": uint32(7),
				"qwen2.embedding_length": uint32(64), "general.name": "random-tiny-qwen2"}},
		{"explicit flags", []string{"--arch", "llama", "--vocab", "ggml-vocab-llama-spm.gguf", "--layers", "2", "--hidden", "64",
			"--heads", "4", "--ffn", "96", "--ctx", "512", "--rope-theta", "5e5"},
			map[string]any{"general.architecture": "llama", "llama.attention.head_count_kv": uint32(4), "llama.context_length": uint32(512),
				"llama.feed_forward_length": uint32(96), "llama.rope.freq_base": float32(5e5), "general.file_type": uint32(1),
				"llama.attention.layer_norm_rms_epsilon": float32(1e-5), "general.name": "random-llama-2x64"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(dir, string(rune('a'+i))+".gguf")
			code, stdout, stderr := runCmd(context.Background(), append(tt.args, "--out", out)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if !strings.Contains(stdout, "wrote "+out) {
				t.Errorf("stdout %q does not report the file", stdout)
			}
			f, err := gguf.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			for k, want := range tt.check {
				if got, ok := f.Metadata.Get(k); !ok || got != want {
					t.Errorf("%s = %v (%T), want %v (%T)", k, got, got, want, want)
				}
			}
		})
	}
}

func TestCancelledLeavesNoFile(t *testing.T) {
	needVocab(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := filepath.Join(t.TempDir(), "m.gguf")
	code, _, stderr := runCmd(ctx, "--shape", "tiny-llama", "--out", out)
	if code != 1 || !strings.Contains(stderr, "context canceled") {
		t.Errorf("exit %d, stderr %q; want 1 and the cancellation", code, stderr)
	}
	ents, _ := os.ReadDir(filepath.Dir(out))
	if len(ents) != 0 {
		t.Errorf("a cancelled run left %v", ents)
	}
}

// TestBinaryHelpAndVersion builds mkgguf and runs it: --help and --version
// print to stdout and exit 0, a bad flag exits 2 with the error on stderr.
func TestBinaryHelpAndVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	// Without VCS stamping (repotest.BuildArgs), the version line is fixed.
	dir := t.TempDir()
	repotest.Build(t, dir, "./cmd/mkgguf")
	bin := filepath.Join(dir, "mkgguf")
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string // prefixes
	}{
		{[]string{"--version"}, 0, "mkgguf (devel) " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n", ""},
		{[]string{"--help"}, 0, "Usage: mkgguf ", ""},
		{[]string{"-h"}, 0, "Usage: mkgguf ", ""},
		{[]string{"--bogus"}, 2, "", "mkgguf: flag provided but not defined: -bogus\nRun 'mkgguf --help' for usage.\n"},
	} {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, tc.args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		code := 0
		if err := cmd.Run(); err != nil {
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("%q: %v", tc.args, err)
			}
			code = ee.ExitCode()
		}
		ok := code == tc.code && strings.HasPrefix(stdout.String(), tc.stdout) && strings.HasPrefix(stderr.String(), tc.stderr) &&
			(tc.stdout != "" || stdout.Len() == 0) && (tc.stderr != "" || stderr.Len() == 0)
		if tc.args[0] == "--version" && stdout.String() != tc.stdout {
			ok = false
		}
		if !ok {
			t.Errorf("mkgguf %q: exit %d, stdout %.80q, stderr %.80q; want exit %d, stdout %q…, stderr %q…", tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
}
