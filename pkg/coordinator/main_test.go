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

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/coordinatorrun"
)

// TestRunStoppedWhileStarting: a stop (ctx ended) while Run starts is a
// clean stop: Run returns nil (see standalone's test of the same).
func TestRunStoppedWhileStarting(t *testing.T) {
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.NATSListen = "127.0.0.1:0", "127.0.0.1:-1"
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := coordinator.Run(ctx, o, nil); err != nil {
		t.Errorf("Run stopped while starting = %v, want nil", err)
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
		code <- coordinatorrun.Main(ctx, []string{"--standalone", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port),
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
	// No wall-clock bound: a Main that never returns is a hang, which
	// go test's -timeout reports with every goroutine's stack.
	if c := <-code; c != 0 {
		t.Errorf("exit code %d after cancel", c)
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
		{name: "file policy", edit: func(o *coordinator.Options) { o.PolicyFile = policy }, check: func(t *testing.T, o coordinator.Options) {
			if l := o.Policy.Limits; l.MaxTokensCap != 100 || l.QueueLimit != 9 || o.Policy.Routing.LocalPrefillBelowTokens != 7 {
				t.Errorf("policy %+v", o.Policy)
			}
		}},
		{name: "edits override the file", edit: func(o *coordinator.Options) {
			o.PolicyFile = policy
			edit(o, func(p *config.Policy) { p.Limits.MaxTokensCap, p.Limits.DefaultMaxTokens = 20, 20 })
			edit(o, func(p *config.Policy) { p.Limits.QueueLimit, p.Routing.LocalPrefillBelowTokens = 3, 11 })
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

// edit appends a policy edit to o (what a deprecated policy flag does).
func edit(o *coordinator.Options, e func(*config.Policy)) {
	o.PolicyEdits = append(o.PolicyEdits, e)
}

// TestFlagsCanSayZero: a deprecated policy flag (PolicyFlags) given on the
// command line overrides the policy file at any value, 0 and false
// included; one not given leaves the file's value; --max-admitted-requests
// 0 is refused, naming the flag, and so is --queue-limit 0.
func TestFlagsCanSayZero(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("limits: {max_tokens_cap: 100, default_max_tokens: 50, queue_limit: 9}\n"+
		"routing: {local_prefill_below_tokens: 7}\nresponse_cache: {entries: 10, share_across_keys: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	complete := func(t *testing.T, args ...string) (coordinator.Options, error) {
		t.Helper()
		o := coordinator.DefaultOptions()
		fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
		o.AddFlags(fs)
		var stdout, stderr strings.Builder
		if _, ok := cliflags.Parse(fs, append([]string{"--policy", policy}, args...), &stdout, &stderr); !ok {
			return o, errors.New(stderr.String())
		}
		o.SetFlags(fs)
		return o, o.Complete()
	}
	type got struct {
		MaxTokensCap, DefaultMaxTokens, QueueLimit, LocalPrefill, CacheEntries int
		ShareAcrossKeys                                                        bool
	}
	read := func(o coordinator.Options) got {
		p := o.Policy
		return got{p.Limits.MaxTokensCap, p.Limits.DefaultMaxTokens, p.Limits.QueueLimit, p.Routing.LocalPrefillBelowTokens,
			p.ResponseCache.Entries, p.ResponseCache.ShareAcrossKeys}
	}
	for _, tc := range []struct {
		name string
		args []string
		want got
	}{
		{"the file's", nil, got{100, 50, 9, 7, 10, true}},
		{"zero and false given", []string{"--max-tokens-cap=0", "--local-prefill-tokens=0", "--response-cache-entries=0", "--response-cache-share-across-keys=false"},
			got{0, 50, 9, 0, 0, false}},
		{"values given", []string{"--max-tokens-cap=20", "--max-admitted-requests=3", "--local-prefill-tokens=11", "--response-cache-entries=4"},
			got{20, 20, 3, 11, 4, true}},
		{"former name", []string{"--queue-limit=3"}, got{100, 50, 3, 7, 10, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := complete(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, read(o)); diff != "" {
				t.Errorf("policy (-want +got):\n%s", diff)
			}
		})
	}
	for _, name := range []string{"max-admitted-requests", "queue-limit"} {
		if _, err := complete(t, "--"+name+"=0"); err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "must be ≥ 1") {
			t.Errorf("--%s 0: %v, want an error naming --%s", name, err, name)
		}
	}
	if _, err := complete(t, "--gpu-cost-per-hour=2", "--response-cache-entries=-1"); err == nil || !strings.Contains(err.Error(), "response-cache-entries") {
		t.Errorf("--response-cache-entries -1: %v, want an error naming it", err)
	}
	if o, err := complete(t, "--gpu-cost-per-hour=2.5"); err != nil || o.Policy.Pricing.GPUUSDPerHour != 2.5 {
		t.Errorf("--gpu-cost-per-hour 2.5: pricing %+v, %v; want gpu_usd_per_hour 2.5", o.Policy.Pricing, err)
	}
}
