package coordinator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/metrics"
	"github.com/pdserve/pdserve/pkg/respstore"
	"github.com/pdserve/pdserve/pkg/router"
	"github.com/pdserve/pdserve/pkg/tokenizer"
	"github.com/pdserve/pdserve/pkg/tracing"
)

// ErrStandalone is Start's error for Options with Standalone set: package
// standalone starts the in-process workers and then the coordinator.
var ErrStandalone = errors.New("coordinator: standalone mode is started by package standalone")

// natsStopTimeout bounds draining the NATS connection at shutdown.
const natsStopTimeout = 5 * time.Second

// Coordinator is a started coordinator. Its methods are safe for
// concurrent use.
type Coordinator struct {
	o   Options
	log *zap.Logger
	reg *prometheus.Registry

	ns      *server.Server   // embedded NATS, or nil
	gw      *control.Gateway // the region's gateway server, or nil
	jsDir   string           // the embedded NATS server's JetStream directory, "" when none
	natsURL string
	nc      *nats.Conn
	ncDone  chan struct{} // closed when nc closed
	members *control.Membership
	stopW   func() // stops the membership watch
	// kv is the index of the workers' KV events (nil: routing is not
	// prefix-aware); stopKV stops its watch; kvAsk carries the workers
	// (role, id) to ask for a KV snapshot.
	kv     *control.KVIndex
	stopKV func()
	kvAsk  chan [2]string

	closeTok func() // frees the model vocabulary the tokenizer uses, or nil
	// tracer is the trace exporter built from Options.Tracing, flushed
	// and stopped last; nil when Options.TracerProvider was given.
	tracer *tracing.Provider

	conns   *conns
	regions *regions // nil without a region
	gauth   *grpcauth.Auth
	backend *backend
	http    *http.Server
	lis     net.Listener

	shutting atomic.Bool
	bgCancel context.CancelFunc
	wg       sync.WaitGroup
	serveErr chan error // the HTTP server's failure

	shutdownOnce sync.Once
	shutdownErr  error
}

