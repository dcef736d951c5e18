package coordinator_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/coordinator"
)

func TestMainHelpDocumentsEveryFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := coordinator.Main(context.Background(), []string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help exit code %d", code)
	}
	help := stderr.String()
	o := coordinator.DefaultOptions()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	o.AddFlags(fs)
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
	for _, sub := range coordinator.Subcommands() {
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
			code := coordinator.Main(context.Background(), tc.args, &out, &out)
			if code != tc.code || !strings.Contains(out.String(), tc.output) {
				t.Errorf("exit %d, output %q; want exit %d with %q", code, out.String(), tc.code, tc.output)
			}
		})
	}
}

// Main serves in standalone mode until its context ends, then stops
// cleanly with exit code 0.
func TestMainServesAndStops(t *testing.T) {
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- coordinator.Main(ctx, []string{"--standalone", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port),
			"--nats-listen", "127.0.0.1:-1", "--log-level", "error", "--heartbeat-ttl", "2s"}, &out, &out)
	}()
	waitFor(t, 20*time.Second, func() error {
		select {
		case c := <-code:
			t.Fatalf("Main returned %d before serving: %s", c, out.String())
		default:
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
	got := complete(ctx, t, fmt.Sprintf("http://127.0.0.1:%d", port), request{Prompt: "hello", MaxTokens: 3})
	if len(got.Tokens) == 0 || got.Finish == "" {
		t.Errorf("completion %+v", got)
	}
	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("exit code %d after cancel", c)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Main did not return 30 s after cancel")
	}
}

func TestOptions(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("limits: {max_tokens_cap: 100, default_max_tokens: 50, queue_limit: 9}\nrouting: {local_prefill_below_tokens: 7}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		edit    func(*coordinator.Options)
		check   func(*testing.T, coordinator.Options)
		wantErr string
	}{
		{name: "defaults are valid", check: func(t *testing.T, o coordinator.Options) {
			if o.Policy.Limits != config.Default().Limits {
				t.Errorf("limits %+v, want the defaults", o.Policy.Limits)
			}
		}},
		{name: "file policy", edit: func(o *coordinator.Options) { o.ConfigFile = policy }, check: func(t *testing.T, o coordinator.Options) {
			if l := o.Policy.Limits; l.MaxTokensCap != 100 || l.QueueLimit != 9 || o.Policy.Routing.LocalPrefillBelowTokens != 7 {
				t.Errorf("policy %+v", o.Policy)
			}
		}},
		{name: "flags override the file", edit: func(o *coordinator.Options) {
			o.ConfigFile, o.MaxTokensCap, o.QueueLimit, o.LocalPrefillTokens = policy, 20, 3, 11
		}, check: func(t *testing.T, o coordinator.Options) {
			if l := o.Policy.Limits; l.MaxTokensCap != 20 || l.DefaultMaxTokens != 20 || l.QueueLimit != 3 || o.Policy.Routing.LocalPrefillBelowTokens != 11 {
				t.Errorf("policy %+v", o.Policy)
			}
		}},
		{name: "bad mode", edit: func(o *coordinator.Options) { o.Mode = "x" }, wantErr: "mode"},
		{name: "bad policy", edit: func(o *coordinator.Options) { o.FirstTokenPolicy = "x" }, wantErr: "first-token-policy"},
		{name: "bad ttl", edit: func(o *coordinator.Options) { o.HeartbeatTTL = 0 }, wantErr: "heartbeat-ttl"},
		{name: "bad log level", edit: func(o *coordinator.Options) { o.LogLevel = "loud" }, wantErr: "log-level"},
		{name: "bad nats listen", edit: func(o *coordinator.Options) { o.NATSListen = "x" }, wantErr: "nats-listen"},
		{name: "nats url skips nats listen", edit: func(o *coordinator.Options) { o.NATSURL, o.NATSListen = "nats://127.0.0.1:4222", "x" }},
		{name: "standalone needs decode workers", edit: func(o *coordinator.Options) { o.Standalone, o.DecodeWorkers = true, 0 }, wantErr: "decode-workers"},
		{name: "standalone disaggregated needs prefill workers", edit: func(o *coordinator.Options) { o.Standalone, o.PrefillWorkers = true, 0 }, wantErr: "prefill-workers"},
		{name: "standalone colocated needs no prefill workers", edit: func(o *coordinator.Options) {
			o.Standalone, o.PrefillWorkers, o.Mode = true, 0, coordinator.ModeColocated
		}},
		{name: "standalone checks the engine", edit: func(o *coordinator.Options) { o.Standalone, o.Engine.Preset = true, "huge" }, wantErr: "preset"},
		{name: "several errors at once", edit: func(o *coordinator.Options) { o.Mode, o.LogLevel = "x", "y" }, wantErr: "log-level"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := coordinator.DefaultOptions()
			if tc.edit != nil {
				tc.edit(&o)
			}
			if err := o.Complete(); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate error %v, want one about %s", err, tc.wantErr)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
			if len(o.LogFields()) == 0 {
				t.Errorf("no log fields")
			}
		})
	}
}
