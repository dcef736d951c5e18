package workerrun

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/decode"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/prefill"
	"github.com/pdserve/pdserve/pkg/tracing"
)

// Options configure one worker. Build them with NewPrefillOptions or
// NewDecodeOptions (which set the flag defaults), change fields or call
// AddFlags and parse, then Validate.
type Options struct {
	// Role is control.RolePrefill, RoleDecode or RoleColocated. Prefill
	// options apply to the first, decode options to the others.
	Role control.Role
	// ID names the worker in heartbeats and on its command subject; a NATS
	// subject token. Empty: "<role>-<random hex>".
	ID string
	// GRPCAddr is the gRPC listen address, host:port (port 0: any free
	// one; default DefaultGRPCAddr, loopback only: a worker that others
	// reach from other hosts is given its address, e.g. ":9000").
	GRPCAddr string
	// AdvertiseAddr is the gRPC address others dial, host:port. Empty: the
	// listen address, with the host name in place of an unspecified host.
	AdvertiseAddr string
	// MetricsAddr is the HTTP listen address of /metrics, /healthz and
	// /readyz (default DefaultMetricsAddr, loopback only). Empty: no HTTP
	// server.
	MetricsAddr string
	// NATSURL is the control plane. Empty: no heartbeats, no commands.
	NATSURL string
	// NATS holds the NATS credentials and TLS (--nats-user,
	// --nats-password-file, --nats-token-file, --nats-nkey-seed-file,
	// --nats-creds, --nats-tls-*, --nats-reconnect-wait).
	NATS control.ConnOptions
	// HeartbeatInterval is the time between heartbeats. > 0.
	HeartbeatInterval time.Duration
	// KVEvents publishes every block the prefix cache stores and removes,
	// and full snapshots, on NATS (control.KVPublisher): the coordinator
	// then knows the whole cache. Off: each heartbeat carries a digest of
	// at most prefixcache.DefaultDigestHashes hashes instead. No effect
	// without a prefix cache or a NATS URL.
	KVEvents bool
	// KVSnapshotInterval is the time between full KV snapshots, which
	// heal a lost KV event. > 0.
	KVSnapshotInterval time.Duration
	// DrainTimeout bounds how long Stop waits for requests in flight. > 0.
	DrainTimeout time.Duration
	// LogLevel is debug, info, warn or error; used by Main's logger.
	LogLevel string
	// FlagsFile is a YAML file of flag values (--flags-file; keys are flag
	// names, former names too); flags given on the command line win. Used
	// by Main (ApplyFlagsFile).
	FlagsFile string

	// PaceGbps paces KV transfers as over a link of that many Gbit/s
	// (--pace-gbps; 0: no pacing): a prefill worker's pushes and pulls, a
	// decode or colocated worker's pulls for its local prefills (the sim
	// engine's scaled payload then costs its true size).
	PaceGbps float64
	// KVConns is the number of connections per decode worker for KV
	// transfer. Prefill only. > 0.
	KVConns int

	// TLS secures the worker's gRPC server and, on prefill workers, the KV
	// transfers it dials. Empty: plaintext. See grpcnet.TLSOptions.
	TLS grpcnet.TLSOptions
	// GRPCAuth says who may call the worker's gRPC methods
	// (--grpc-verify-key: the coordinator's signed credentials for this
	// worker's ID; --grpc-token-file, --grpc-prefill-token-file,
	// --tls-allow-coordinator, --tls-allow-prefill), which token a prefill
	// worker sends on KV pushes, and the identities it requires of the
	// certificates of the peers it pushes KV to or pulls KV from
	// (--tls-worker-identity). Empty: anyone
	// (the worker warns at start). See grpcauth.
	GRPCAuth grpcauth.Options
	// PeersInProcess says that every peer this worker may pull KV from is
	// a worker of its own process (package standalone sets it when its
	// NATS admits no other worker): their identity needs no TLS. Without
	// it, peer pulls need TLS that verifies each peer's role and id, and
	// are off otherwise (logged at start). Not a flag.
	PeersInProcess bool
	// KVHashKeyFile holds the deployment's secret that keys the block
	// hashes of the prefix cache (--kv-hash-key-file, the coordinator's
	// flag of the same name and meaning; kv.LoadHashKey). Empty: HashKey
	// as set in code, else public hashes (warned at start).
	KVHashKeyFile string
	// HashKey is the key of the block hashes, read from KVHashKeyFile at
	// Start or set in code (package standalone). Not a flag.
	HashKey kv.HashKey
	// Keepalive pings the worker's gRPC connections, served and dialed
	// (--grpc-keepalive-time, --grpc-keepalive-timeout). Zero: defaults.
	Keepalive grpcnet.KeepaliveOptions

	Engine  enginecfg.Options
	Prefill prefill.Options
	Decode  decode.Options
	// Tracing exports OpenTelemetry traces over OTLP (--otel-endpoint,
	// --otel-protocol, --otel-sample-ratio and the OTEL_* environment;
	// pkg/tracing): a span per call from the coordinator and per step of
	// it. Off without an endpoint.
	Tracing tracing.Options
	// TracerProvider, when set, is used instead of a provider built from
	// Tracing (in-process workers share the coordinator's); the worker
	// does not shut it down. Not a flag.
	TracerProvider trace.TracerProvider

	// Registerer, when set, receives the worker's metrics, labelled
	// worker=<ID> (in-process workers sharing one registry). Nil: a
	// registry of the worker's own, with Go and process collectors,
	// served on MetricsAddr. Not a flag.
	Registerer prometheus.Registerer
	// EngineOverride, when set, is used instead of building an engine from
	// Engine; the worker does not close it. Not a flag.
	EngineOverride engine.Engine
	// Elastic lets the coordinator move the worker between prefill,
	// decode and colocated at run time (control.CmdRole, ChangeRole)
	// with its model loaded: the gRPC server serves every role's services
	// (another role's fail with UNAVAILABLE), both Prefill and Decode
	// options must be valid, and its NATS user needs
	// control.RoleElastic's permissions, and its gRPC credentials those
	// of a prefill worker (it sends KV as one). The role it does not
	// start in runs with that role's defaults (its flags are the other
	// binary's). Flag --elastic.
	Elastic bool
	// RoleChangeRestart, when > 0, makes an elastic worker's role change
	// stand for a Deployment replacing a pod instead: its running
	// sequences finish rather than move, and the new role starts this
	// long after the old one drained (the new pod's start and model
	// load). The loadtest's shift command compares the planner scaling
	// Deployments with elastic roles by it. Not a flag.
	RoleChangeRestart time.Duration
}