// Start builds and starts a coordinator from validated, completed options.
// It returns once the HTTP listener is open (HTTPAddr is valid). ctx
// bounds only the start. Errors: ErrStandalone when o.Standalone is set
// (package standalone starts that mode), listen and NATS errors, wrapped;
// what was started is stopped again.
func Start(ctx context.Context, o Options, log *zap.Logger) (c *Coordinator, err error) {
	if o.Standalone {
		return nil, ErrStandalone
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	tlsCfg, err := o.TLS.Load(o.tlsUse(), log.Named("tls"))
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	gauth, err := o.GRPCAuth.Load(grpcauth.RoleCoordinator, log.Named("grpcauth"))
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	if gauth.Tokens() && !gauth.Signs() && tlsCfg == nil {
		log.Warn("gRPC: a static token over plaintext is sent to every address a heartbeat names, and anyone with a role's NATS credential can name his own; " +
			"give the coordinator --grpc-signing-key and the workers --grpc-verify-key (per-call credentials), or turn on TLS")
	}
	if tlsCfg != nil && len(gauth.WorkerIdentities()) == 0 {
		log.Warn("gRPC TLS: --tls-worker-identity is empty: any certificate the CA signed is taken for any worker")
	}
	nets, err := parseNetworks(o.workerNetworks())
	if err != nil {
		return nil, fmt.Errorf("coordinator: worker-networks: %w", err)
	}
	tp := o.TracerProvider
	var tracer *tracing.Provider
	if tp == nil {
		if tracer, err = tracing.New(ctx, o.Tracing); err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		tp = tracer.TracerProvider()
	}
	c = &Coordinator{o: o, log: log, reg: o.Registry, serveErr: make(chan error, 1), gauth: gauth, tracer: tracer,
		conns: newConns(workerDialer(tlsCfg, gauth, append(append(o.Keepalive.DialOptions(), grpc.WithContextDialer(nets.dial)), tracing.DialOptions(tp)...)))}
	if c.reg == nil {
		c.reg = prometheus.NewRegistry()
	}
	c.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	defer func() {
		if err != nil {
			c.closeAll(context.Background())
			c = nil
		}
	}()

	c.natsURL = o.NATSURL
	conn := o.NATS // the server at NATSURL
	if c.natsURL == "" {
		if conn, err = c.startEmbeddedNATS(); err != nil {
			return c, err
		}
	}
	// Connect returns at once; an external server that is not up yet is
	// retried in the background, and the coordinator is not Ready until
	// it connects.
	ncDone := make(chan struct{})
	if c.nc, err = conn.Connect(c.natsURL, "pdserve-coordinator", log.Named("nats"),
		nats.DrainTimeout(natsStopTimeout), nats.ClosedHandler(func(*nats.Conn) { close(ncDone) })); err != nil {
		return c, fmt.Errorf("coordinator: %w", err)
	}
	c.ncDone = ncDone
	mopts := []control.MembershipOption{control.RequireAdmission(), control.MaxPending(control.DefaultMaxPending),
		control.WithCheck(countingCheck(o.checkHeartbeat, c.reg))}
	if tlsCfg == nil {
		// Admission shows only that a gRPC server answers at the
		// address, which a role change there leaves as shown: a moved
		// elastic worker is routed to from its new role's first
		// heartbeat. With TLS the new role's certificate is checked
		// first.
		mopts = append(mopts, control.AdmitRoleMoves())
	}
	c.members = control.NewMembership(o.HeartbeatTTL, mopts...)
	members := c.members
	c.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "pdserve_coordinator_heartbeats_pending_refused_total",
		Help: fmt.Sprintf("Heartbeats of new worker ids refused while %d workers awaited admission.", control.DefaultMaxPending),
	}, func() float64 { return float64(members.PendingRefused()) }))
	if c.stopW, err = control.Watch(ctx, c.nc, c.members, time.Now, max(o.HeartbeatTTL/4, 10*time.Millisecond),
		control.WatchLogger(log.Named("membership"))); err != nil {
		return c, fmt.Errorf("coordinator: %w", err)
	}

	var tok engine.Tokenizer = tokenizer.Bytes{}
	if o.Tokenizer != nil {
		tok = o.Tokenizer
	} else {
		// The model's own tokenizer (llamacpp): counts, budgets, prefix
		// hashes and chat templates must be the workers'.
		enginecfg.SetLogger(log)
		t, closeTok, err := o.Engine.Tokenizer()
		if err != nil {
			return c, fmt.Errorf("coordinator: %w", err)
		}
		if t != nil {
			tok, c.closeTok = t, closeTok
		}
	}

	m := metrics.New(c.reg, metrics.SLO{
		TTFT: time.Duration(o.Policy.SLO.TTFTMs * float64(time.Millisecond)),
		TPOT: time.Duration(o.Policy.SLO.TPOTMs * float64(time.Millisecond)),
	})
	c.backend = &backend{
		mode: o.Mode, policy: o.FirstTokenPolicy, codec: o.Codec, eog: eogSet(engine.EOGTokens(tok)), modelName: o.ModelName,
		log: log, members: c.members, conns: c.conns, auth: gauth, metrics: m, now: time.Now,
		pricing: o.Policy.Pricing.Resolve(),
		router:  newRouter(o, c.reg),
		hashKey: o.HashKey,
	}
	if o.Policy.Routing.PrefixAware(o.Mode == ModeColocated) {
		c.backend.prefixBlockTokens = o.BlockTokens
		// Every cached block of every worker, from their KV events;
		// workers without them route on their heartbeats' digests.
		c.kvAsk = make(chan [2]string, kvAskQueue)
		kvo := o.kvIndexOptions()
		kvo.Admitted = func(role, id string) bool {
			r, ok := members.Admitted(id)
			return ok && r == role
		}
		kvo.OnStale = c.askSnapshot
		if c.kv, err = control.NewKVIndexWith(kvo); err != nil {
			return c, fmt.Errorf("coordinator: %w", err)
		}
		registerKVIndexMetrics(c.reg, c.kv)
		if c.stopKV, err = control.WatchKV(ctx, c.nc, c.kv, c.members, max(o.HeartbeatTTL/4, 10*time.Millisecond), log.Named("kvevents")); err != nil {
			return c, fmt.Errorf("coordinator: %w", err)
		}
		c.backend.kv = c.kv
	}
	if err := c.attachExtensions(); err != nil {
		return c, err
	}
	au, err := loadAuth(o, log.Named("auth"))
	if err != nil {
		return c, err
	}
	// Admission (Policy.Limits.QueueLimit requests at once) is the
	// frontend's, before a body is read.
	var chatTemplate string
	if o.ChatTemplateFile != "" {
		b, err := os.ReadFile(o.ChatTemplateFile)
		if err != nil {
			return c, fmt.Errorf("coordinator: chat-template-file: %w", err)
		}
		chatTemplate = string(b)
	}
	responses, err := respstore.New(c.nc, o.Responses)
	if err != nil {
		return c, fmt.Errorf("coordinator: %w", err)
	}
	tiersCh := newTierChooser(c, c.reg)
	c.regions = newRegions(c, tiersCh)
	var regs frontend.Regions
	if c.regions != nil {
		regs = c.regions
	}
	fe, err := frontend.New(frontend.Options{
		Backend: observed(c.backend, o.Extensions, c.reg, time.Now), Tokenizer: tok, Policy: o.Policy,
		Models: c.Models, Ready: c.Ready, Metrics: m, Gatherer: c.reg,
		Logger: log.Named("request"), RetryAfter: o.RetryAfter,
		MaxInFlight: o.Policy.Limits.QueueLimit, MaxBodyBytes: o.MaxBodyBytes, BodyIdleTimeout: o.HTTPBodyIdleTimeout,
		BodyTimeout: o.HTTPBodyTimeout, WriteTimeout: o.HTTPWriteTimeout, MaxInFlightBodyBytes: o.MaxInFlightBodyBytes, MaxChoices: c.maxChoices,
		APIKeys: au.keys, MetricsToken: au.token, ChatTemplate: chatTemplate, TracerProvider: tp, Responses: responses,
		Tiers: tiersCh, Regions: regs, Region: o.Region.Name,
	})
	if err != nil {
		return c, fmt.Errorf("coordinator: %w", err)
	}
	if c.regions != nil {
		if err := c.regions.start(fe); err != nil {
			return c, err
		}
	}
	if c.lis, err = net.Listen("tcp", o.HTTPAddr); err != nil {
		return c, fmt.Errorf("coordinator: http listen: %w", err)
	}
	c.http = &http.Server{
		Handler: fe, ReadHeaderTimeout: o.HTTPReadHeaderTimeout, IdleTimeout: 2 * time.Minute,
		ErrorLog:    zap.NewStdLog(log.Named("http")),
		ConnContext: frontend.ConnContext, // the client's RTT, a budget term
	}

	bg, cancel := context.WithCancel(context.Background())
	c.bgCancel = cancel
	c.wg.Go(func() {
		if err := c.http.Serve(c.lis); !errors.Is(err, http.ErrServerClosed) {
			c.serveErr <- fmt.Errorf("coordinator: http serve: %w", err)
		}
	})
	c.wg.Go(func() { c.housekeep(bg, m) })
	if c.kvAsk != nil {
		c.wg.Go(func() { c.askSnapshots(bg) })
	}
	adm := newAdmitter(c.members, c.conns, tlsCfg != nil, log.Named("admission"))
	if c.kvAsk != nil {
		// Its KV events before admission were dropped: a snapshot now.
		adm.onAdmit = func(id, role string) { c.askSnapshot(role, id) }
	}
	c.wg.Go(func() { adm.run(bg, &c.wg) })
	for _, e := range o.Extensions {
		c.wg.Go(func() { e.Run(bg) })
	}
	c.wg.Go(func() { au.watch(bg, o.Auth, log.Named("auth"), m) })
	log.Info("coordinator started", zap.String("http_addr", c.HTTPAddr()), zap.String("nats_url", control.RedactURL(c.natsURL)), zap.Bool("grpc_tls", o.TLS.Enabled()))
	return c, nil
}

