package coordinatorrun_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/coordinatorrun"
	"github.com/pdserve/pdserve/pkg/plannerhost"
)

func TestMainHelpDocumentsEveryFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := coordinatorrun.Main(context.Background(), []string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help exit code %d", code)
	}
	help := stderr.String()
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
		"max-tokens-cap", "queue-limit", "heartbeat-ttl", "model-name", "prefill-workers", "decode-workers",
		"log-level", "config", "engine", "preset", "profile", "time-scale", "tls-cert", "tls-key", "tls-ca", "tls-server-name",
		"planner", "planner-profile", "planner-codec", "planner-interval", "planner-window", "planner-cooldown", "planner-hysteresis",
		"planner-namespace", "planner-prefill-deployment", "planner-decode-deployment", "link-gbps", "gpu-cost-per-hour", "gpu-budget"} {
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
		{"missing config file", []string{"--config", missing}, 2, "missing.yaml"},
		{"invalid config file", []string{"--config", badPolicy}, 2, "queue_limit"},
		{"stray argument", []string{"--mode", "colocated", "extra"}, 2, "unexpected"},
		{"unknown subcommand", []string{"deploy"}, 2, "unknown subcommand"},
		{"profiles", []string{"profiles"}, 0, "PROFILE"},
		{"calibrate", []string{"calibrate"}, 0, "PROFILE"},
		{"profiles with arguments", []string{"profiles", "x"}, 2, "no arguments"},
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
