package coordinatorrun_test

import (
	"bytes"
	"context"
	"flag"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/coordinatorrun"
	"github.com/pdserve/pdserve/pkg/plannerhost"
)

func TestMainHelpDocumentsEveryFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := coordinatorrun.Main(context.Background(), []string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help exit code %d", code)
	}
	help := stdout.String()
	if stderr.Len() != 0 {
		t.Errorf("--help wrote to stderr: %q", stderr.String())
	}
	// Every flag has its section (helpGroups): none is left to "Other".
	if i := strings.Index(help, "\nOther:\n"); i >= 0 {
		t.Errorf("--help has flags in no section:\n%s", help[i:])
	}
	o, po := coordinator.DefaultOptions(), plannerhost.DefaultOptions()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	o.AddFlags(fs)
	po.AddFlags(fs)
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(help, "-"+f.Name+" ") && !strings.Contains(help, "-"+f.Name+"\n") {
			t.Errorf("--help does not document -%s", f.Name)
		}
		if f.Usage == "" {
			t.Errorf("flag -%s has no usage text", f.Name)
		}
	})
	// The names the Helm chart relies on.
	for _, name := range []string{"http-addr", "nats-url", "nats-listen", "standalone", "mode", "codec", "first-token-policy",
		"heartbeat-ttl", "model-name", "prefill-workers", "decode-workers",
		"log-level", "policy", "engine", "preset", "profile", "time-scale", "tls-cert", "tls-key", "tls-ca", "tls-server-name",
		"planner", "planner-profile", "planner-codec", "planner-interval", "planner-window", "planner-cooldown", "planner-hysteresis",
		"planner-namespace", "planner-prefill-deployment", "planner-decode-deployment", "link-gbps", "gpu-budget",
		"region", "region-gateway-listen", "region-gateway", "region-advertise-url", "region-tls-cert", "region-tls-key", "region-tls-ca"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag --%s is missing", name)
		}
	}
	for _, sub := range coordinatorrun.Subcommands() {
		if !strings.Contains(help, sub.Name) {
			t.Errorf("--help does not list subcommand %s", sub.Name)
		}
	}
}

// TestMainHelpAndVersion: every subcommand's --help prints its usage to
// stdout and exits 0; --version prints the version line to stdout.
func TestMainHelpAndVersion(t *testing.T) {
	for _, sub := range coordinatorrun.Subcommands() {
		t.Run(sub.Name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := coordinatorrun.Main(context.Background(), []string{sub.Name, "--help"}, &stdout, &stderr)
			if want := "Usage: coordinator " + sub.Name; code != 0 || !strings.HasPrefix(stdout.String(), want) || stderr.Len() != 0 {
				t.Errorf("%s --help: exit %d, stdout %.60q, stderr %q; want exit 0 and %q… on stdout only", sub.Name, code, stdout.String(), stderr.String(), want)
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if code := coordinatorrun.Main(context.Background(), []string{"--version"}, &stdout, &stderr); code != 0 {
		t.Errorf("--version exit %d", code)
	}
	if want := cliflags.Version("coordinator") + "\n"; stdout.String() != want || stderr.Len() != 0 ||
		!strings.HasPrefix(want, "coordinator ") || !strings.Contains(want, runtime.Version()) {
		t.Errorf("--version: stdout %q, stderr %q; want %q with the Go version", stdout.String(), stderr.String(), want)
	}
}

// TestMainErrorMessages: the exact messages of bad settings, one line a
// problem, "coordinator" and the flag said once.
func TestMainErrorMessages(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "m.gguf")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing model file", []string{"--standalone", "--engine", "llamacpp", "--model", missing},
			"coordinator: --model " + missing + ": no such file or directory\n"},
		{"missing model file of the tokenizer", []string{"--engine", "llamacpp", "--model", missing},
			"coordinator: --model " + missing + ": no such file or directory\n"},
		{"bad engine", []string{"--standalone", "--engine", "vllm"}, "coordinator: --engine vllm: must be ref, sim or llamacpp\n"},
		{"bad address", []string{"--http-addr", "nowhere"}, "coordinator: --http-addr nowhere: missing port in address\n"},
		{"bad trace endpoint", []string{"--otel-endpoint", "collector:4317"},
			"coordinator: --otel-endpoint collector:4317: must be an http:// or https:// URL (e.g. http://otel-collector:4317)\n"},
		{"bad trace protocol", []string{"--otel-endpoint", "http://127.0.0.1:4318", "--otel-protocol", "http/json"},
			"coordinator: --otel-protocol http/json: must be grpc or http/protobuf\n"},
		{"bad flag", []string{"--verison"}, "coordinator: flag provided but not defined: -verison\nRun 'coordinator --help' for usage.\n"},
		{"problems of the coordinator, the engine and the planner", []string{"--http-addr", "x", "--standalone", "--engine", "sim", "--planner", "log"},
			"coordinator: --http-addr x: missing port in address\n" +
				"coordinator: --profile is required with --engine sim: GPU/MODEL/tpN (coordinator profiles lists them) or a profile JSON file\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := coordinatorrun.Main(context.Background(), tc.args, &stdout, &stderr); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.HasPrefix(stderr.String(), tc.want) || stdout.Len() != 0 {
				t.Errorf("stderr:\n%s\nwant it to start with:\n%s(stdout %q)", stderr.String(), tc.want, stdout.String())
			}
			if strings.Contains(stderr.String(), "coordinator: coordinator:") || strings.Contains(stderr.String(), "invalid options") {
				t.Errorf("stderr stacks prefixes:\n%s", stderr.String())
			}
		})
	}
}

