package standalone

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/tracing"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// Server is a started standalone deployment: the coordinator, whose
// methods it has, and its in-process workers. Its methods are safe for
// concurrent use.
type Server struct {
	*coordinator.Coordinator

	log     *zap.Logger
	ns      *server.Server   // embedded NATS, or nil
	gw      *control.Gateway // the region's gateway server, or nil
	jsDir   string           // its JetStream directory, "" when none
	workers []*workerrun.Worker
	// tracer exports the spans of the coordinator and the workers; nil
	// when Options.TracerProvider was given. Shut down last.
	tracer *tracing.Provider

	stopOnce sync.Once
	stopErr  error

	shutdownOnce sync.Once
	shutdownErr  error
}

// An Option changes how Start starts the deployment.
type Option func(*settings)

// settings are the Options of one Start.
type settings struct {
	worker  func(*workerrun.Options)
	elastic bool
}

// WithWorkerOptions has f edit each worker's options before the worker
// starts (tests: heartbeat interval, KV blocks, an engine of their own;
// the loadtest's local deployments: chunk sizes, link speed). Not a flag.
func WithWorkerOptions(f func(*workerrun.Options)) Option {
	return func(s *settings) { s.worker = f }
}

// WithElasticWorkers starts every in-process worker elastic
// (workerrun.Options.Elastic): each keeps its first role (prefill, decode
// or colocated) until a role command (control.CmdRole, from the
// coordinator's user, e.g. the planner's role moves) moves it, and its
// NATS user, without NATSURL, has control.RoleElastic's permissions.
// coordinator.Options.Elastic (--elastic) does the same.
func WithElasticWorkers() Option {
	return func(s *settings) { s.elastic = true }
}

