package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"go.yaml.in/yaml/v3"
)

// Built-in defaults, used where neither the file nor a flag sets a value.
const (
	DefaultQueueLimit = 1024
)

// ErrInvalid is wrapped by every validation error of a policy.
var ErrInvalid = errors.New("config: invalid policy")

// Policy is the coordinator's serving policy.
type Policy struct {
	SLO           SLO           `yaml:"slo"`
	Limits        Limits        `yaml:"limits"`
	Budgets       Budgets       `yaml:"prompt_budgets"`
	Routing       Routing       `yaml:"routing"`
	Pricing       Pricing       `yaml:"pricing"`
	Auth          Auth          `yaml:"auth"`
	ResponseCache ResponseCache `yaml:"response_cache"`
	// Tiers are the model aliases clients may request, by alias
	// (objectives.go).
	Tiers map[string]Tier `yaml:"tiers"`
	// Objectives are the requests' TTFT budgets and priorities.
	Objectives Objectives `yaml:"objectives"`
}

// Auth names the files that authenticate clients (package apikey). Both
// are optional; a path relative in a policy file is relative to that
// file's directory (see Load). The coordinator's --api-keys and
// --metrics-token-file override them.
type Auth struct {
	// APIKeysFile is the key file: one "sha256:<hex> [name=…] [rpm=…]
	// [tpm=…]" line per key (package apikey). With it every /v1/ request
	// must carry one of its keys as Authorization: Bearer, and
	// Budgets.APIKeys are keyed by key name. "": no authentication.
	APIKeysFile string `yaml:"api_keys_file"`
	// MetricsTokenFile holds the bearer token /metrics requires. "":
	// /metrics is open.
	MetricsTokenFile string `yaml:"metrics_token_file"`
}

// SLO holds latency targets in milliseconds; 0 means no target. Requests
// meeting both targets count towards goodput.
type SLO struct {
	TTFTMs float64 `yaml:"ttft_ms"`
	TPOTMs float64 `yaml:"tpot_ms"`
	// Attainment is the fraction of requests that must meet both targets,
	// in [0, 1]; the online planner sizes the pools for it. 0 means
	// DefaultAttainment.
	Attainment float64 `yaml:"attainment"`
}

// DefaultAttainment is the SLO attainment target when the policy sets none.
const DefaultAttainment = 0.9

// AttainmentOrDefault returns Attainment, or DefaultAttainment when it is 0.
func (s SLO) AttainmentOrDefault() float64 {
	if s.Attainment == 0 {
		return DefaultAttainment
	}
	return s.Attainment
}

// Limits bounds what one request may ask and how many run at once.
type Limits struct {
	// MaxTokensCap is the largest max_tokens (or max_completion_tokens) a
	// request may ask, in tokens per choice; a request asking more gets a
	// 400. 0 (the default): no cap beyond the model's context, that is
	// max_model_len − prompt tokens.
	MaxTokensCap int `yaml:"max_tokens_cap"`
	// DefaultMaxTokens, when > 0, is the max_tokens of a request that gives
	// none, lowered to what is left of the model's context after the
	// prompt. 0 (the default): the rest of the context, capped by
	// MaxTokensCap, as vLLM does. At most MaxTokensCap when that is set.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// QueueLimit is the number of requests admitted at once (reading their
	// body, waiting for a worker or running; a batched /v1/completions
	// request takes one per prompt); one more is refused with 429.
	QueueLimit int `yaml:"queue_limit"`
}

// Budgets holds prompt-token budgets by surface. A request's budget is that
// of its API key when the key is listed, else that of its route when the
// route is listed, else Default. 0 means unlimited.
type Budgets struct {
	Default int            `yaml:"default"`
	Routes  map[string]int `yaml:"routes"`
	// APIKeys are keyed by the name of a key of Auth.APIKeysFile when
	// one is configured (see NamedBudget), else by the key as the client
	// sends it (see Budget): without a key file nobody is authenticated
	// and a key only selects a budget.
	APIKeys map[string]int `yaml:"api_keys"`
}

// Default returns the built-in policy: no SLO, no prompt budget, no
// max_tokens cap beyond the model's context (and the rest of the context
// as the default max_tokens), the default queue limit, always remote
// prefill.
func Default() Policy {
	return Policy{Limits: Limits{QueueLimit: DefaultQueueLimit}}
}

// Load reads and validates the policy file at path. Fields absent from the
// file keep their defaults; relative auth file paths are made relative to
// the policy file's directory. Errors: file errors, YAML errors (unknown
// fields included), and errors wrapping ErrInvalid.
func Load(path string) (Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Policy{}, fmt.Errorf("config: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		return Policy{}, fmt.Errorf("config: %s: %w", path, err)
	}
	for _, f := range []*string{&p.Auth.APIKeysFile, &p.Auth.MetricsTokenFile} {
		if *f != "" && !filepath.IsAbs(*f) {
			*f = filepath.Join(filepath.Dir(path), *f)
		}
	}
	return p, nil
}