// startEmbeddedNATS starts the embedded NATS server with its users: one
// generated for the coordinator, those of NATSAuthFile and NATSUsers. It returns the
// coordinator's connection options. Errors: the users file's, the
// server's, wrapped.
func (c *Coordinator) startEmbeddedNATS() (control.ConnOptions, error) {
	o := c.o
	self := control.NewNATSUser(control.RoleCoordinator, "")
	users := []control.NATSUser{self}
	fromFile, err := LoadNATSUsers(o.NATSAuthFile, c.log)
	if err != nil {
		return control.ConnOptions{}, fmt.Errorf("coordinator: %w", err)
	}
	users = append(users, fromFile...)
	users = append(users, o.NATSUsers...)
	if c.gw, err = o.StartRegionGateway(c.log.Named("nats-gateway")); err != nil {
		return control.ConnOptions{}, err
	}
	var gw []control.EmbeddedOption
	if c.gw != nil {
		gw = append(gw, control.WithLeafRemote(c.gw))
	}
	if c.jsDir, err = os.MkdirTemp("", "pdserve-nats-"); err != nil {
		return control.ConnOptions{}, fmt.Errorf("coordinator: jetstream directory: %w", err)
	}
	if c.ns, c.natsURL, err = control.StartEmbedded(o.NATSListenAddr(), append([]control.EmbeddedOption{control.WithUsers(users), control.WithLogger(c.log.Named("nats-server")),
		control.WithJetStream(c.jsDir, o.Responses.MaxBytes)}, gw...)...); err != nil {
		return control.ConnOptions{}, fmt.Errorf("coordinator: %w", err)
	}
	c.log.Info("embedded NATS server started", zap.String("url", c.natsURL), zap.Int("users_from_file", len(fromFile)))
	if len(fromFile)+len(o.NATSUsers) == 0 {
		c.log.Warn("the embedded NATS server has no users for workers: workers started apart cannot join; list them in --nats-auth-file")
	}
	conn := self.ConnOptions()
	conn.ReconnectWait = o.NATS.ReconnectWait
	return conn, nil
}