// Start starts the workers and the coordinator from validated, completed
// options with Standalone set (see the package doc). It returns once the
// HTTP listener is open and the workers are started (they join the
// membership with their first heartbeat). ctx bounds only the start.
// Errors: invalid options, NATS, worker and coordinator start errors,
// wrapped; what was started is stopped again.
func Start(ctx context.Context, o coordinator.Options, log *zap.Logger, opts ...Option) (s *Server, err error) {
	var set settings
	for _, opt := range opts {
		opt(&set)
	}
	if !o.Standalone {
		return nil, errors.New("standalone: options without Standalone")
	}
	set.elastic = set.elastic || o.Elastic
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	s = &Server{log: log}
	defer func() {
		if err != nil {
			s.closeAll(context.Background())
			s = nil
		}
	}()
	if o.GRPCAuth, err = generatedGRPCAuth(o.GRPCAuth); err != nil {
		return s, fmt.Errorf("standalone: %w", err)
	}
	if o.TLS.Enabled() && o.GRPCAuth.WorkerIdentities == nil {
		// The in-process workers share the coordinator's certificate, and
		// only they hold the embedded server's generated NATS users.
		o.GRPCAuth.WorkerIdentities = []string{}
	}
	if !o.HashKey.Keyed() {
		// The processes of one server share a key generated now: nobody
		// outside computes a prompt's block hashes.
		o.HashKey = kv.GenerateHashKey()
	}
	specs := workerSpecs(o)
	// One trace exporter for the process: the coordinator's spans and its
	// workers' go out together.
	tp := o.TracerProvider
	if tp == nil {
		if s.tracer, err = tracing.New(ctx, o.Tracing); err != nil {
			return s, fmt.Errorf("standalone: %w", err)
		}
		tp = s.tracer.TracerProvider()
	}

	co := o // the coordinator's options
	co.Standalone, co.Elastic = false, false
	// The worker-only flags given are the workers' started here: the
	// coordinator, now without Standalone, would refuse them as given to it.
	co.FlagsSet = maps.Clone(o.FlagsSet)
	for _, f := range coordinator.WorkerOnlyFlags {
		delete(co.FlagsSet, f)
	}
	workerNATS := func(string) control.ConnOptions { return o.NATS }
	if o.NATSURL == "" {
		self := control.NewNATSUser(control.RoleCoordinator, "")
		users := []control.NATSUser{self}
		byID := make(map[string]control.NATSUser, len(specs))
		for _, w := range specs {
			role := w.role
			if set.elastic {
				role = control.RoleElastic
			}
			u := control.NewNATSUser(role, w.id)
			byID[w.id] = u
			users = append(users, u)
		}
		fromFile, err := coordinator.LoadNATSUsers(o.NATSAuthFile, log.Named("nats-server"))
		if err != nil {
			return s, fmt.Errorf("standalone: %w", err)
		}
		users = append(users, fromFile...)
		users = append(users, o.NATSUsers...)
		if s.gw, err = o.StartRegionGateway(log.Named("nats-gateway")); err != nil {
			return s, fmt.Errorf("standalone: %w", err)
		}
		var gw []control.EmbeddedOption
		if s.gw != nil {
			gw = append(gw, control.WithLeafRemote(s.gw))
		}
		if s.jsDir, err = os.MkdirTemp("", "pdserve-nats-"); err != nil {
			return s, fmt.Errorf("standalone: jetstream directory: %w", err)
		}
		if s.ns, co.NATSURL, err = control.StartEmbedded(o.NATSListenAddr(), append([]control.EmbeddedOption{control.WithUsers(users), control.WithLogger(log.Named("nats-server")),
			control.WithJetStream(s.jsDir, o.Responses.MaxBytes)}, gw...)...); err != nil {
			return s, fmt.Errorf("standalone: %w", err)
		}
		log.Info("embedded NATS server started", zap.String("url", co.NATSURL), zap.Int("users_from_file", len(fromFile)),
			zap.Int("standalone_worker_users", len(specs)))
		co.NATSAuthFile, co.NATSUsers = "", nil
		// The gateway is started: the coordinator, on this server's URL,
		// has none to start.
		co.Region.GatewayListen, co.Region.Gateways = "", nil
		co.NATS = withReconnectWait(self.ConnOptions(), o.NATS.ReconnectWait)
		workerNATS = func(id string) control.ConnOptions {
			return withReconnectWait(byID[id].ConnOptions(), o.NATS.ReconnectWait)
		}
	}

	reg := prometheus.NewRegistry()
	hostShare := hostTierShare(specs, log)
	for _, w := range specs {
		wo := workerrun.NewDecodeOptions()
		if w.role == control.RolePrefill {
			wo = workerrun.NewPrefillOptions()
		}
		wo.Role, wo.ID, wo.Elastic = w.role, w.id, set.elastic
		wo.Decode.BlockTokens, wo.Prefill.PrefixCache.BlockTokens = co.BlockTokens, co.BlockTokens
		if w.role == control.RolePrefill && wo.Prefill.PrefixCache.HostBytes == prefixcache.Auto {
			wo.Prefill.PrefixCache.HostBytes = hostShare
		}
		if w.role == control.RoleColocated && wo.Decode.PrefixCache.HostBytes == prefixcache.Auto {
			wo.Decode.PrefixCache.HostBytes = hostShare
		}
		wo.GRPCAddr, wo.MetricsAddr, wo.NATSURL = "127.0.0.1:0", "", co.NATSURL
		wo.NATS = workerNATS(w.id)
		wo.Engine = o.Engine
		wo.LogLevel = o.LogLevel
		wo.Registerer = reg
		wo.TLS = o.TLS
		wo.GRPCAuth = grpcauth.Options{TokenFile: o.GRPCAuth.TokenFile, Token: o.GRPCAuth.Token, PrefillToken: o.GRPCAuth.PrefillToken,
			VerifyKey: o.GRPCAuth.VerifyKey, WorkerIdentities: o.GRPCAuth.WorkerIdentities}
		wo.Keepalive = o.Keepalive
		wo.HashKey = o.HashKey
		// Only this process's workers join an embedded NATS without
		// users from a file: they may pull from each other unverified.
		wo.PeersInProcess = o.NATSURL == "" && o.NATSAuthFile == "" && !workerUsers(o.NATSUsers)
		wo.TracerProvider = tp
		if set.worker != nil {
			set.worker(&wo)
		}
		wk, err := workerrun.Start(ctx, wo, log.Named("worker"))
		if err != nil {
			return s, fmt.Errorf("standalone: worker %s: %w", w.id, err)
		}
		s.workers = append(s.workers, wk)
	}

	co.Registry = reg
	co.Tokenizer = s.workers[0].Engine().Tokenizer()
	engines := make(map[string]engine.Engine, len(s.workers))
	for _, w := range s.workers {
		engines[w.ID()] = w.Engine()
	}
	if x := newOverrunWarnings(engines); x != nil {
		co.Extensions = append(slices.Clip(co.Extensions), x)
	}
	co.BeforeNATSDrain = s.stopWorkers
	co.TracerProvider = tp
	if s.Coordinator, err = coordinator.Start(ctx, co, log); err != nil {
		return s, fmt.Errorf("standalone: %w", err)
	}
	return s, nil
}

// GatewayAddr returns the embedded NATS server's gateway listener (the
// regions' supercluster, coordinator Options.Region), "" without one.
func (s *Server) GatewayAddr() string {
	if s.gw == nil {
		return ""
	}
	return s.gw.Addr()
}

// Workers returns the in-process workers, prefill ones first. The caller
// must not Stop them while the server runs, except to test failures.
func (s *Server) Workers() []*workerrun.Worker { return slices.Clone(s.workers) }

// Shutdown stops the deployment gracefully: the coordinator's Shutdown
// (not ready, HTTP drain, the workers stopped, NATS drained), then the
// embedded NATS server. Later calls return the first call's result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() { s.shutdownErr = s.closeAll(ctx) })
	return s.shutdownErr
}

