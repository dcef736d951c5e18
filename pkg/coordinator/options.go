package coordinator

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// Serving modes.
const (
	ModeDisaggregated = "disaggregated" // prefill and decode on separate workers
	ModeColocated     = "colocated"     // colocated workers prefill and decode
)

// First-token policies: which worker's first token reaches the client.
const (
	// PolicyPrefill sends the prefill worker's first token at once, so the
	// KV transfer lands in the first inter-token gap.
	PolicyPrefill = "prefill"
	// PolicyDecode waits for the decode worker's first event, so the KV
	// transfer is part of TTFT.
	PolicyDecode = "decode"
)

// Options configure a coordinator. Start from DefaultOptions, then
// AddFlags and parse, or set fields; then Complete and Validate.
type Options struct {
	// HTTPAddr is the listen address of the OpenAI API, /healthz, /readyz
	// and /metrics (host:port; port 0 picks a free one).
	HTTPAddr string
	// NATSURL is the control plane; empty starts an embedded NATS server
	// on NATSListen.
	NATSURL string
	// NATSListen is the embedded NATS server's address (host:port; port -1
	// picks a free one).
	NATSListen string
	// Standalone starts PrefillWorkers prefill and DecodeWorkers decode
	// (or colocated) workers in this process.
	Standalone                    bool
	PrefillWorkers, DecodeWorkers int
	// Mode is ModeDisaggregated or ModeColocated.
	Mode string
	// Codec is the KV codec the prefill workers use; empty lets each
	// prefill worker use its own default.
	Codec string
	// FirstTokenPolicy is PolicyPrefill or PolicyDecode.
	FirstTokenPolicy string
	// MaxTokensCap, QueueLimit and LocalPrefillTokens override the policy
	// file when > 0 (see Complete).
	MaxTokensCap       int
	QueueLimit         int
	LocalPrefillTokens int
	// HeartbeatTTL: a worker not heard from for this long leaves.
	HeartbeatTTL time.Duration
	// ModelName is the model name served; empty serves the names the
	// workers report.
	ModelName string
	// ShutdownTimeout bounds the graceful drain of requests in flight.
	ShutdownTimeout time.Duration
	// RetryAfter is the Retry-After of 429 and 503 responses.
	RetryAfter time.Duration
	// LogLevel is debug, info, warn or error (used by Main's logger).
	LogLevel string
	// ConfigFile is the YAML policy file (pkg/config); empty: defaults.
	ConfigFile string
	// Engine selects the standalone workers' engine (--engine, --preset,
	// --seed, --engine-threads, --profile, --time-scale, --model, …).
	// Without --standalone, --engine llamacpp --model PATH makes the
	// coordinator tokenize with that model's vocabulary (loaded without
	// its weights), as the workers do.
	Engine enginecfg.Options
	// TLS secures the gRPC connections to the workers (--tls-cert,
	// --tls-key, --tls-ca, --tls-server-name): the CA verifies them, the
	// certificate is presented to workers that require client
	// certificates. Standalone workers serve with the same settings, so
	// standalone TLS needs the certificate. Empty: plaintext.
	TLS workerrun.TLSOptions
	// Planner configures the online planner (--planner, --planner-*,
	// --link-gbps, --gpu-cost-per-hour, --gpu-budget; see planner.go).
	Planner PlannerOptions

	// Policy is the effective serving policy, set by Complete. Not a flag.
	Policy config.Policy
	// WorkerOptions, when set, edits each standalone worker's options
	// before it starts (tests: heartbeat interval, KV blocks). Not a flag.
	WorkerOptions func(*workerrun.Options)
}

// DefaultOptions returns the flag defaults.
func DefaultOptions() Options {
	return Options{
		HTTPAddr:         ":8080",
		NATSListen:       "127.0.0.1:4222",
		PrefillWorkers:   1,
		DecodeWorkers:    1,
		Mode:             ModeDisaggregated,
		FirstTokenPolicy: PolicyPrefill,
		HeartbeatTTL:     5 * time.Second,
		ShutdownTimeout:  30 * time.Second,
		RetryAfter:       time.Second,
		LogLevel:         "info",
		Engine:           enginecfg.DefaultOptions(),
		Planner:          DefaultPlannerOptions(),
		Policy:           config.Default(),
	}
}