// Parse decodes a YAML policy over the defaults and validates it. Unknown
// fields are errors, so that a typo does not silently drop a budget; a
// removed one (routing.prefix_weight) is an error wrapping ErrInvalid
// that says what to set instead.
func Parse(data []byte) (Policy, error) {
	p := Default()
	if err := checkRemoved(data); err != nil {
		return Policy{}, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil && !errors.Is(err, io.EOF) {
		return Policy{}, fmt.Errorf("config: parse: %w", err)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// Validate reports the first problem found, wrapping ErrInvalid.
func (p Policy) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
	}
	switch {
	case !(p.SLO.TTFTMs >= 0) || !(p.SLO.TPOTMs >= 0):
		return bad("slo targets must be ≥ 0 (ttft_ms %v, tpot_ms %v)", p.SLO.TTFTMs, p.SLO.TPOTMs)
	case !(p.SLO.Attainment >= 0 && p.SLO.Attainment <= 1):
		return bad("slo.attainment must lie in [0, 1] (0: %v), got %v", DefaultAttainment, p.SLO.Attainment)
	case p.Limits.MaxTokensCap < 0:
		return bad("limits.max_tokens_cap must be ≥ 0 (0: no cap beyond the context), got %d", p.Limits.MaxTokensCap)
	case p.Limits.DefaultMaxTokens < 0:
		return bad("limits.default_max_tokens must be ≥ 0 (0: the rest of the context), got %d", p.Limits.DefaultMaxTokens)
	case p.Limits.MaxTokensCap > 0 && p.Limits.DefaultMaxTokens > p.Limits.MaxTokensCap:
		return bad("limits.default_max_tokens %d is over limits.max_tokens_cap %d", p.Limits.DefaultMaxTokens, p.Limits.MaxTokensCap)
	case p.Limits.QueueLimit <= 0:
		return bad("limits.queue_limit must be > 0, got %d", p.Limits.QueueLimit)
	case p.Budgets.Default < 0:
		return bad("prompt_budgets.default must be ≥ 0, got %d", p.Budgets.Default)
	case p.Auth.APIKeysFile != "" && p.Auth.APIKeysFile == p.Auth.MetricsTokenFile:
		return bad("auth.api_keys_file and auth.metrics_token_file are the same file %q: a key file holds hashes, a token file the token", p.Auth.APIKeysFile)
	}
	for _, m := range []struct {
		name string
		m    map[string]int
	}{{"routes", p.Budgets.Routes}, {"api_keys", p.Budgets.APIKeys}} {
		for _, k := range sortedKeys(m.m) {
			if k == "" || m.m[k] < 0 {
				return bad("prompt_budgets.%s: entry %q must have a non-empty name and a budget ≥ 0", m.name, redact(m.name, k))
			}
		}
	}
	if err := p.Routing.validate(); err != nil {
		return err
	}
	if err := p.ResponseCache.validate(); err != nil {
		return err
	}
	if err := validateTiers(p.Tiers); err != nil {
		return err
	}
	if err := p.Objectives.validate(); err != nil {
		return err
	}
	return p.Pricing.validate()
}

// Budget returns the prompt-token budget of a request on route with apiKey
// ("" when the request carries none), and a name of the surface it came
// from for error messages and logs ("api key …abcd", "route /v1/…",
// "default"). The API key itself never appears in the name. A budget of 0
// means unlimited.
func (b Budgets) Budget(route, apiKey string) (limit int, surface string) {
	if apiKey != "" {
		if n, ok := b.APIKeys[apiKey]; ok {
			return n, "api key " + redact("api_keys", apiKey)
		}
	}
	if n, ok := b.Routes[route]; ok {
		return n, "route " + route
	}
	return b.Default, "default"
}

// NamedBudget is Budget for a request authenticated as the key named
// keyName (package apikey): the name, not the key, selects an APIKeys
// entry, and the surface is "api key NAME". keyName "" falls back to the
// route and the default.
func (b Budgets) NamedBudget(route, keyName string) (limit int, surface string) {
	if keyName != "" {
		if n, ok := b.APIKeys[keyName]; ok {
			return n, "api key " + keyName
		}
	}
	return b.Budget(route, "")
}

// Redact returns what may be shown of an entry of APIKeys that may be a
// key itself: "…" and its last 4 characters.
func Redact(key string) string { return redact("api_keys", key) }

// redact keeps the last 4 characters of an API key.
func redact(kind, key string) string {
	if kind != "api_keys" {
		return key
	}
	if len(key) <= 4 {
		return "…"
	}
	return "…" + key[len(key)-4:]
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