// LoadNATSUsers returns the users of the NATS users file (nil for an
// empty path; see control.LoadUsers), warning on log about each
// plain-text password. Errors: control.LoadUsers's.
func LoadNATSUsers(file string, log *zap.Logger) ([]control.NATSUser, error) {
	if file == "" {
		return nil, nil
	}
	users, err := control.LoadUsers(file)
	if err != nil {
		return nil, err
	}
	for _, u := range users {
		if u.NKey == "" && !strings.HasPrefix(u.Password, "$2") {
			log.Warn("NATS users file holds a plain-text password; a bcrypt hash keeps the file free of usable secrets",
				zap.String("file", file), zap.String("user", u.User))
		}
	}
	return users, nil
}

// housekeep updates the worker gauges and closes the gRPC connections of
// workers that left, until ctx ends.
func (c *Coordinator) housekeep(ctx context.Context, m *metrics.Metrics) {
	t := time.NewTicker(max(c.o.HeartbeatTTL/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		keep := make(map[string]bool)
		live := make(map[string]bool)
		counts := map[control.Role]int{control.RolePrefill: 0, control.RoleDecode: 0, control.RoleColocated: 0}
		for _, hb := range c.members.All() {
			keep[peer{id: hb.ID, role: hb.Role, addr: hb.GRPCAddr}.key()] = true
			live[hb.ID] = true
		}
		c.backend.router.Retain(live)
		for role := range counts {
			counts[role] = len(c.members.Members(role))
		}
		for role, n := range counts {
			m.SetWorkers(string(role), n)
		}
		c.conns.retain(keep)
	}
}

// kvAskQueue bounds the KV snapshot requests waiting to be sent.
const kvAskQueue = 64

// askSnapshots sends CmdKVSnapshot to each worker whose KV-event view is
// stale (a lost batch, or none since the coordinator started), until ctx
// ends. A failure is logged: the worker's periodic snapshot heals it.
func (c *Coordinator) askSnapshots(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-c.kvAsk:
			cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
			if err := control.SendCommand(cctx, c.nc, w[0], w[1], control.Command{Kind: control.CmdKVSnapshot}); err != nil && ctx.Err() == nil {
				c.log.Debug("kv snapshot request failed; the worker's periodic snapshot heals its view", zap.String("worker", w[1]), zap.Error(err))
			}
			cancel()
		}
	}
}

// askSnapshot queues a CmdKVSnapshot to worker id of role; never blocks.
func (c *Coordinator) askSnapshot(role, id string) {
	select {
	case c.kvAsk <- [2]string{role, id}:
	default: // asked of many already: the periodic snapshot heals it
	}
}

// registerKVIndexMetrics registers ix's gauge and counters with reg.
func registerKVIndexMetrics(reg prometheus.Registerer, ix *control.KVIndex) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pdserve_coordinator_kv_index_bytes",
		Help: "Memory the index of the workers' KV events holds, bytes (control.KVIndexEntryBytes a block), under --kv-index-max-bytes.",
	}, func() float64 { return float64(ix.Stats().Bytes) }))
	blocks := []struct {
		reason string
		v      func(control.KVIndexStats) uint64
	}{
		{"evicted", func(s control.KVIndexStats) uint64 { return s.Evicted }},
		{"left_out", func(s control.KVIndexStats) uint64 { return s.LeftOut }},
	}
	for _, b := range blocks {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "pdserve_coordinator_kv_index_blocks_dropped_total",
			Help:        "Blocks the KV events index did not keep: evicted (taken from the worker holding the most, at --kv-index-max-bytes), left_out (their worker at --kv-index-worker-max-bytes, or holding the most at the global cap).",
			ConstLabels: prometheus.Labels{"reason": b.reason},
		}, func() float64 { return float64(b.v(ix.Stats())) }))
	}
	msgs := []struct {
		reason string
		v      func(control.KVIndexStats) uint64
	}{
		{"not_admitted", func(s control.KVIndexStats) uint64 { return s.NotAdmitted }},
		{"invalid", func(s control.KVIndexStats) uint64 { return s.Refused }},
		{"queue_full", func(s control.KVIndexStats) uint64 { return s.QueueFull }},
	}
	for _, m := range msgs {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "pdserve_coordinator_kv_events_dropped_total",
			Help:        "KV event payloads the coordinator dropped: not_admitted (an id not admitted), invalid (does not decode or breaks a limit), queue_full (its worker's queue was full: it publishes faster than they are applied).",
			ConstLabels: prometheus.Labels{"reason": m.reason},
		}, func() float64 { return float64(m.v(ix.Stats())) }))
	}
}