// closeAll stops what was started; safe after a partial Start.
func (s *Server) closeAll(ctx context.Context) error {
	var errs []error
	if s.Coordinator != nil {
		errs = append(errs, s.Coordinator.Shutdown(ctx))
	}
	errs = append(errs, s.stopWorkers(ctx)) // already done by a started coordinator
	if s.ns != nil {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	}
	s.gw.Shutdown()
	if s.jsDir != "" {
		_ = os.RemoveAll(s.jsDir) // a temporary directory of JetStream's (memory-only) bucket
	}
	errs = append(errs, s.tracer.Shutdown(ctx))
	return errors.Join(errs...)
}

// stopWorkers stops the workers once; later calls return the first
// call's result.
func (s *Server) stopWorkers(ctx context.Context) error {
	s.stopOnce.Do(func() {
		var errs []error
		for _, w := range s.workers {
			if err := w.Stop(ctx); err != nil {
				errs = append(errs, fmt.Errorf("standalone: stop worker %s: %w", w.ID(), err))
			}
		}
		s.stopErr = errors.Join(errs...)
	})
	return s.stopErr
}

// Run starts a standalone deployment, blocks until ctx ends or the HTTP
// server fails, and shuts down gracefully within Options.ShutdownTimeout.
// It returns the failure, or nil after a clean stop: also when ctx ends
// while it starts (a SIGTERM then; Start has undone what it started).
func Run(ctx context.Context, o coordinator.Options, log *zap.Logger, opts ...Option) error {
	if log == nil {
		log = zap.NewNop()
	}
	s, err := Start(ctx, o, log, opts...)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("standalone stopped while starting", zap.NamedError("cause", err))
			return nil
		}
		return err
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-s.Err():
	}
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	return errors.Join(runErr, s.Shutdown(sctx))
}

// workerSpec names one worker to start.
type workerSpec struct {
	role control.Role
	id   string
}

// hostTierShare returns the host tier budget of each in-process worker
// that has one by default (prefill and colocated workers; a decode worker
// of role decode has none): a worker process's auto host tier is a
// quarter of the free memory, and the workers here share one process, so
// they split that quarter instead of taking a quarter each. 0 (no host
// tier, logged) when the free memory cannot be read.
func hostTierShare(specs []workerSpec, log *zap.Logger) int64 {
	n := 0
	for _, w := range specs {
		if w.role != control.RoleDecode {
			n++
		}
	}
	if n == 0 {
		return 0
	}
	auto, err := prefixcache.AutoHostBytes()
	if err != nil {
		log.Warn("no host tier for the in-process workers", zap.Error(err))
		return 0
	}
	share := max(auto/int64(n), 1)
	log.Info("in-process workers share the host tier budget", zap.Int("workers", n), zap.Int64("host_cache_bytes_each", share))
	return share
}

// workerSpecs returns the workers to start, in order.
func workerSpecs(o coordinator.Options) []workerSpec {
	type spec struct {
		role  control.Role
		count int
	}
	specs := []spec{{control.RolePrefill, o.PrefillWorkers}, {control.RoleDecode, o.DecodeWorkers}}
	if o.Mode == coordinator.ModeColocated {
		specs = []spec{{control.RoleColocated, o.DecodeWorkers}}
	}
	var out []workerSpec
	for _, sp := range specs {
		for i := range sp.count {
			out = append(out, workerSpec{sp.role, fmt.Sprintf("%s-%d", sp.role, i)})
		}
	}
	return out
}

// withReconnectWait returns c with its reconnect wait set to d.
func withReconnectWait(c control.ConnOptions, d time.Duration) control.ConnOptions {
	c.ReconnectWait = d
	return c
}

// workerUsers reports whether users holds a NATS user that may publish
// as a worker (any role but observer, which publishes nothing).
func workerUsers(users []control.NATSUser) bool {
	for _, u := range users {
		if u.Role != control.RoleObserver {
			return true
		}
	}
	return false
}

// generatedGRPCAuth returns o with an Ed25519 key pair generated for
// this process when it has neither a token nor a signing key: the
// coordinator signs per-call credentials with the private key, its
// workers verify them with the public key, all in memory, so that nothing
// else on the machine can call the workers. With a signing key file, the
// workers get its public key.
func generatedGRPCAuth(o grpcauth.Options) (grpcauth.Options, error) {
	switch {
	case o.Signs():
		pub, err := o.PublicKey()
		if err != nil {
			return o, err
		}
		o.VerifyKey = pub
	case !o.Tokens():
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return o, fmt.Errorf("generate gRPC signing key: %w", err)
		}
		o.SigningKey, o.VerifyKey = priv, pub
	}
	return o, nil
}
