package coordinator

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/region"
	"github.com/pdserve/pdserve/pkg/respstore"
	"github.com/pdserve/pdserve/pkg/tracing"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// Serving modes.
const (
	ModeDisaggregated = vocab.ModeDisaggregated // prefill and decode on separate workers
	ModeColocated     = vocab.ModeColocated     // colocated workers prefill and decode
)

// First-token policies: which worker's first token reaches the client.
const (
	// PolicyPrefill sends the prefill worker's first token at once, so the
	// KV transfer lands in the first inter-token gap.
	PolicyPrefill = vocab.PolicyPrefill
	// PolicyDecode waits for the decode worker's first event, so the KV
	// transfer is part of TTFT.
	PolicyDecode = vocab.PolicyDecode
)

// Options configure a coordinator. Start from DefaultOptions, then
// AddFlags and parse, or set fields; then Complete and Validate.
type Options struct {
	// HTTPAddr is the listen address of the OpenAI API, /healthz, /readyz
	// and /metrics (host:port; port 0 picks a free one). Default
	// 127.0.0.1:8080: loopback only, as llama-server and ollama listen.
	HTTPAddr string
	// NATSURL is the control plane; empty starts an embedded NATS server
	// on NATSListen.
	NATSURL string
	// NATSListen is the embedded NATS server's address (host:port; port -1
	// picks a free one). Empty: a free port on 127.0.0.1 in standalone mode
	// (nothing outside the process connects to it, and a second standalone
	// server must not collide with the first), else 127.0.0.1:4222 (the
	// NATS default, for workers started apart).
	NATSListen string
	// NATS holds the credentials and TLS for the server at NATSURL
	// (--nats-user, --nats-password-file, --nats-token-file,
	// --nats-nkey-seed-file, --nats-creds, --nats-tls-*); with the
	// embedded server only --nats-reconnect-wait applies (the coordinator
	// logs in with a user generated in process).
	NATS control.ConnOptions
	// NATSAuthFile lists the embedded server's users (control.LoadUsers:
	// YAML, a role and optionally a worker id per user) for workers
	// started apart; standalone workers get generated users of their own.
	// Empty without --standalone: no worker can log in. Only without
	// NATSURL.
	NATSAuthFile string
	// NATSUsers are more users of the embedded server, given in code
	// (tests, programs embedding the coordinator). Not a flag.
	NATSUsers []control.NATSUser
	// Standalone starts PrefillWorkers prefill and DecodeWorkers decode
	// (or colocated) workers in this process.
	Standalone                    bool
	PrefillWorkers, DecodeWorkers int
	// Elastic starts the Standalone workers elastic (workerrun's
	// Options.Elastic; standalone.WithElasticWorkers): role commands, the
	// planner's with --planner-roles among them, move them between
	// prefill, decode and colocated. Only with Standalone.
	Elastic bool
	// Mode is ModeDisaggregated or ModeColocated.
	Mode string
	// Codec is the KV codec the prefill workers use; empty lets each
	// prefill worker use its own default. Checked at start (a codec
	// name, auto or auto-lossy), and against each worker's heartbeat
	// (control.Heartbeat.Codecs): a worker whose KV it cannot code is
	// refused.
	Codec string
	// BlockTokens is the deployment's block size in tokens
	// (--block-tokens): of the prompt prefix hashes the router matches
	// against the workers' caches, and of the KV room it estimates. Every
	// worker's heartbeat must carry the same (control.Heartbeat
	// BlockTokens); one that differs is refused, logged and counted.
	// Standalone workers get it. > 0.
	BlockTokens int
	// FirstTokenPolicy is PolicyPrefill or PolicyDecode.
	FirstTokenPolicy string
	// PolicyEdits change the policy after the policy file (or the
	// default) loads and before it is validated, in order (Complete):
	// how code without a file (tests, loadtest's local deployments)
	// sets a policy, and what the deprecated PolicyFlags given do. Not a
	// flag.
	PolicyEdits []func(*config.Policy)
	// policyFlagsSet is the PolicyFlags given, by policy key.
	policyFlagsSet map[string]*policyFlagValue
	// FlagsSet names the flags given on the command line (SetFlags), so
	// that Validate can refuse WorkerOnlyFlags without --standalone. Not
	// a flag.
	FlagsSet map[string]bool
	// HeartbeatTTL: a worker not heard from for this long leaves.
	HeartbeatTTL time.Duration
	// WorkerNetworks lists the networks (CIDR prefixes, comma-separated)
	// the coordinator dials workers in (--worker-networks): a heartbeat
	// whose grpc_addr is an IP outside them is refused, and a host name
	// is dialed only at an address inside them. Empty: loopback
	// standalone (StandaloneWorkerNetworks), else the private ranges and
	// loopback (DefaultWorkerNetworks).
	WorkerNetworks string
	// KVIndexMaxBytes and KVIndexWorkerMaxBytes cap the memory of the
	// index of the workers' KV events, all workers together and one
	// worker (--kv-index-max-bytes, --kv-index-worker-max-bytes; see
	// control.KVIndexOptions). > 0; the first >= the second.
	KVIndexMaxBytes, KVIndexWorkerMaxBytes int64
	// ModelName is the model name served; empty serves the names the
	// workers report.
	ModelName string
	// ShutdownTimeout bounds the graceful drain of requests in flight.
	ShutdownTimeout time.Duration
	// RetryAfter is the Retry-After of 429 and 503 responses.
	RetryAfter time.Duration
	// MaxBodyBytes bounds a request body (bytes, > 0); a larger one gets
	// 413. With Policy.Limits.QueueLimit it bounds the memory held by
	// bodies: at most Policy.Limits.QueueLimit × MaxBodyBytes.
	MaxBodyBytes int64
	// ChatTemplateFile holds a Jinja chat template that renders chats in
	// place of the model's own (--chat-template-file): for a model whose
	// GGUF carries none, an outdated one, or one without tools. Read and
	// compiled at start. Empty: the model's.
	ChatTemplateFile string
	// MaxInFlightBodyBytes is the memory budget of the request bodies in
	// flight, all together (bytes; 0: none, Policy.Limits.QueueLimit × MaxBodyBytes
	// then bounds them): a body takes its Content-Length at admission
	// until its response ends; one that does not fit gets 429.
	MaxInFlightBodyBytes int64
	// HTTPReadHeaderTimeout bounds the reading of a request's headers
	// (> 0); a client slower than that has its connection closed.
	HTTPReadHeaderTimeout time.Duration
	// HTTPBodyIdleTimeout is the longest a request body may make no
	// progress (> 0); then the request gets 408 and its connection is
	// closed. It does not bound a response stream.
	HTTPBodyIdleTimeout time.Duration
	// HTTPBodyTimeout is the longest a whole request body may take to
	// arrive (> 0): a body trickled within the idle timeout still gets
	// 408 then, and its admission slot back.
	HTTPBodyTimeout time.Duration
	// HTTPWriteTimeout is the longest one write of a response may block
	// on a client that does not read (> 0); then the request is
	// cancelled and freed on every worker, counted in
	// pdserve_stream_stalled_cancels_total.
	HTTPWriteTimeout time.Duration
	// Responses bounds the stored responses of the Responses API, kept in
	// the JetStream key-value bucket of pkg/respstore on the control
	// plane's NATS (the embedded server enables JetStream for it; a
	// server at NATSURL must have it): their TTL, the bucket's bytes, a
	// response's bytes, an API key's count and bytes, the bucket's
	// replicas and storage.
	Responses respstore.Limits
	// LogLevel is debug, info, warn or error (used by coordinatorrun.Main's logger).
	LogLevel string
	// PolicyFile is the YAML policy file (pkg/config; --policy); empty:
	// defaults.
	PolicyFile string
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
	TLS grpcnet.TLSOptions
	// GRPCAuth holds the token the coordinator sends to the workers
	// (--grpc-token-file; see grpcauth). Standalone workers get the same;
	// without it they share tokens generated at start. Empty: no token.
	GRPCAuth grpcauth.Options
	// Keepalive pings the gRPC connections to the workers
	// (--grpc-keepalive-time, --grpc-keepalive-timeout); standalone
	// workers get the same. Zero: defaults.
	Keepalive grpcnet.KeepaliveOptions
	// Tracing exports OpenTelemetry traces over OTLP (--otel-endpoint,
	// --otel-protocol, --otel-sample-ratio and the OTEL_* environment;
	// pkg/tracing): off without an endpoint. Standalone workers share
	// the coordinator's provider.
	Tracing tracing.Options
	// Auth authenticates the API's clients (--api-keys,
	// --metrics-token-file, --auth-reload-interval; see auth.go).
	Auth AuthOptions
	// KVHashKeyFile holds the deployment's secret that keys the prompts'
	// block hashes (--kv-hash-key-file; kv.LoadHashKey): every worker
	// must have the same (its heartbeat's hash_key_id), one that differs
	// is refused. Empty: HashKey as set in code (package standalone
	// generates one), else public hashes, which anyone can compute from
	// known text (logged at start).
	KVHashKeyFile string
	// HashKey is the key of the block hashes: read from KVHashKeyFile by
	// Complete, or set in code. Not a flag.
	HashKey kv.HashKey
	// Region federates this deployment with other regions (--region,
	// --region-gateway-listen, --region-gateway, --region-advertise-url,
	// --region-tls-*; package region): the embedded NATS server becomes a
	// gateway of the regions' supercluster, and a request another region
	// serves within its TTFT budget when this one cannot is forwarded
	// there. Zero: no regions.
	Region region.Options
	// RegionInterval is how often the region summary and probes go out
	// (0: 1 s); a region is gone after three. Not a flag (tests).
	RegionInterval time.Duration

	// Policy is the effective serving policy, set by Complete. Not a flag.
	Policy config.Policy
	// Extensions run beside the request path and observe every completed
	// request (see Extension): the online planner, package plannerhost.
	// Not a flag.
	Extensions []Extension

	// The fields below are set in code by package standalone, which
	// starts workers in this process before the coordinator. Not flags.

	// Tokenizer, when set, is used instead of the one Engine selects
	// (the in-process workers' own). The coordinator does not close it.
	Tokenizer engine.Tokenizer
	// TracerProvider, when set, traces the requests instead of a
	// provider built from Tracing (package standalone builds one for the
	// whole process); the coordinator does not shut it down.
	TracerProvider trace.TracerProvider
	// Registry, when set, is the registry served on /metrics (nil: a new
	// one); the coordinator registers its metrics and the Go and process
	// collectors in it.
	Registry *prometheus.Registry
	// BeforeNATSDrain, when set, is called by Shutdown after the HTTP
	// drain and before the NATS connection is drained (in-process
	// workers stop then, while their heartbeats still reach NATS); its
	// error is part of Shutdown's.
	BeforeNATSDrain func(ctx context.Context) error
}