// AddFlags registers the coordinator's flags on fs with o's values as
// defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "listen address of the OpenAI API, /healthz, /readyz and /metrics")
	fs.StringVar(&o.NATSURL, "nats-url", o.NATSURL, "NATS URL of the control plane (empty: start an embedded NATS server on --nats-listen)")
	fs.StringVar(&o.NATSListen, "nats-listen", o.NATSListen, "listen address of the embedded NATS server, host:port (port -1: any free port)")
	fs.BoolVar(&o.Standalone, "standalone", o.Standalone, "start prefill and decode (or colocated) workers in this process")
	fs.IntVar(&o.PrefillWorkers, "prefill-workers", o.PrefillWorkers, "standalone: prefill workers to start (disaggregated mode)")
	fs.IntVar(&o.DecodeWorkers, "decode-workers", o.DecodeWorkers, "standalone: decode workers to start (colocated workers in colocated mode)")
	fs.StringVar(&o.Mode, "mode", o.Mode, "serving mode: disaggregated (prefill and decode workers) or colocated")
	fs.StringVar(&o.Codec, "codec", o.Codec, "KV codec for transfers: none, s2, zstd, bf16, fp8 or int8 (empty: the prefill worker's default)")
	fs.StringVar(&o.FirstTokenPolicy, "first-token-policy", o.FirstTokenPolicy, "first token to the client from the prefill worker at once (prefill: KV transfer in the first inter-token gap) or from the decode worker (decode: KV transfer in TTFT)")
	fs.IntVar(&o.MaxTokensCap, "max-tokens-cap", o.MaxTokensCap, fmt.Sprintf("largest max_tokens a request may ask (0: limits.max_tokens_cap of --config, else %d)", config.DefaultMaxTokensCap))
	fs.IntVar(&o.QueueLimit, "queue-limit", o.QueueLimit, fmt.Sprintf("requests admitted at once; more get 429 (0: limits.queue_limit of --config, else %d)", config.DefaultQueueLimit))
	fs.IntVar(&o.LocalPrefillTokens, "local-prefill-tokens", o.LocalPrefillTokens, "disaggregated mode: prompts with fewer uncached tokens prefill on the decode worker (0: routing.local_prefill_below_tokens of --config, else never)")
	fs.DurationVar(&o.HeartbeatTTL, "heartbeat-ttl", o.HeartbeatTTL, "a worker not heard from for this long leaves the membership")
	fs.StringVar(&o.ModelName, "model-name", o.ModelName, "model name served in the API (empty: the names the workers report)")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long a graceful stop waits for requests in flight")
	fs.DurationVar(&o.RetryAfter, "retry-after", o.RetryAfter, "Retry-After sent with 429 and 503 responses")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "log level: debug, info, warn or error")
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "YAML policy file: SLOs, prompt-token budgets per API key and route, limits, routing")
	o.TLS.AddFlags(fs)
	o.Engine.AddFlags(fs)
	o.Planner.AddFlags(fs)
}

// tlsUse is what the coordinator does over gRPC: it dials workers; in
// standalone mode its workers serve with the same TLS settings.
func (o Options) tlsUse() workerrun.TLSUse {
	if o.Standalone {
		return workerrun.TLSDial | workerrun.TLSServe
	}
	return workerrun.TLSDial
}

// Complete loads the policy file (when given) into Policy and applies the
// flags that override it. Errors: the file's errors.
func (o *Options) Complete() error {
	p := config.Default()
	if o.ConfigFile != "" {
		var err error
		if p, err = config.Load(o.ConfigFile); err != nil {
			return fmt.Errorf("coordinator: %w", err)
		}
	}
	if o.MaxTokensCap > 0 {
		p.Limits.MaxTokensCap = o.MaxTokensCap
		p.Limits.DefaultMaxTokens = min(p.Limits.DefaultMaxTokens, o.MaxTokensCap)
	}
	if o.QueueLimit > 0 {
		p.Limits.QueueLimit = o.QueueLimit
	}
	if o.LocalPrefillTokens > 0 {
		p.Routing.LocalPrefillBelowTokens = o.LocalPrefillTokens
	}
	o.Policy = p
	return nil
}