func TestMainExitCodes(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	badPolicy := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(badPolicy, []byte("limits: {queue_limit: -1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		output string // substring of stdout+stderr
	}{
		{"unknown flag", []string{"--bogus"}, 2, "bogus"},
		{"bad mode", []string{"--mode", "sideways"}, 2, "mode"},
		{"bad policy value", []string{"--first-token-policy", "maybe"}, 2, "first-token-policy"},
		{"bad http address", []string{"--http-addr", "nowhere"}, 2, "http-addr"},
		{"missing policy file", []string{"--policy", missing}, 2, "missing.yaml"},
		{"invalid policy file", []string{"--policy", badPolicy}, 2, "queue_limit"},
		{"--config is gone (the workers' former name of --flags-file)", []string{"--config", missing}, 2, "coordinator: flag provided but not defined: -config"},
		{"worker flags without --standalone", []string{"--decode-workers", "2", "--gpu-layers", "10", "--kv-type", "q8_0"}, 2,
			"--decode-workers, --gpu-layers, --kv-type: worker flags, read only with --standalone (give them to the workers)"},
		{"worker flags with --standalone", []string{"--standalone", "--decode-workers", "0"}, 2, "decode-workers 0 must be positive in standalone mode"},
		{"--elastic without --standalone", []string{"--elastic"}, 2, "--elastic: a worker flag, read only with --standalone (give it to the workers)"},
		{"two flags of one policy key disagree", []string{"--queue-limit=3", "--max-admitted-requests=4"}, 2,
			"invalid value \"4\" for flag -max-admitted-requests: --queue-limit 3 was given too: both set limits.queue_limit; give one"},
		{"stray argument", []string{"--mode", "colocated", "extra"}, 2, "unexpected"},
		{"unknown subcommand", []string{"deploy"}, 2, "unknown subcommand"},
		{"profiles", []string{"profiles"}, 0, "PROFILE"},
		{"calibrate", []string{"calibrate"}, 0, "PROFILE"},
		{"profiles with arguments", []string{"profiles", "x"}, 2, `coordinator profiles: unexpected arguments ["x"]`},
		{"calibrate with a flag", []string{"calibrate", "--json"}, 2, "coordinator calibrate: flag provided but not defined: -json"},
		{"hash-key with the key as an argument", []string{"hash-key", "s3cret-key-0123456789abcdef"}, 2, "from stdin, not from arguments (1 given)"},
		{"plan help", []string{"plan", "--help"}, 0, "Usage: coordinator plan"},
		{"plan without a profile", []string{"plan", "--workload", "fixed:64/8"}, 2, "--profile is required"},
		{"plan", []string{"plan", "--profile", "h100/llama-3-8b/tp1", "--workload", "fixed:512/64", "--slo-ttft", "500ms",
			"--slo-tpot", "50ms", "--gpu-budget", "2", "--requests", "50", "--rate", "2"}, 0, "disaggregated  1P+1D"},
		{"planner without a profile", []string{"--planner", "log"}, 2, "planner-profile"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			code := coordinatorrun.Main(context.Background(), tc.args, &out, &out)
			if code != tc.code || !strings.Contains(out.String(), tc.output) {
				t.Errorf("exit %d, output %q; want exit %d with %q", code, out.String(), tc.code, tc.output)
			}
		})
	}
}

// TestDefaultsListenOnLoopback: a coordinator started without addresses
// is reachable from its own host only (the API and the embedded NATS).
func TestDefaultsListenOnLoopback(t *testing.T) {
	o := coordinator.DefaultOptions()
	for name, addr := range map[string]string{"http-addr": o.HTTPAddr, "nats-listen": o.NATSListenAddr()} {
		host, _, err := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			t.Errorf("default --%s %q is not a loopback address", name, addr)
		}
	}
}