// DefaultMaxBodyBytes is the default of --max-body-bytes: 16 MiB.
const DefaultMaxBodyBytes = 16 << 20

// DefaultMaxInFlightBodyBytes is the default of --max-inflight-body-bytes:
// 256 MiB, sixteen bodies of the largest size at once (and thousands of
// ordinary ones).
const DefaultMaxInFlightBodyBytes = 256 << 20

// DefaultOptions returns the flag defaults.
func DefaultOptions() Options {
	return Options{
		HTTPAddr:              "127.0.0.1:8080",
		PrefillWorkers:        1,
		DecodeWorkers:         1,
		Mode:                  ModeDisaggregated,
		FirstTokenPolicy:      PolicyPrefill,
		BlockTokens:           prefixcache.DefaultBlockTokens,
		HeartbeatTTL:          5 * time.Second,
		KVIndexMaxBytes:       control.DefaultKVIndexMaxBytes,
		KVIndexWorkerMaxBytes: control.DefaultKVIndexWorkerMaxBytes,
		ShutdownTimeout:       30 * time.Second,
		RetryAfter:            time.Second,
		LogLevel:              "info",
		Engine:                enginecfg.DefaultOptions(),
		Auth:                  AuthOptions{ReloadInterval: DefaultAuthReloadInterval},
		Policy:                config.Default(),
		Tracing:               tracing.NewOptions("pdserve-coordinator"),

		MaxBodyBytes:          DefaultMaxBodyBytes,
		MaxInFlightBodyBytes:  DefaultMaxInFlightBodyBytes,
		HTTPBodyTimeout:       60 * time.Second,
		HTTPWriteTimeout:      30 * time.Second,
		HTTPReadHeaderTimeout: 10 * time.Second,
		HTTPBodyIdleTimeout:   30 * time.Second,
		Responses:             respstore.DefaultLimits(),
	}
}