// KVIndex returns the index of the workers' KV events, nil when routing
// is not prefix-aware.
func (c *Coordinator) KVIndex() *control.KVIndex { return c.kv }

// HTTPAddr returns the address the HTTP server listens on.
func (c *Coordinator) HTTPAddr() string { return c.lis.Addr().String() }

// NATSURL returns the control plane's URL (the embedded server's when one
// was started).
func (c *Coordinator) NATSURL() string { return c.natsURL }

// Membership returns the coordinator's view of the workers.
func (c *Coordinator) Membership() *control.Membership { return c.members }

// Registry returns the registry served on /metrics.
func (c *Coordinator) Registry() *prometheus.Registry { return c.reg }

// Err returns a channel that yields the HTTP server's failure.
func (c *Coordinator) Err() <-chan error { return c.serveErr }

// Models returns the served models: --model-name, or the distinct models
// the admitted workers report, sorted by name (a worker's heartbeat adds
// no model before the coordinator admitted it). Each model's MaxModelLen
// is the longest request its admitted workers can take: the longest
// context a decode (or colocated) worker reports, capped in disaggregated
// mode by the longest a prefill worker reports (every admitted worker's
// under --model-name); 0 while none reports one. The router sends each
// request only to workers whose own context fits it, so one worker's
// heartbeat cannot lower the limit for the others.
func (c *Coordinator) Models() []frontend.Model {
	ms := c.members.Models()
	seqLen := func(byRole map[control.Role]int) int {
		if c.o.Mode == ModeColocated {
			return byRole[control.RoleColocated]
		}
		return control.MinSeqLen(byRole[control.RoleDecode], byRole[control.RolePrefill])
	}
	if c.o.ModelName != "" {
		all := map[control.Role]int{}
		for _, m := range ms {
			for r, n := range m.ByRole {
				all[r] = max(all[r], n)
			}
		}
		return []frontend.Model{{Name: c.o.ModelName, MaxModelLen: seqLen(all)}}
	}
	out := make([]frontend.Model, len(ms))
	for i, m := range ms {
		out[i] = frontend.Model{Name: m.Name, MaxModelLen: seqLen(m.ByRole)}
	}
	return out
}

// Ready returns nil once at least one non-draining worker of each needed
// role has joined (prefill and decode in disaggregated mode, colocated in
// colocated mode), the coordinator is connected to NATS and not shutting
// down.
func (c *Coordinator) Ready() error {
	if c.shutting.Load() {
		return errors.New("shutting down")
	}
	if !c.nc.IsConnected() {
		return errors.New("not connected to NATS")
	}
	roles := []control.Role{control.RolePrefill, control.RoleDecode}
	if c.o.Mode == ModeColocated {
		roles = []control.Role{control.RoleColocated}
	}
	for _, r := range roles {
		if len(c.members.Members(r)) == 0 {
			return fmt.Errorf("no %s worker has joined", r)
		}
	}
	return nil
}

// Shutdown stops the coordinator gracefully: not ready, HTTP Shutdown
// (requests in flight finish unless ctx ends first, then connections are
// closed), Options.BeforeNATSDrain called, NATS drained, an embedded NATS
// server stopped, gRPC connections closed. Later calls return the first
// call's result.
func (c *Coordinator) Shutdown(ctx context.Context) error {
	c.shutdownOnce.Do(func() { c.shutdownErr = c.closeAll(ctx) })
	return c.shutdownErr
}

