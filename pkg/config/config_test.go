package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    Policy
		wantErr error // nil: success; errInvalid or errAny otherwise
	}{
		{name: "empty file keeps defaults", yaml: "", want: Default()},
		{
			name: "full file",
			yaml: `
slo: {ttft_ms: 500, tpot_ms: 50, attainment: 0.95}
limits: {max_tokens_cap: 128, default_max_tokens: 8, queue_limit: 4}
prompt_budgets:
  default: 100
  routes: {/v1/chat/completions: 50}
  api_keys: {key-1234: 10}
routing: {local_prefill_below_tokens: 32, max_queued_prefill_tokens: 4096, weights: {prefill: {prefix: 0.5}}}
`,
			want: Policy{
				SLO:    SLO{TTFTMs: 500, TPOTMs: 50, Attainment: 0.95},
				Limits: Limits{MaxTokensCap: 128, DefaultMaxTokens: 8, QueueLimit: 4},
				Budgets: Budgets{
					Default: 100,
					Routes:  map[string]int{"/v1/chat/completions": 50},
					APIKeys: map[string]int{"key-1234": 10},
				},
				Routing: Routing{LocalPrefillBelowTokens: 32, MaxQueuedPrefillTokens: 4096, Weights: RoutingWeights{Prefill: PrefillWeights{Prefix: new(0.5)}}},
			},
		},
		{
			name: "partial limits keep other defaults",
			yaml: "limits: {queue_limit: 7}",
			want: func() Policy { p := Default(); p.Limits.QueueLimit = 7; return p }(),
		},
		{name: "unknown field", yaml: "limits: {max_tokens: 3}", wantErr: errAny},
		{name: "bad yaml", yaml: "slo: [", wantErr: errAny},
		{name: "negative slo", yaml: "slo: {ttft_ms: -1}", wantErr: ErrInvalid},
		{name: "attainment over 1", yaml: "slo: {attainment: 1.5}", wantErr: ErrInvalid},
		{name: "negative attainment", yaml: "slo: {attainment: -0.1}", wantErr: ErrInvalid},
		{name: "nan attainment", yaml: "slo: {attainment: .nan}", wantErr: ErrInvalid},
		{
			name: "no cap and default: the rest of the context",
			yaml: "limits: {max_tokens_cap: 0, default_max_tokens: 0}",
			want: Default(),
		},
		{
			name: "default without a cap",
			yaml: "limits: {default_max_tokens: 512}",
			want: func() Policy { p := Default(); p.Limits.DefaultMaxTokens = 512; return p }(),
		},
		{name: "negative cap", yaml: "limits: {max_tokens_cap: -1}", wantErr: ErrInvalid},
		{name: "negative default", yaml: "limits: {default_max_tokens: -1}", wantErr: ErrInvalid},
		{name: "default over cap", yaml: "limits: {max_tokens_cap: 8, default_max_tokens: 9}", wantErr: ErrInvalid},
		{name: "zero queue limit", yaml: "limits: {queue_limit: 0}", wantErr: ErrInvalid},
		{name: "negative budget", yaml: "prompt_budgets: {routes: {/x: -1}}", wantErr: ErrInvalid},
		{name: "negative routing", yaml: "routing: {max_queued_prefill_tokens: -1}", wantErr: ErrInvalid},
		{
			name: "auth files",
			yaml: "auth: {api_keys_file: /etc/pdserve/keys, metrics_token_file: /etc/pdserve/metrics-token}",
			want: func() Policy {
				p := Default()
				p.Auth = Auth{APIKeysFile: "/etc/pdserve/keys", MetricsTokenFile: "/etc/pdserve/metrics-token"}
				return p
			}(),
		},
		{name: "auth files the same", yaml: "auth: {api_keys_file: /k, metrics_token_file: /k}", wantErr: ErrInvalid},
		{name: "unknown auth field", yaml: "auth: {api_keys: /k}", wantErr: errAny},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.yaml))
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("Parse: %v", err)
			case tc.wantErr == errAny && err == nil, tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("Parse error = %v, want %v", err, tc.wantErr)
			case tc.wantErr != nil:
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Parse (-want +got):\n%s", diff)
			}
		})
	}
}

var errAny = errors.New("any error")

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte("limits: {max_tokens_cap: 64}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if p.Limits.MaxTokensCap != 64 {
		t.Errorf("MaxTokensCap = %d, want 64", p.Limits.MaxTokensCap)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) error = %v, want os.ErrNotExist", err)
	}
}

// Relative auth paths are relative to the policy file's directory.
func TestLoadAuthPaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte("auth: {api_keys_file: keys.txt, metrics_token_file: /abs/token}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Auth{APIKeysFile: filepath.Join(dir, "keys.txt"), MetricsTokenFile: "/abs/token"}
	if diff := cmp.Diff(want, p.Auth); diff != "" {
		t.Errorf("Auth (-want +got):\n%s", diff)
	}
}

// With authenticated keys the budget of a key is that of its name.
func TestNamedBudget(t *testing.T) {
	b := Budgets{
		Default: 100,
		Routes:  map[string]int{"/v1/chat/completions": 50},
		APIKeys: map[string]int{"team-a": 10},
	}
	tests := []struct {
		route, name string
		wantLimit   int
		wantSurface string
	}{
		{"/v1/completions", "team-a", 10, "api key team-a"},
		{"/v1/chat/completions", "team-b", 50, "route /v1/chat/completions"},
		{"/v1/completions", "team-b", 100, "default"},
		{"/v1/completions", "", 100, "default"},
	}
	for _, tc := range tests {
		t.Run(tc.route+"/"+tc.name, func(t *testing.T) {
			limit, surface := b.NamedBudget(tc.route, tc.name)
			if limit != tc.wantLimit || surface != tc.wantSurface {
				t.Errorf("NamedBudget(%q, %q) = %d, %q; want %d, %q", tc.route, tc.name, limit, surface, tc.wantLimit, tc.wantSurface)
			}
		})
	}
	if got := Redact("secret-key-9876"); got != "…9876" {
		t.Errorf("Redact = %q", got)
	}
}

func TestBudget(t *testing.T) {
	b := Budgets{
		Default: 100,
		Routes:  map[string]int{"/v1/chat/completions": 50},
		APIKeys: map[string]int{"secret-key-9876": 10, "abc": 0},
	}
	tests := []struct {
		route, key  string
		wantLimit   int
		wantSurface string
	}{
		{"/v1/completions", "", 100, "default"},
		{"/v1/chat/completions", "", 50, "route /v1/chat/completions"},
		{"/v1/chat/completions", "secret-key-9876", 10, "api key …9876"},
		{"/v1/completions", "unknown", 100, "default"},
		{"/v1/completions", "abc", 0, "api key …"},
	}
	for _, tc := range tests {
		t.Run(tc.route+"/"+tc.key, func(t *testing.T) {
			limit, surface := b.Budget(tc.route, tc.key)
			if limit != tc.wantLimit || surface != tc.wantSurface {
				t.Errorf("Budget(%q, %q) = %d, %q; want %d, %q", tc.route, tc.key, limit, surface, tc.wantLimit, tc.wantSurface)
			}
		})
	}
}

func TestAttainmentOrDefault(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{{0, DefaultAttainment}, {0.5, 0.5}, {1, 1}} {
		if got := (SLO{Attainment: tc.in}).AttainmentOrDefault(); got != tc.want {
			t.Errorf("AttainmentOrDefault(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