// AddFlags registers the coordinator's flags on fs with o's values as
// defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "listen address of the OpenAI API, /healthz, /readyz and /metrics (the default listens on loopback only; :8080 listens on every interface)")
	fs.StringVar(&o.NATSURL, "nats-url", o.NATSURL, "NATS URL of the control plane (empty: start an embedded NATS server on --nats-listen)")
	fs.StringVar(&o.NATSListen, "nats-listen", o.NATSListen, "listen address of the embedded NATS server, host:port (port -1: any free port; empty: a free port on 127.0.0.1 with --standalone, else "+defaultNATSListen+")")
	fs.StringVar(&o.NATSAuthFile, "nats-auth-file", o.NATSAuthFile, "YAML file of the embedded NATS server's users for workers started apart (users: [{user, password (plain or bcrypt), role, id}]; see the README)")
	o.NATS.AddFlags(fs)
	fs.BoolVar(&o.Standalone, "standalone", o.Standalone, "start prefill and decode (or colocated) workers in this process")
	fs.IntVar(&o.PrefillWorkers, "prefill-workers", o.PrefillWorkers, "standalone: prefill workers to start (disaggregated mode)")
	fs.IntVar(&o.DecodeWorkers, "decode-workers", o.DecodeWorkers, "standalone: decode workers to start (colocated workers in colocated mode)")
	fs.BoolVar(&o.Elastic, "elastic", o.Elastic, "standalone: start the workers elastic, so that the coordinator (a role command, or the planner with --planner-roles) may move them between prefill, decode and colocated at run time with their models loaded")
	fs.StringVar(&o.Mode, "mode", o.Mode, "serving mode: disaggregated (prefill and decode workers) or colocated")
	fs.StringVar(&o.KVHashKeyFile, "kv-hash-key-file", o.KVHashKeyFile, "file holding the deployment's secret (at least 32 bytes, e.g. openssl rand -hex 32) that keys the prompts' KV block hashes, so that nobody can compute them from known text; every worker and the coordinator must have the same (a worker whose heartbeat's key id differs is refused); empty: public hashes, logged at start (standalone: a key generated at start)")
	fs.IntVar(&o.BlockTokens, "block-tokens", o.BlockTokens, "tokens per block of the prompt prefix hashes and the KV room estimate: every worker's --block-tokens must be the same (a worker whose heartbeat differs is refused)")
	fs.StringVar(&o.Codec, "codec", o.Codec, "KV codec for transfers: none, s2, zstd, bf16, fp8 or int8; auto (the lossless one that delivers soonest on the measured link, chosen per transfer by the prefill worker) or auto-lossy (fp8 and int8 too) (empty: the prefill worker's default)")
	fs.StringVar(&o.FirstTokenPolicy, "first-token-policy", o.FirstTokenPolicy, "first token to the client from the prefill worker at once (prefill: KV transfer in the first inter-token gap) or from the decode worker (decode: KV transfer in TTFT)")
	fs.DurationVar(&o.HeartbeatTTL, "heartbeat-ttl", o.HeartbeatTTL, "a worker not heard from for this long leaves the membership")
	fs.StringVar(&o.WorkerNetworks, "worker-networks", o.WorkerNetworks, "networks (comma-separated CIDR prefixes) the coordinator dials workers in: a heartbeat whose gRPC address is outside them is refused, a host name is dialed only at an address inside them (empty: loopback with --standalone, else "+DefaultWorkerNetworks+")")
	fs.Int64Var(&o.KVIndexMaxBytes, "kv-index-max-bytes", o.KVIndexMaxBytes, "memory cap of the index of every worker's KV events together, bytes; beyond it the worker holding the most blocks loses some (counted in pdserve_coordinator_kv_index_blocks_dropped_total)")
	fs.Int64Var(&o.KVIndexWorkerMaxBytes, "kv-index-worker-max-bytes", o.KVIndexWorkerMaxBytes, "memory cap of one worker's share of the KV events index, bytes; its blocks beyond it are left out, and it bounds the parts of a snapshot")
	fs.StringVar(&o.ModelName, "model-name", o.ModelName, "model name served in the API (empty: the names the workers report)")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long a graceful stop waits for requests in flight")
	fs.DurationVar(&o.RetryAfter, "retry-after", o.RetryAfter, "Retry-After sent with 429 and 503 responses")
	fs.Int64Var(&o.MaxBodyBytes, "max-body-bytes", o.MaxBodyBytes, "largest request body in bytes; a larger one gets 413")
	fs.StringVar(&o.ChatTemplateFile, "chat-template-file", o.ChatTemplateFile, "Jinja chat template (a file) that renders chats instead of the model's tokenizer.chat_template, as vLLM's --chat-template and llama-server's --chat-template-file (empty: the model's)")
	fs.Int64Var(&o.MaxInFlightBodyBytes, "max-inflight-body-bytes", o.MaxInFlightBodyBytes, "memory budget in bytes of the request bodies in flight, all together: a body takes its size at admission until its response ends; one that does not fit gets 429 (0: none)")
	fs.DurationVar(&o.HTTPReadHeaderTimeout, "http-read-header-timeout", o.HTTPReadHeaderTimeout, "how long a client may take to send a request's headers before its connection is closed")
	fs.DurationVar(&o.HTTPBodyIdleTimeout, "http-body-idle-timeout", o.HTTPBodyIdleTimeout, "how long a request body may make no progress before the request gets 408 (response streams are not bounded)")
	fs.DurationVar(&o.HTTPBodyTimeout, "http-body-timeout", o.HTTPBodyTimeout, "how long a whole request body may take to arrive before the request gets 408, however steadily it trickles")
	fs.DurationVar(&o.HTTPWriteTimeout, "http-write-timeout", o.HTTPWriteTimeout, "how long one write of a response may block on a client that does not read before the request is cancelled and freed")
	fs.DurationVar(&o.Responses.TTL, "responses-ttl", o.Responses.TTL, "how long a stored response of /v1/responses is kept (the NATS key-value bucket's max age)")
	fs.Int64Var(&o.Responses.MaxBytes, "responses-max-bytes", o.Responses.MaxBytes, "bytes of all stored responses together (the bucket's bound; the embedded NATS server's JetStream is given as many)")
	fs.IntVar(&o.Responses.MaxPerOwner, "responses-max-per-key", o.Responses.MaxPerOwner, "stored responses an API key keeps; its oldest are evicted beyond")
	fs.Int64Var(&o.Responses.MaxBytesPerOwner, "responses-max-bytes-per-key", o.Responses.MaxBytesPerOwner, "bytes of stored responses an API key keeps; its oldest are evicted beyond")
	fs.IntVar(&o.Responses.Replicas, "responses-replicas", o.Responses.Replicas, "replicas of the stored responses' bucket in a NATS cluster, 1..5")
	fs.BoolVar(&o.Responses.Memory, "responses-in-memory", o.Responses.Memory, "keep the stored responses' bucket in the NATS server's memory (false: on its disk)")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "log level: debug, info, warn or error")
	fs.StringVar(&o.PolicyFile, "policy", o.PolicyFile, "YAML policy file: SLOs, prompt-token budgets per API key and route, limits, routing")
	o.TLS.AddFlags(fs)
	o.Region.AddFlags(fs)
	o.GRPCAuth.AddFlags(fs, false)
	o.Keepalive.AddFlags(fs)
	o.Engine.AddFlags(fs)
	o.Auth.addFlags(fs)
	o.Tracing.AddFlags(fs)
	o.addPolicyFlags(fs)
}