func commonOptions(role control.Role) Options {
	service := "pdserve-decode-worker"
	if role == control.RolePrefill {
		service = "pdserve-prefill-worker"
	}
	return Options{
		Tracing:            tracing.NewOptions(service),
		Role:               role,
		GRPCAddr:           DefaultGRPCAddr,
		MetricsAddr:        DefaultMetricsAddr,
		HeartbeatInterval:  time.Second,
		KVEvents:           true,
		KVSnapshotInterval: control.DefaultKVSnapshotInterval,
		DrainTimeout:       30 * time.Second,
		LogLevel:           "info",
		KVConns:            kvConnsDefault,
		Engine:             enginecfg.DefaultOptions(),
		Prefill:            prefill.DefaultOptions(),
		Decode:             decode.DefaultOptions(),
	}
}

// Default listen addresses: loopback only, as llama-server and ollama
// listen. A deployment whose workers are reached from other hosts gives
// the addresses (the Helm chart does: --grpc-addr=:PORT with
// --advertise-addr=$(POD_IP):PORT).
const (
	DefaultGRPCAddr    = "127.0.0.1:9000"
	DefaultMetricsAddr = "127.0.0.1:9090"
)

// kvConnsDefault is the default --kv-conns.
const kvConnsDefault = 4

// NewPrefillOptions returns the prefill worker's defaults.
func NewPrefillOptions() Options { return commonOptions(control.RolePrefill) }

// NewDecodeOptions returns the decode worker's defaults (role decode).
func NewDecodeOptions() Options { return commonOptions(control.RoleDecode) }

// roleValue is the --role flag of the decode worker binary.
type roleValue struct{ r *control.Role }

func (v roleValue) String() string {
	if v.r == nil {
		return ""
	}
	return string(*v.r)
}

func (v roleValue) Set(s string) error {
	switch r := control.Role(s); r {
	case control.RoleDecode, control.RoleColocated:
		*v.r = r
		return nil
	}
	return fmt.Errorf("role %q must be %s or %s", s, control.RoleDecode, control.RoleColocated)
}