// closeAll stops what was started; safe after a partial Start.
func (c *Coordinator) closeAll(ctx context.Context) error {
	c.shutting.Store(true)
	var errs []error
	if c.http != nil {
		if err := c.http.Shutdown(ctx); err != nil {
			c.log.Warn("http shutdown did not drain in time; closing connections", zap.Error(err))
			_ = c.http.Close() // Close's error repeats the listener's
		}
	}
	if c.regions != nil {
		c.regions.shutdown(ctx)
	}
	if c.backend != nil {
		// Requests cut off by a forced close still free their KV on the
		// workers; let them before the workers stop.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rpcTimeout)
		if err := c.backend.waitIdle(wctx); err != nil {
			c.log.Warn("requests still cleaning up at shutdown", zap.Error(err))
		}
		cancel()
	}
	if c.bgCancel != nil {
		c.bgCancel()
	}
	c.wg.Wait()
	if c.o.BeforeNATSDrain != nil {
		if err := c.o.BeforeNATSDrain(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if c.stopW != nil {
		c.stopW()
	}
	if c.stopKV != nil {
		c.stopKV()
	}
	if c.nc != nil {
		// A connection still (re)connecting is closed by Drain at once.
		if err := c.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrConnectionReconnecting) {
			errs = append(errs, fmt.Errorf("coordinator: nats drain: %w", err))
		}
		c.waitNATSClosed()
	}
	if c.ns != nil {
		c.ns.Shutdown()
		c.ns.WaitForShutdown()
	}
	c.gw.Shutdown()
	if c.jsDir != "" {
		if err := os.RemoveAll(c.jsDir); err != nil {
			errs = append(errs, fmt.Errorf("coordinator: jetstream directory: %w", err))
		}
	}
	c.conns.closeAll()
	if c.closeTok != nil {
		c.closeTok()
	}
	if err := c.tracer.Shutdown(ctx); err != nil {
		c.log.Warn("trace export did not finish", zap.Error(err))
	}
	c.log.Info("coordinator stopped")
	return errors.Join(errs...)
}

// waitNATSClosed waits until a draining connection closed, bounded.
func (c *Coordinator) waitNATSClosed() {
	t := time.NewTimer(natsStopTimeout + time.Second)
	defer t.Stop()
	select {
	case <-c.ncDone:
	case <-t.C:
		c.nc.Close()
		<-c.ncDone
	}
}

// Run starts a coordinator, blocks until ctx ends or the HTTP server
// fails, and shuts down gracefully within Options.ShutdownTimeout. It
// returns the failure, or nil after a clean stop: also when ctx ends
// while it starts (a SIGTERM then; Start has undone what it started).
func Run(ctx context.Context, o Options, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	c, err := Start(ctx, o, log)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("coordinator stopped while starting", zap.NamedError("cause", err))
			return nil
		}
		return err
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-c.Err():
	}
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	return errors.Join(runErr, c.Shutdown(sctx))
}

// workerDialer returns the dial options of the connection to a worker:
// TLS that refuses, in the handshake, a certificate not naming the
// worker's role and id (so no credential and no request goes to an
// unverified peer), or plaintext without TLS; keepalive; and the
// per-call credentials signed for that worker (or the static token).
func workerDialer(t *grpcnet.TLS, a *grpcauth.Auth, keepalive []grpc.DialOption) func(peer) []grpc.DialOption {
	return func(p peer) []grpc.DialOption {
		creds := insecure.NewCredentials()
		if t != nil {
			creds = credentials.NewTLS(a.WorkerTLS(t.ClientConfig(), p.role, p.id))
		}
		opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, keepalive...)
		return append(opts, a.DialOptionsFor(p.id)...)
	}
}

// newRouter builds the router from the policy's routing section, its
// metrics registered with reg.
func newRouter(o Options, reg prometheus.Registerer) *router.Router {
	rt := o.Policy.Routing
	return router.New(router.Config{
		BlockTokens:                 o.BlockTokens,
		Colocated:                   o.Mode == ModeColocated,
		RecentTTL:                   rt.RecentTTL(),
		LocalPrefillBelowTokens:     rt.LocalPrefillBelowTokens,
		PrefillQueueLocalTokens:     rt.PrefillQueueLocalTokens,
		BusyLocalPrefillBelowTokens: rt.BusyLocalPrefillBelowTokens,
		MaxQueuedPrefillTokens:      rt.MaxQueuedPrefillTokens,
		Decode:                      router.Weights(rt.DecodeWeights()),
		Prefill:                     router.Weights(rt.PrefillWeights()),
		Picker:                      rt.Picker,
		Registerer:                  reg,
		Clock:                       time.Now,
	})
}