// WorkerOnlyFlags are the coordinator's flags that only its standalone
// workers read: without --standalone, Validate refuses them, naming them.
// Of the engine flags the coordinator itself reads --engine, --model and
// --llama-lib, --llama-cpu-variant, --llama-device (with --engine
// llamacpp it loads the model's tokenizer and chat template).
var WorkerOnlyFlags = []string{"prefill-workers", "decode-workers", "preset", "seed", "engine-threads", "profile", "time-scale",
	"payload-scale", "gpu-layers", "ctx-size", "kv-type", "max-seqs", "no-repack"}

// workerOnlyGiven returns the WorkerOnlyFlags given (FlagsSet) without
// --standalone, in WorkerOnlyFlags' order.
func (o Options) workerOnlyGiven() []string {
	if o.Standalone {
		return nil
	}
	var given []string
	for _, f := range WorkerOnlyFlags {
		if o.FlagsSet[f] {
			given = append(given, f)
		}
	}
	return given
}

// SetFlags records in FlagsSet the flags fs was given (call it after
// fs.Parse, before Validate).
func (o *Options) SetFlags(fs *flag.FlagSet) {
	o.FlagsSet = make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { o.FlagsSet[f.Name] = true })
}

// Embedded NATS addresses when NATSListen is empty.
const (
	standaloneNATSListen = "127.0.0.1:-1"
	defaultNATSListen    = "127.0.0.1:4222"
)

