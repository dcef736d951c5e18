package workerrun

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/control"
)

// The flags the Helm chart relies on (fixed names).
var (
	commonFlags  = []string{"nats-url", "nats-user", "nats-password-file", "log-level", "metrics-addr", "engine", "preset", "profile", "time-scale", "flags-file", "grpc-addr", "advertise-addr", "id", "heartbeat-interval", "tls-cert", "tls-key", "tls-ca", "tls-server-name", "elastic"}
	prefillFlags = []string{"chunk-tokens", "max-batch-tokens", "codec", "max-live-prefills", "pace-gbps", "kv-conns", "retain-bytes", "peer-link-gbps"}
	decodeFlags  = []string{"role", "kv-blocks", "block-tokens", "max-batch", "chunk-tokens", "max-batch-tokens", "peer-link-gbps", "peer-pull-verify-blocks"}
)

func TestHelpListsEveryFlag(t *testing.T) {
	for _, tc := range []struct {
		name  string
		o     Options
		flags []string
	}{
		{"prefill-worker", NewPrefillOptions(), append(commonFlags, prefillFlags...)},
		{"decode-worker", NewDecodeOptions(), append(commonFlags, decodeFlags...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, stderr bytes.Buffer
			if code := Main(context.Background(), tc.name, tc.o, []string{"--help"}, &out, &stderr); code != 0 {
				t.Errorf("--help exit code %d, want 0", code)
			}
			if !strings.HasPrefix(out.String(), "Usage: "+tc.name+" [flags]\n") || stderr.Len() != 0 {
				t.Errorf("--help: stdout %.40q…, stderr %q; want the usage on stdout only", out.String(), stderr.String())
			}
			for _, f := range tc.flags {
				if !strings.Contains(out.String(), "-"+f+" ") && !strings.Contains(out.String(), "-"+f+"\n") {
					t.Errorf("--help does not document -%s", f)
				}
			}
			// Every flag has its section (helpGroups): none is left to
			// "Other".
			if strings.Contains(out.String(), "\nOther:\n") {
				t.Errorf("--help has flags in no section:\n%s", out.String()[strings.Index(out.String(), "\nOther:\n"):])
			}
		})
	}
}

func TestMainRejectsBadSettings(t *testing.T) {
	tests := []struct {
		name    string
		o       Options
		args    []string
		wantErr string
	}{
		{"unknown flag", NewPrefillOptions(), []string{"--bogus"}, "flag provided but not defined"},
		{"zero chunk", NewPrefillOptions(), []string{"--chunk-tokens=0"}, "chunk-tokens 0 must be positive"},
		{"budget below chunk", NewPrefillOptions(), []string{"--chunk-tokens=64", "--max-batch-tokens=32"}, "max-batch-tokens 32"},
		{"unknown codec", NewPrefillOptions(), []string{"--codec=gzip"}, `codec "gzip"`},
		{"bad role", NewDecodeOptions(), []string{"--role=prefill"}, "role \"prefill\" must be decode or colocated"},
		{"no blocks", NewDecodeOptions(), []string{"--kv-blocks=0"}, "kv-blocks 0"},
		{"negative peer link", NewDecodeOptions(), []string{"--peer-link-gbps=-1"}, "peer-link-gbps -1 must not be negative"},
		{"negative pull check", NewDecodeOptions(), []string{"--peer-pull-verify-blocks=-1"}, "peer-pull-verify-blocks -1 must not be negative"},
		{"negative pace", NewDecodeOptions(), []string{"--pace-gbps=-1"}, "pace-gbps -1: must not be negative"},
		{"budget not above batch", NewDecodeOptions(), []string{"--max-batch=64", "--max-batch-tokens=64"}, "must exceed max-batch"},
		{"bad id", NewDecodeOptions(), []string{"--id=a.b"}, "--id a.b: "},
		{"bad address", NewDecodeOptions(), []string{"--grpc-addr=9000"}, "worker: --grpc-addr 9000: missing port in address\n"},
		{"bad log level", NewDecodeOptions(), []string{"--log-level=loud"}, "worker: --log-level loud: must be debug, info, warn or error\n"},
		{"bad engine", NewDecodeOptions(), []string{"--engine=gpu"}, "worker: --engine gpu: must be ref, sim or llamacpp\n"},
		{"bad trace endpoint", NewPrefillOptions(), []string{"--otel-endpoint=http://:4317"}, "worker: --otel-endpoint http://:4317: has no host\n"},
		{"bad trace sampling", NewDecodeOptions(), []string{"--otel-endpoint=http://127.0.0.1:4317", "--otel-sample-ratio=1.5"},
			"worker: --otel-sample-ratio 1.5: must be in [0, 1]\n"},
		{"sim without profile", NewDecodeOptions(), []string{"--engine=sim"}, "profile is required"},
		{"missing flags file", NewDecodeOptions(), []string{"--flags-file=does-not-exist.yaml"}, "worker: --flags-file does-not-exist.yaml: no such file or directory\n"},
		{"missing flags file by the former name", NewDecodeOptions(), []string{"--config=does-not-exist.yaml"}, "worker: --flags-file does-not-exist.yaml: no such file or directory\n"},
		{"stray argument", NewDecodeOptions(), []string{"serve"}, "unexpected arguments"},
		{"tls cert without key", NewDecodeOptions(), []string{"--tls-cert=tls.crt"}, "tls-cert and tls-key must be given together"},
		{"tls files missing", NewPrefillOptions(), []string{"--tls-cert=no.crt", "--tls-key=no.key", "--tls-ca=no-ca.crt"}, "tls-cert: open no.crt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, out bytes.Buffer
			if code := Main(context.Background(), "worker", tc.o, tc.args, &stdout, &out); code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
			if !strings.Contains(out.String(), tc.wantErr) {
				t.Errorf("output %q does not contain %q", out.String(), tc.wantErr)
			}
		})
	}
}