// AddFlags registers the flags of o's role on fs, with o's values as
// defaults. Every worker: --id, --grpc-addr, --advertise-addr,
// --metrics-addr, --nats-url and the NATS credential flags
// (control.ConnOptions), --heartbeat-interval, --kv-events,
// --kv-snapshot-interval, --drain-timeout, --elastic,
// --log-level, --flags-file, --tls-cert, --tls-key, --tls-ca,
// --tls-server-name, --grpc-verify-key, --grpc-token-file,
// --grpc-prefill-token-file, --tls-allow-coordinator, --tls-allow-prefill,
// --tls-worker-identity (the certificates of the peers it pushes KV to or
// pulls KV from) (grpcauth), --grpc-keepalive-time,
// --grpc-keepalive-timeout and the engine flags (see enginecfg). Prefill:
// --chunk-tokens, --max-batch-tokens, --codec, --max-live-prefills,
// --retain-bytes, --pace-gbps, --kv-conns. Decode and colocated: --role,
// --kv-blocks, --block-tokens, --max-batch, --chunk-tokens,
// --max-batch-tokens, --reserve-ttl, --max-reservations-per-caller,
// --max-reserved-tokens-per-caller. The former name, until the next
// release (cliflags.AddRenamed): --config (--flags-file) on every worker.
// The prefill worker's former --link-gbps (--pace-gbps) and --queue-limit
// (--max-live-prefills) are gone: those names mean the planner's link
// bandwidth and the coordinator's admission limit.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.ID, "id", o.ID, "worker id in heartbeats and on the command subject (default <role>-<random hex>)")
	fs.StringVar(&o.GRPCAddr, "grpc-addr", o.GRPCAddr, "gRPC listen address, host:port (the default listens on loopback only; :9000 listens on every interface)")
	fs.StringVar(&o.AdvertiseAddr, "advertise-addr", o.AdvertiseAddr, "gRPC address other components dial, host:port (default: the listen address, with the host name for an unspecified host)")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "HTTP listen address of /metrics, /healthz and /readyz (empty: none; the default listens on loopback only)")
	fs.StringVar(&o.NATSURL, "nats-url", o.NATSURL, "NATS URL of the control plane (empty: no heartbeats or commands)")
	o.NATS.AddFlags(fs)
	fs.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", o.HeartbeatInterval, "time between heartbeats")
	fs.BoolVar(&o.KVEvents, "kv-events", o.KVEvents, "publish every block the prefix cache stores and removes, and snapshots, on NATS, so that the router sees the whole cache (false: heartbeats carry a digest of at most 4096 block hashes)")
	fs.DurationVar(&o.KVSnapshotInterval, "kv-snapshot-interval", o.KVSnapshotInterval, "time between full snapshots of the prefix cache's blocks on NATS (with --kv-events), which heal a lost event")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "how long a graceful stop waits for requests in flight")
	fs.BoolVar(&o.Elastic, "elastic", o.Elastic, "let the coordinator move the worker between prefill, decode and colocated at run time with its model loaded (its NATS user needs the elastic role's permissions, its gRPC credentials a prefill worker's; the role it does not start in runs with that role's defaults)")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "log level: debug, info, warn or error")
	fs.StringVar(&o.FlagsFile, "flags-file", o.FlagsFile, "YAML file of flag values, keys are flag names without dashes; command-line flags win")
	o.TLS.AddFlags(fs)
	o.GRPCAuth.AddFlags(fs, true)
	fs.StringVar(&o.KVHashKeyFile, "kv-hash-key-file", o.KVHashKeyFile, "file holding the deployment's secret (at least 32 bytes, e.g. openssl rand -hex 32) that keys the prompts' KV block hashes, so that nobody can compute them from known text; every worker and the coordinator must have the same (a worker whose heartbeat's key id differs is refused); empty: public hashes, warned at start")
	o.Keepalive.AddFlags(fs)
	o.Engine.AddFlags(fs)
	o.Tracing.AddFlags(fs)
	// Every role verifies the peers it calls: a prefill worker its decode
	// peers, any worker those it pulls KV from (peer pulls, migrations).
	o.GRPCAuth.AddWorkerIdentityFlag(fs)
	if o.Role == control.RolePrefill {
		o.Prefill.AddFlags(fs)
		fs.Float64Var(&o.PaceGbps, "pace-gbps", o.PaceGbps, "pace KV transfers (pushes and peer pulls) as over a link of this many Gbit/s (0: no pacing)")
		fs.IntVar(&o.KVConns, "kv-conns", o.KVConns, "connections per decode worker for KV transfer")
	} else {
		fs.Float64Var(&o.PaceGbps, "pace-gbps", o.PaceGbps, "pace the peer pulls of local prefills as over a link of this many Gbit/s (0: no pacing)")
		fs.Var(roleValue{&o.Role}, "role", "worker role: decode, or colocated (prefills locally too)")
		o.Decode.AddFlags(fs)
	}
	cliflags.AddRenamed(fs, cliflags.Renamed{Old: "config", New: "flags-file"})
}