// NATSListenAddr returns the embedded NATS server's address: NATSListen,
// or its default for the mode when empty (a free port on loopback in
// standalone mode).
func (o Options) NATSListenAddr() string {
	switch {
	case o.NATSListen != "":
		return o.NATSListen
	case o.Standalone:
		return standaloneNATSListen
	}
	return defaultNATSListen
}

// tlsUse is what the coordinator does over gRPC: it dials workers; in
// standalone mode its workers serve with the same TLS settings.
func (o Options) tlsUse() grpcnet.TLSUse {
	if o.Standalone {
		return grpcnet.TLSDial | grpcnet.TLSServe
	}
	return grpcnet.TLSDial
}

// Complete loads the policy file (when given) into Policy, applies
// PolicyEdits (the deprecated PolicyFlags given among them) and validates
// the result, and checks the auth files (see auth.go). Errors: the files'
// errors, a policy the edits made invalid.
func (o *Options) Complete() error {
	p := config.Default()
	if o.PolicyFile != "" {
		var err error
		if p, err = config.Load(o.PolicyFile); err != nil {
			return fmt.Errorf("coordinator: %w", err)
		}
	}
	for _, edit := range o.PolicyEdits {
		edit(&p)
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("coordinator: policy: %w", err)
	}
	if err := o.Auth.complete(&p); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if o.KVHashKeyFile != "" {
		k, err := kv.LoadHashKey(o.KVHashKeyFile)
		if err != nil {
			return fmt.Errorf("coordinator: %w", err)
		}
		o.HashKey = k
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
		errs = append(errs, cliflags.BadFlag("http-addr", o.HTTPAddr, err))
	}
	if o.NATSURL == "" && o.NATSListen != "" {
		if _, _, err := net.SplitHostPort(o.NATSListen); err != nil {
			errs = append(errs, cliflags.BadFlag("nats-listen", o.NATSListen, err))
		}
	}
	if err := o.NATS.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.NATSURL == "" && o.NATS.Given() {
		bad("nats: --nats-user, --nats-*-file, --nats-creds and --nats-tls-* are for the server at --nats-url; the embedded server's coordinator logs in with generated credentials")
	}
	if o.NATSURL != "" && (o.NATSAuthFile != "" || len(o.NATSUsers) > 0) {
		bad("nats: --nats-auth-file lists the embedded server's users; with --nats-url the server at that URL has its own")
	}
	if err := control.ValidateUsers(o.NATSUsers); err != nil {
		bad("nats users: %v", err)
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
	if err := o.Responses.Validate(); err != nil {
		bad("--responses-*: %v", err)
	}
	if o.HeartbeatTTL <= 0 {
		bad("heartbeat-ttl %v must be positive", o.HeartbeatTTL)
	}
	if _, err := parseNetworks(o.workerNetworks()); err != nil {
		errs = append(errs, cliflags.BadFlag("worker-networks", o.WorkerNetworks, err))
	}
	if err := o.kvIndexOptions().Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.ShutdownTimeout <= 0 {
		bad("shutdown-timeout %v must be positive", o.ShutdownTimeout)
	}
	if o.RetryAfter <= 0 {
		bad("retry-after %v must be positive", o.RetryAfter)
	}
	if o.MaxBodyBytes <= 0 {
		bad("max-body-bytes %d must be positive", o.MaxBodyBytes)
	}
	if o.BlockTokens <= 0 {
		bad("block-tokens %d must be positive", o.BlockTokens)
	}
	if auto, _ := codecpick.AutoName(o.Codec); o.Codec != "" && !auto {
		if _, err := codec.ByName(o.Codec); err != nil {
			errs = append(errs, cliflags.BadFlag("codec", o.Codec, err))
		}
	}
	if o.HTTPReadHeaderTimeout <= 0 || o.HTTPBodyIdleTimeout <= 0 || o.HTTPBodyTimeout <= 0 || o.HTTPWriteTimeout <= 0 {
		bad("http-read-header-timeout %v, http-body-idle-timeout %v, http-body-timeout %v and http-write-timeout %v must be positive",
			o.HTTPReadHeaderTimeout, o.HTTPBodyIdleTimeout, o.HTTPBodyTimeout, o.HTTPWriteTimeout)
	}
	if o.MaxInFlightBodyBytes < 0 {
		bad("max-inflight-body-bytes %d must not be negative (0: none)", o.MaxInFlightBodyBytes)
	}
	if _, err := zapcore.ParseLevel(o.LogLevel); err != nil || o.LogLevel == "" {
		bad("log-level %q must be debug, info, warn or error", o.LogLevel)
	}
	if given := o.workerOnlyGiven(); len(given) > 0 {
		errs = append(errs, fmt.Errorf("--%s: worker flags, read only with --standalone (give them to the workers)", strings.Join(given, ", --")))
	}
	if o.Elastic && !o.Standalone {
		errs = append(errs, errors.New("--elastic: a worker flag, read only with --standalone (give it to the workers)"))
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
	if err := o.GRPCAuth.Validate(grpcauth.RoleCoordinator); err != nil {
		errs = append(errs, err)
	}
	if err := o.Region.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.NATSURL != "" && (o.Region.GatewayListen != "" || len(o.Region.Gateways) > 0) {
		bad("region: --region-gateway-listen and --region-gateway configure the embedded NATS server; with --nats-url, configure the gateways on that server")
	}
	if err := o.Keepalive.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, o.Auth.validate()...)
	if o.TracerProvider == nil {
		if err := o.Tracing.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
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
		zap.String("nats_url", control.RedactURL(o.NATSURL)),
		zap.String("nats_listen", o.NATSListenAddr()),
		zap.String("nats_auth_file", o.NATSAuthFile),
		zap.Bool("standalone", o.Standalone),
		zap.Bool("elastic", o.Elastic),
		zap.String("mode", o.Mode),
		zap.String("codec", o.Codec),
		zap.Int("block_tokens", o.BlockTokens),
		zap.String("kv_hash_key_file", o.KVHashKeyFile),
		zap.String("kv_hash_key_id", o.HashKey.ID()),
		zap.String("first_token_policy", o.FirstTokenPolicy),
		zap.Duration("heartbeat_ttl", o.HeartbeatTTL),
		zap.String("worker_networks", o.workerNetworks()),
		zap.Int64("kv_index_max_bytes", o.KVIndexMaxBytes),
		zap.Int64("kv_index_worker_max_bytes", o.KVIndexWorkerMaxBytes),
		zap.String("model_name", o.ModelName),
		zap.Duration("shutdown_timeout", o.ShutdownTimeout),
		zap.Duration("retry_after", o.RetryAfter),
		zap.Int64("max_body_bytes", o.MaxBodyBytes),
		zap.Duration("http_read_header_timeout", o.HTTPReadHeaderTimeout),
		zap.Duration("http_body_idle_timeout", o.HTTPBodyIdleTimeout),
		zap.Duration("http_body_timeout", o.HTTPBodyTimeout),
		zap.Duration("http_write_timeout", o.HTTPWriteTimeout),
		zap.Int64("max_inflight_body_bytes", o.MaxInFlightBodyBytes),
		zap.String("chat_template_file", o.ChatTemplateFile),
		zap.Bool("response_cache_share_across_keys", p.ResponseCache.ShareAcrossKeys),
		zap.String("log_level", o.LogLevel),
		zap.String("policy", o.PolicyFile),
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
		zap.Any("routing_decode_weights", p.Routing.DecodeWeights()),
		zap.Any("routing_prefill_weights", p.Routing.PrefillWeights()),
		zap.Int("prefill_queue_local_tokens", p.Routing.PrefillQueueLocalTokens),
		zap.Int("busy_local_prefill_below_tokens", p.Routing.BusyLocalPrefillBelowTokens),
		zap.Any("routing_weights", p.Routing.Weights),
		zap.String("routing_picker", p.Routing.Picker),
		zap.Float64("pricing_gpu_usd_per_hour", p.Pricing.GPUUSDPerHour),
		zap.Int("pricing_prefill_gpus_per_worker", p.Pricing.PrefillGPUsPerWorker),
		zap.Int("pricing_decode_gpus_per_worker", p.Pricing.DecodeGPUsPerWorker),
		zap.Float64("pricing_prompt_usd_per_1k_tokens", p.Pricing.PromptUSDPer1k),
		zap.Float64("pricing_output_usd_per_1k_tokens", p.Pricing.OutputUSDPer1k),
		zap.Int("response_cache_entries", p.ResponseCache.Entries),
		zap.Duration("response_cache_ttl", p.ResponseCache.TTLOrDefault()),
		zap.Int64("response_cache_max_bytes", p.ResponseCache.MaxBytesOrDefault()),
	}
	f = append(f, o.NATS.LogFields()...)
	f = append(f, o.TLS.LogFields()...)
	f = append(f, o.Region.LogFields()...)
	f = append(f, zap.String("grpc_token_file", o.GRPCAuth.TokenFile))
	f = append(f, o.Keepalive.LogFields()...)
	f = append(f, o.authLogFields()...)
	f = append(f, o.Tracing.LogFields()...)
	if o.Standalone {
		f = append(f, zap.Int("prefill_workers", o.PrefillWorkers), zap.Int("decode_workers", o.DecodeWorkers))
		f = append(f, o.Engine.LogFields()...)
	}
	return f
}

// workerNetworks returns WorkerNetworks, or its default for the mode.
func (o Options) workerNetworks() string {
	switch {
	case o.WorkerNetworks != "":
		return o.WorkerNetworks
	case o.Standalone:
		return StandaloneWorkerNetworks
	}
	return DefaultWorkerNetworks
}

// kvIndexOptions returns the KV index's caps.
func (o Options) kvIndexOptions() control.KVIndexOptions {
	return control.KVIndexOptions{MaxBytes: o.KVIndexMaxBytes, WorkerMaxBytes: o.KVIndexWorkerMaxBytes}
}