// TestMainVersion: --version prints the version line to stdout and exits
// 0 before anything is validated or started.
func TestMainVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), "decode-worker", NewDecodeOptions(), []string{"--version", "--kv-blocks=0"}, &stdout, &stderr); code != 0 {
		t.Errorf("--version exit code %d, want 0", code)
	}
	if want := cliflags.Version("decode-worker") + "\n"; stdout.String() != want || stderr.Len() != 0 {
		t.Errorf("--version: stdout %q, stderr %q; want stdout %q", stdout.String(), stderr.String(), want)
	}
	if !strings.HasPrefix(stdout.String(), "decode-worker ") || !strings.Contains(stdout.String(), runtime.Version()) {
		t.Errorf("--version %q does not name the binary and the Go version", stdout.String())
	}
}

// TestMainErrorMessages: the exact messages of bad settings, one line a
// problem, the binary's name and the flag said once.
func TestMainErrorMessages(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "m.gguf")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing model file", []string{"--engine=llamacpp", "--model=" + missing},
			"prefill-worker: --model " + missing + ": no such file or directory\n"},
		{"bad engine", []string{"--engine=vllm"}, "prefill-worker: --engine vllm: must be ref, sim or llamacpp\n"},
		{"bad addresses", []string{"--grpc-addr=9000", "--metrics-addr=localhost"},
			"prefill-worker: --grpc-addr 9000: missing port in address\nprefill-worker: --metrics-addr localhost: missing port in address\n"},
		{"two problems in two packages", []string{"--kv-conns=0", "--engine=sim", "--time-scale=-1", "--profile=h100/llama-3-8b/tp1"},
			"prefill-worker: --kv-conns 0: must be positive\nprefill-worker: --time-scale -1: must be a finite number > 0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := Main(context.Background(), "prefill-worker", NewPrefillOptions(), tc.args, &stdout, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			if stderr.String() != tc.want || stdout.Len() != 0 {
				t.Errorf("stderr:\n%s\nwant:\n%s(stdout %q)", stderr.String(), tc.want, stdout.String())
			}
		})
	}
}

func TestApplyFlagsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker.yaml")
	yaml := "kv-blocks: 128\nmax-batch: 16\nheartbeat-interval: 250ms\nrole: colocated\nengine: ref\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	o := NewDecodeOptions()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--max-batch=32", "--flags-file=" + path}); err != nil {
		t.Fatal(err)
	}
	if renamed, err := ApplyFlagsFile(fs, o.FlagsFile); err != nil || renamed != nil {
		t.Fatalf("ApplyFlagsFile = %v, %v", renamed, err)
	}
	got := []any{o.Decode.KVBlocks, o.Decode.MaxBatch, o.HeartbeatInterval, o.Role}
	want := []any{128, 32, 250 * time.Millisecond, control.RoleColocated} // the command line wins for max-batch
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kv-blocks, max-batch, heartbeat-interval, role (-want +got):\n%s", diff)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("kv-blockz: 1\nmax-batch: [1, 2]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ApplyFlagsFile(fs, bad)
	if err == nil || !strings.Contains(err.Error(), `unknown flag "kv-blockz"`) || !strings.Contains(err.Error(), "must be a scalar") {
		t.Errorf("bad config: %v, want unknown flag and scalar errors", err)
	}
}

// TestRunStopsWhenContextEnds runs a worker until its context ends.
func TestRunStopsWhenContextEnds(t *testing.T) {
	o := testOptions(control.RolePrefill, "")
	ctx, cancel := context.WithCancel(testCtx(t))
	var addr string
	err := Run(ctx, o, zaptest.NewLogger(t), func(a string) {
		addr = a
		cancel()
	})
	if err != nil {
		t.Errorf("Run: %v", err)
	}
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("ready address %q", addr)
	}
}

// TestRunStoppedWhileStarting: a stop (ctx ended) while the worker
// starts is a clean stop: Run returns nil, and never calls ready.
func TestRunStoppedWhileStarting(t *testing.T) {
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	err := Run(ctx, testOptions(control.RolePrefill, ""), zaptest.NewLogger(t), func(string) { t.Error("ready called") })
	if err != nil {
		t.Errorf("Run stopped while starting = %v, want nil", err)
	}
}

func TestStartFailsCleanly(t *testing.T) {
	// An unreachable NATS server is waited for (TestWorkerWaitsForNATS);
	// an unreadable credential file is an error at once.
	o := testOptions(control.RoleDecode, "nats://127.0.0.1:1")
	o.NATS.User, o.NATS.PasswordFile = "decode", filepath.Join(t.TempDir(), "missing")
	if _, err := Start(testCtx(t), o, nil); err == nil || !strings.Contains(err.Error(), "password file") {
		t.Errorf("Start with a missing NATS password file: %v, want a password file error", err)
	}
	o = testOptions(control.RoleDecode, "")
	o.Decode.KVBlocks = 0
	if _, err := Start(testCtx(t), o, nil); err == nil {
		t.Error("Start with invalid options succeeded")
	}
}