// Validate reports every invalid setting in one error. Call it after
// Complete.
func (o Options) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if _, _, err := net.SplitHostPort(o.HTTPAddr); err != nil {
		bad("http-addr %q: %v", o.HTTPAddr, err)
	}
	if o.NATSURL == "" {
		if _, _, err := net.SplitHostPort(o.NATSListen); err != nil {
			bad("nats-listen %q: %v", o.NATSListen, err)
		}
	}
	switch o.Mode {
	case ModeDisaggregated, ModeColocated:
	default:
		bad("mode %q must be %s or %s", o.Mode, ModeDisaggregated, ModeColocated)
	}
	switch o.FirstTokenPolicy {
	case PolicyPrefill, PolicyDecode:
	default:
		bad("first-token-policy %q must be %s or %s", o.FirstTokenPolicy, PolicyPrefill, PolicyDecode)
	}
	if o.MaxTokensCap < 0 || o.QueueLimit < 0 || o.LocalPrefillTokens < 0 {
		bad("max-tokens-cap, queue-limit and local-prefill-tokens must not be negative")
	}
	if o.HeartbeatTTL <= 0 {
		bad("heartbeat-ttl %v must be positive", o.HeartbeatTTL)
	}
	if o.ShutdownTimeout <= 0 {
		bad("shutdown-timeout %v must be positive", o.ShutdownTimeout)
	}
	if o.RetryAfter <= 0 {
		bad("retry-after %v must be positive", o.RetryAfter)
	}
	if _, err := zapcore.ParseLevel(o.LogLevel); err != nil || o.LogLevel == "" {
		bad("log-level %q must be debug, info, warn or error", o.LogLevel)
	}
	if o.Standalone {
		if o.DecodeWorkers <= 0 {
			bad("decode-workers %d must be positive in standalone mode", o.DecodeWorkers)
		}
		if o.Mode == ModeDisaggregated && o.PrefillWorkers <= 0 {
			bad("prefill-workers %d must be positive in standalone disaggregated mode", o.PrefillWorkers)
		}
		if err := o.Engine.Validate(); err != nil {
			errs = append(errs, err)
		}
	} else if o.Engine.Engine == enginecfg.Llama {
		if err := o.Engine.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := o.Policy.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := o.TLS.Validate(o.tlsUse()); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, o.validatePlanner()...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("coordinator: invalid options: %w", err)
	}
	return nil
}

// LogFields returns the effective settings as zap fields.
func (o Options) LogFields() []zap.Field {
	p := o.Policy
	f := []zap.Field{
		zap.String("http_addr", o.HTTPAddr),
		zap.String("nats_url", o.NATSURL),
		zap.String("nats_listen", o.NATSListen),
		zap.Bool("standalone", o.Standalone),
		zap.String("mode", o.Mode),
		zap.String("codec", o.Codec),
		zap.String("first_token_policy", o.FirstTokenPolicy),
		zap.Duration("heartbeat_ttl", o.HeartbeatTTL),
		zap.String("model_name", o.ModelName),
		zap.Duration("shutdown_timeout", o.ShutdownTimeout),
		zap.Duration("retry_after", o.RetryAfter),
		zap.String("log_level", o.LogLevel),
		zap.String("config", o.ConfigFile),
		zap.Int("max_tokens_cap", p.Limits.MaxTokensCap),
		zap.Int("default_max_tokens", p.Limits.DefaultMaxTokens),
		zap.Int("queue_limit", p.Limits.QueueLimit),
		zap.Int("prompt_budget_default", p.Budgets.Default),
		zap.Int("prompt_budget_routes", len(p.Budgets.Routes)),
		zap.Int("prompt_budget_api_keys", len(p.Budgets.APIKeys)),
		zap.Float64("slo_ttft_ms", p.SLO.TTFTMs),
		zap.Float64("slo_tpot_ms", p.SLO.TPOTMs),
		zap.Int("local_prefill_below_tokens", p.Routing.LocalPrefillBelowTokens),
		zap.Int("max_queued_prefill_tokens", p.Routing.MaxQueuedPrefillTokens),
		zap.Float64("prefix_weight", p.Routing.PrefixWeight),
	}
	f = append(f, o.TLS.LogFields()...)
	f = append(f, o.plannerLogFields()...)
	if o.Standalone {
		f = append(f, zap.Int("prefill_workers", o.PrefillWorkers), zap.Int("decode_workers", o.DecodeWorkers))
		f = append(f, o.Engine.LogFields()...)
	}
	return f
}
