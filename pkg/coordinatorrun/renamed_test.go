package coordinatorrun

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestRenamedFlags: the coordinator's former flags of the policy's
// limits.queue_limit, --max-admitted-requests and --queue-limit, set it
// over the policy file, as the effective configuration logs it, and each
// logs one deprecation warning at start naming the policy key.
func TestRenamedFlags(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("limits: {queue_limit: 9, max_tokens_cap: 40}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		admitted int64 // queue_limit logged
		warnings []string
	}{
		{"former flag", []string{"--policy", policy, "--max-admitted-requests=3"}, 3,
			[]string{"flag --max-admitted-requests is deprecated, set limits.queue_limit in the --policy file"}},
		{"the policy's", []string{"--policy", policy}, 9, nil},
		{"former name", []string{"--policy", policy, "--queue-limit=3"}, 3,
			[]string{"flag --queue-limit is deprecated, set limits.queue_limit in the --policy file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // the coordinator stops as soon as it starts
			args := append([]string{"--http-addr=127.0.0.1:0", "--nats-listen=127.0.0.1:-1"}, tc.args...)
			var stdout, stderr bytes.Buffer
			mainWith(ctx, args, &stdout, &stderr, func(string) (*zap.Logger, error) { return zap.New(core), nil })
			var warnings []string
			for _, e := range logs.FilterLevelExact(zap.WarnLevel).FilterMessageSnippet("deprecated").All() {
				warnings = append(warnings, e.Message)
			}
			if !slices.Equal(warnings, tc.warnings) {
				t.Errorf("deprecation warnings %q, want %q", warnings, tc.warnings)
			}
			cfg := logs.FilterMessage("effective configuration").All()
			if len(cfg) != 1 {
				t.Fatalf("%d effective configuration lines (stderr %q)", len(cfg), stderr.String())
			}
			m := cfg[0].ContextMap()
			if m["queue_limit"] != tc.admitted || m["max_tokens_cap"] != int64(40) || m["policy"] != policy {
				t.Errorf("queue_limit %v, max_tokens_cap %v, policy %v; want %d, 40, %s", m["queue_limit"], m["max_tokens_cap"], m["policy"], tc.admitted, policy)
			}
		})
	}
}