// Validate reports every invalid setting in one error: "workerrun: invalid
// options: " over one error per setting, most naming their flag
// (cliflags.FlagError); cliflags.PrintError prints them a line each.
func (o Options) Validate() error {
	var errs []error
	if o.PaceGbps < 0 {
		errs = append(errs, cliflags.BadFlag("pace-gbps", fmt.Sprint(o.PaceGbps), errors.New("must not be negative")))
	}
	switch o.Role {
	case control.RolePrefill, control.RoleDecode, control.RoleColocated:
		if o.Role == control.RolePrefill || o.Elastic {
			if err := o.Prefill.Validate(); err != nil {
				errs = append(errs, err)
			}
			if o.KVConns <= 0 {
				errs = append(errs, cliflags.BadFlag("kv-conns", strconv.Itoa(o.KVConns), errors.New("must be positive")))
			}
		}
		if o.Role != control.RolePrefill || o.Elastic {
			if err := o.Decode.Validate(); err != nil {
				errs = append(errs, err)
			}
		}
	default:
		errs = append(errs, cliflags.BadFlag("role", string(o.Role), errors.New("must be prefill, decode or colocated")))
	}
	if o.ID != "" {
		if err := control.ValidToken(o.ID); err != nil {
			errs = append(errs, cliflags.BadFlag("id", o.ID, err))
		}
	}
	if _, _, err := net.SplitHostPort(o.GRPCAddr); err != nil {
		errs = append(errs, cliflags.BadFlag("grpc-addr", o.GRPCAddr, err))
	}
	if o.AdvertiseAddr != "" {
		if _, _, err := net.SplitHostPort(o.AdvertiseAddr); err != nil {
			errs = append(errs, cliflags.BadFlag("advertise-addr", o.AdvertiseAddr, err))
		}
	}
	if o.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(o.MetricsAddr); err != nil {
			errs = append(errs, cliflags.BadFlag("metrics-addr", o.MetricsAddr, err))
		}
	}
	if err := o.NATS.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.HeartbeatInterval <= 0 {
		errs = append(errs, cliflags.BadFlag("heartbeat-interval", o.HeartbeatInterval.String(), errors.New("must be positive")))
	}
	if o.KVSnapshotInterval <= 0 {
		errs = append(errs, cliflags.BadFlag("kv-snapshot-interval", o.KVSnapshotInterval.String(), errors.New("must be positive")))
	}
	if o.DrainTimeout <= 0 {
		errs = append(errs, cliflags.BadFlag("drain-timeout", o.DrainTimeout.String(), errors.New("must be positive")))
	}
	if _, err := zapcore.ParseLevel(o.LogLevel); err != nil || o.LogLevel == "" {
		errs = append(errs, cliflags.BadFlag("log-level", o.LogLevel, errors.New("must be debug, info, warn or error")))
	}
	if err := o.TLS.Validate(o.tlsUse()); err != nil {
		errs = append(errs, err)
	}
	if err := o.GRPCAuth.Validate(o.authSends()); err != nil {
		errs = append(errs, err)
	}
	if o.GRPCAuth.Identities() && (o.TLS.CAFile == "" || o.TLS.CertFile == "") {
		errs = append(errs, errors.New("tls-allow-coordinator and tls-allow-prefill need mutual TLS: tls-cert, tls-key and tls-ca (the worker then requires client certificates)"))
	}
	if o.TracerProvider == nil {
		if err := o.Tracing.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := o.Keepalive.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.EngineOverride == nil {
		if err := o.Engine.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("workerrun: invalid options: %w", err)
	}
	return nil
}

// tlsUse is what the worker does over gRPC: every worker serves; a
// prefill worker also dials decode workers for KV transfers.
func (o Options) tlsUse() grpcnet.TLSUse {
	if o.Role == control.RolePrefill || o.Elastic {
		return grpcnet.TLSServe | grpcnet.TLSDial
	}
	return grpcnet.TLSServe
}

// authSends is the role whose token the worker must send: a prefill (or
// elastic) worker sends the prefill token on KV pushes, so it needs the
// token itself. A decode worker needs none; given the prefill token
// itself it sends it on its KV pulls (grpcauth.Options.Validate).
func (o Options) authSends() grpcauth.Role {
	if o.Role == control.RolePrefill || o.Elastic {
		return grpcauth.RolePrefill
	}
	return 0
}

// LogFields returns the effective settings as zap fields.
func (o Options) LogFields() []zap.Field {
	f := []zap.Field{
		zap.String("role", string(o.Role)),
		zap.String("id", o.ID),
		zap.String("kv_hash_key_file", o.KVHashKeyFile),
		zap.String("grpc_addr", o.GRPCAddr),
		zap.String("advertise_addr", o.AdvertiseAddr),
		zap.String("metrics_addr", o.MetricsAddr),
		zap.String("nats_url", control.RedactURL(o.NATSURL)),
		zap.Duration("heartbeat_interval", o.HeartbeatInterval),
		zap.Bool("kv_events", o.KVEvents),
		zap.Duration("kv_snapshot_interval", o.KVSnapshotInterval),
		zap.Duration("drain_timeout", o.DrainTimeout),
		zap.Bool("elastic", o.Elastic),
		zap.String("log_level", o.LogLevel),
		zap.String("flags_file", o.FlagsFile),
	}
	f = append(f, o.NATS.LogFields()...)
	f = append(f, o.TLS.LogFields()...)
	f = append(f, o.GRPCAuth.LogFields()...)
	f = append(f, o.Keepalive.LogFields()...)
	f = append(f, o.Tracing.LogFields()...)
	if o.EngineOverride != nil {
		f = append(f, zap.String("engine", "override:"+o.EngineOverride.Spec().Name))
	} else {
		f = append(f, o.Engine.LogFields()...)
	}
	if o.Role == control.RolePrefill {
		p := o.Prefill
		f = append(f, p.Budget.LogFields()...)
		return append(f,
			zap.String("codec", p.Codec), zap.Int("max_live_prefills", p.MaxLivePrefills), zap.Int64("retain_bytes", p.RetainBytes),
			zap.Duration("retain_ttl", p.RetainTTL), zap.Int64("max_live_kv_bytes", p.MaxLiveKVBytes),
			zap.Float64("pace_gbps", o.PaceGbps), zap.Int("kv_conns", o.KVConns),
			zap.Int("block_tokens", p.PrefixCache.BlockTokens),
			zap.Int("prefix_cache_tokens", p.PrefixCache.MaxTokens), zap.Int("prefix_cache_entries", p.PrefixCache.MaxEntries), zap.Int64("host_cache_bytes", p.PrefixCache.HostBytes), zap.Float64("peer_link_gbps", p.PeerLinkGbps), zap.Int("peer_pull_verify_blocks", p.PeerPullVerifyBlocks), zap.String("disk_cache_dir", p.PrefixCache.DiskDir), zap.Int64("disk_cache_bytes", p.PrefixCache.DiskBytes))
	}
	d := o.Decode
	f = append(f, d.Budget.LogFields()...)
	return append(f, zap.Float64("pace_gbps", o.PaceGbps),
		zap.Int("kv_blocks", d.KVBlocks), zap.Int("block_tokens", d.BlockTokens), zap.Int("max_batch", d.MaxBatch),
		zap.Duration("reserve_ttl", d.ReserveTTL),
		zap.Int("max_reservations_per_caller", d.MaxReservationsPerCaller), zap.Int("max_reserved_tokens_per_caller", d.MaxReservedTokensPerCaller),
		zap.Int("prefix_cache_tokens", d.PrefixCache.MaxTokens), zap.Int("prefix_cache_entries", d.PrefixCache.MaxEntries), zap.Int64("host_cache_bytes", d.PrefixCache.HostBytes), zap.String("disk_cache_dir", d.PrefixCache.DiskDir), zap.Int64("disk_cache_bytes", d.PrefixCache.DiskBytes),
		zap.Float64("peer_link_gbps", d.PeerLinkGbps), zap.Int("peer_pull_verify_blocks", d.PeerPullVerifyBlocks),
		zap.Int("max_outbox_bytes", d.MaxOutboxBytes), zap.Duration("stream_write_timeout", d.StreamWriteTimeout))
}
