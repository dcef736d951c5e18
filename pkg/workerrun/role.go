package workerrun

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/decode"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefill"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// roleRun is what one role of the worker runs: its server (prefill, or
// decode for decode and colocated), the scheduler goroutine, the KV
// events of its prefix cache and the NATS subscription of its command
// subject. The engine, gRPC server, NATS connection and heartbeats
// belong to the worker and outlive it. Its fields are set before the
// roleRun is published (Worker.rr) and read only after.
type roleRun struct {
	role   control.Role
	log    *zap.Logger
	svc    service
	pre    *prefill.Server // nil unless prefill
	dialer *kvtransfer.Dialer
	// reg is the registerer the role's server registered its metrics
	// with; an elastic worker unregisters them when the role stops, so
	// that the next role of the same kind can register them again.
	reg *trackingRegisterer
	set *roleSet // the role's services, for an elastic worker's mux
	// kvpub publishes the prefix cache's KV events (nil: none; the
	// heartbeats carry the digest then).
	kvpub *control.KVPublisher
	// hostpub publishes its host tier's (nil: none).
	hostpub *control.KVPublisher
	// diskpub publishes its disk tier's (nil: none).
	diskpub *control.KVPublisher
	sub     *nats.Subscription
	// unwatch stops the prefill worker's watch of the receivers'
	// heartbeats (nil: none).
	unwatch   func()
	receivers *control.Membership // what unwatch watches

	ctx      context.Context // ends when the role stops
	cancel   context.CancelFunc
	schedOut chan struct{} // closed when the scheduler returned
	// running: runRole started the role's goroutines (a role whose
	// connection failed never runs, and has no scheduler to wait for).
	running bool
	// ordered is when the command that started the role arrived (zero:
	// the role the worker started in), for the time to its first request.
	ordered time.Time
}

// cur returns the role the worker serves now.
func (w *Worker) cur() *roleRun { return w.rr.Load() }

// logger returns the worker's logger, with the role it has now.
func (w *Worker) logger() *zap.Logger {
	if rr := w.cur(); rr != nil {
		return rr.log
	}
	return w.base
}

// kvServerOptions are the options of the KV transfer server a worker
// that receives KV serves.
func kvServerOptions(log *zap.Logger) []kvtransfer.ServerOption {
	return []kvtransfer.ServerOption{kvtransfer.WithLogger(log.Named("kvtransfer"))}
}

// buildRole builds the server of role on the worker's engine; nothing of
// it runs yet (see connectRole and runRole).
func (w *Worker) buildRole(role control.Role) (_ *roleRun, err error) {
	o := w.o
	log := w.base.With(zap.String("role", string(role)))
	rr := &roleRun{role: role, log: log, schedOut: make(chan struct{})}
	rr.ctx, rr.cancel = context.WithCancel(w.bgCtx)
	defer func() {
		if err != nil {
			rr.cancel()
			rr.reg.unregisterAll()
			if rr.dialer != nil {
				_ = rr.dialer.Close()
			}
		}
	}()
	var reg prometheus.Registerer = w.reg
	if w.mux != nil {
		rr.reg = &trackingRegisterer{r: w.reg}
		reg = rr.reg
	}
	o.Decode = decodeHostTier(role, o.Decode, log)
	if role == control.RolePrefill {
		o.Prefill.PrefixCache = sizeHostTier(o.Prefill.PrefixCache, prefixcache.AutoHostBytes, log)
	} else {
		o.Decode.PrefixCache = sizeHostTier(o.Decode.PrefixCache, prefixcache.AutoHostBytes, log)
	}
	if t, ok := w.eng.(transferEngine); ok && role != control.RoleColocated {
		if err := t.Transferable(); err != nil {
			return nil, fmt.Errorf("workerrun: a %s worker moves KV between pools, which this model cannot (run it colocated): %w", role, err)
		}
	}
	switch role {
	case control.RolePrefill:
		auth := w.auth
		dopts := []kvtransfer.DialOption{kvtransfer.WithConnsPerAddr(o.KVConns), kvtransfer.WithLinkGbps(o.PaceGbps), kvtransfer.WithLogger(log.Named("kvtransfer")),
			kvtransfer.WithKeepalive(o.Keepalive.ClientParameters()), kvtransfer.WithGRPCDialOptions(auth.DialOptions()...)}
		if w.tlsCfg != nil {
			// Nothing, the KV included, goes to a decode worker whose
			// certificate does not name it.
			base := w.tlsCfg.ClientConfig()
			dopts = append(dopts, kvtransfer.WithPeerTLS(func(id string) *tls.Config {
				return auth.WorkerTLS(base, string(control.RoleDecode), id)
			}))
			// Nor does a pull go to a peer whose certificate does not name
			// the role and id the coordinator's index says.
			dopts = append(dopts, kvtransfer.WithPullTLS(func(role, id string) *tls.Config {
				return auth.WorkerTLS(base, role, id)
			}))
		}
		rr.dialer = kvtransfer.NewDialer(dopts...)
		if rr.pre, err = prefill.New(w.eng, rr.dialer, o.Prefill, log.Named("prefill"), reg); err != nil {
			return nil, fmt.Errorf("workerrun: %w", err)
		}
		rr.svc = prefillService{rr.pre}
	default:
		var dopts []decode.Option
		if rr.dialer = decodeDialer(o, w.tlsCfg, w.auth, log); rr.dialer != nil {
			dopts = append(dopts, decode.WithDialer(rr.dialer))
		}
		d, err := decode.New(w.eng, o.Decode, log.Named("decode"), reg, dopts...)
		if err != nil {
			return nil, fmt.Errorf("workerrun: %w", err)
		}
		rr.svc = decodeService{Server: d, opts: kvServerOptions(log)}
	}
	if w.mux != nil {
		rr.set = newRoleSet(string(role))
		rr.svc.register(rr.set)
	}
	return rr, nil
}

// connectRole subscribes rr to its command subject and sets up its KV
// event publishers and, for prefill, its watch of the receivers, when
// the worker has NATS.
func (w *Worker) connectRole(rr *roleRun) (err error) {
	if w.nc == nil {
		return nil
	}
	o, role := w.o, string(rr.role)
	if pb := rr.svc.prefixBlocks(); o.KVEvents && pb != nil {
		ko := control.DefaultKVOptions()
		ko.SnapshotInterval = o.KVSnapshotInterval
		if rr.kvpub, err = control.NewKVPublisher(w.nc, role, w.id, ko, pb.AppendBlocks); err != nil {
			return fmt.Errorf("workerrun: %w", err)
		}
		pb.SetObserver(kvObserver{rr.kvpub})
		if hb := rr.svc.hostBlocks(); hb != nil {
			if rr.hostpub, err = control.NewKVTierPublisher(w.nc, role, w.id, control.KVTierHost, ko, hb.AppendBlocks); err != nil {
				return fmt.Errorf("workerrun: %w", err)
			}
			hb.SetObserver(kvObserver{rr.hostpub})
		}
		if db := diskBlocks(rr.svc.hostBlocks()); db != nil {
			if rr.diskpub, err = control.NewKVTierPublisher(w.nc, role, w.id, control.KVTierDisk, ko, db.AppendBlocks); err != nil {
				return fmt.Errorf("workerrun: %w", err)
			}
			db.SetObserver(kvObserver{rr.diskpub})
		}
	}
	if rr.pre != nil {
		if err := w.watchReceivers(rr); err != nil {
			return err
		}
	}
	// Last: a command may come at once, and reads rr's fields.
	if rr.sub, err = control.HandleCommands(w.nc, role, w.id, w.command); err != nil {
		return fmt.Errorf("workerrun: %w", err)
	}
	return nil
}

// runRole starts rr's goroutines and serves its gRPC services.
func (w *Worker) runRole(rr *roleRun) {
	rr.running = true
	w.goPart("scheduler", func() error {
		defer close(rr.schedOut)
		return rr.svc.Run(rr.ctx)
	})
	if rr.kvpub != nil {
		w.goPart("kv events", func() error { return rr.kvpub.Run(rr.ctx) })
	}
	if rr.hostpub != nil {
		w.goPart("host tier kv events", func() error { return rr.hostpub.Run(rr.ctx) })
	}
	if rr.diskpub != nil {
		w.goPart("disk tier kv events", func() error { return rr.diskpub.Run(rr.ctx) })
	}
	if rr.pre == nil && !w.benched.Swap(true) {
		w.kvDType = w.eng.Spec().KVDType
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.benchCodecs()
		}()
	}
	w.health.SetServingStatus(serviceName(rr.role), healthpb.HealthCheckResponse_SERVING)
	if w.mux != nil {
		w.mux.serve(rr.set)
	}
	if w.rm != nil {
		w.rm.setRole(rr.role)
	}
}

// stopRole stops rr: its scheduler (failing what is left), its KV event
// publishers, its command subscription and its dialer. The caller drained
// it first, or gives up on what it holds.
func (w *Worker) stopRole(rr *roleRun) {
	if w.mux != nil {
		w.mux.serve(nil)
	}
	rr.cancel()
	rr.svc.Stop()
	if rr.running {
		<-rr.schedOut
	}
	if rr.unwatch != nil {
		rr.unwatch()
	}
	if rr.sub != nil {
		_ = rr.sub.Unsubscribe()
	}
	if rr.dialer != nil {
		_ = rr.dialer.Close()
	}
	rr.reg.unregisterAll()
	if w.health != nil {
		// runRole sets the next role's service serving again.
		w.health.SetServingStatus(serviceName(rr.role), healthpb.HealthCheckResponse_NOT_SERVING)
	}
}

// Errors of ChangeRole.
var (
	ErrNotElastic   = errors.New("workerrun: the worker was not started elastic (Options.Elastic)")
	ErrRoleChanging = errors.New("workerrun: a role change is in progress")
)

// ChangeRole moves the worker to role (prefill, decode or colocated)
// without reloading its model: the current role drains (new work for it
// fails with UNAVAILABLE at once, and the heartbeats say draining;
// prefills in progress finish and deliver their KV; running decode
// sequences finish, or with migrate move with their KV to other decode
// workers, which the coordinator resumes them on, and so do those whose
// KV was still on its way, once they have their first token), for at most Options.DrainTimeout (then what is left
// fails with UNAVAILABLE), its server stops, and the new role's server
// starts on the same engine, gRPC address and NATS connection; the next
// heartbeat carries the new role. The prefix cache stays: the old
// role's batch hands its engine tier over as it stops (entries, chain
// hashes and provenance tags; the KV stays in its engine sequences) and
// the new role's batch adopts it as its own cache, under its bounds and
// engine memory (prefixcache.Handover), so its KV events and digest
// advertise it under the new role, and its host and disk tiers with it
// (the new role's cache takes their entries in, when it has such tiers).
// ordered is when
// the change was ordered (zero: now), for the histogram of the time to
// the first request served in the new role. Errors: ErrNotElastic, a
// role that is not a worker role, ErrRoleChanging, a draining or stopped
// worker, the new server's construction (then the worker fails: it has
// no role left to serve).
func (w *Worker) ChangeRole(role control.Role, ordered time.Time, migrate bool) error {
	if w.mux == nil {
		return ErrNotElastic
	}
	switch role {
	case control.RolePrefill, control.RoleDecode, control.RoleColocated:
	default:
		return fmt.Errorf("workerrun: role %q must be %s, %s or %s", role, control.RolePrefill, control.RoleDecode, control.RoleColocated)
	}
	if !w.changing.CompareAndSwap(false, true) {
		return ErrRoleChanging
	}
	changed := false
	defer func() {
		if !changed {
			w.changing.Store(false)
		}
	}()
	w.roleMu.Lock()
	defer w.roleMu.Unlock()
	if w.draining.Load() || w.bgCtx.Err() != nil {
		return errors.New("workerrun: the worker is draining")
	}
	if ordered.IsZero() {
		ordered = time.Now()
	}
	old := w.cur()
	if old.role == role {
		return nil
	}
	log := old.log.With(zap.String("new_role", string(role)))
	log.Info("role change: draining the old role")
	old.svc.SetDraining(true)
	w.publishNow()
	dctx, cancel := context.WithTimeout(w.bgCtx, w.o.DrainTimeout)
	if d, ok := old.svc.(decodeService); ok && migrate && w.o.RoleChangeRestart <= 0 {
		// Running sequences move with their KV instead of finishing here;
		// WaitIdle then waits for the rest and for the moved KV's pulls.
		n, err := d.MigrateAll(dctx)
		log.Info("role change: running sequences migrated", zap.Int("migrated", n), zap.Error(err))
	}
	if err := old.svc.WaitIdle(dctx); err != nil {
		log.Warn("role change: drain timed out; failing the requests left", zap.Int("requests", old.svc.live()), zap.Duration("drain_timeout", w.o.DrainTimeout))
	}
	cancel()
	drained := time.Now()
	if w.o.RoleChangeRestart > 0 {
		log.Info("role change: waiting as a replaced pod starts and loads its model", zap.Duration("restart", w.o.RoleChangeRestart))
		t := time.NewTimer(w.o.RoleChangeRestart)
		select {
		case <-t.C:
		case <-w.bgCtx.Done():
			t.Stop()
		}
	}
	rr, err := w.buildRole(role)
	// The old role's batch hands its prefix cache over as it stops (the
	// KV stays in the engine's sequences) and the new one adopts it.
	cache := make(chan prefixcache.Handover, 1)
	old.svc.HandOverPrefixCache(cache)
	if err == nil {
		// The old role stops before the new one runs: they share the
		// engine, which the new server's scheduler owns from then on.
		w.stopRole(old)
		rr.ordered = ordered
		if err = w.connectRole(rr); err != nil {
			w.stopRole(rr)
		}
	} else {
		w.stopRole(old)
	}
	var handed prefixcache.Handover
	select {
	case handed = <-cache:
	default: // the old batch never ran
	}
	if err != nil {
		// No batch runs on the engine now.
		for _, s := range handed.Seqs() {
			w.eng.Free(s)
		}
		_ = handed.DropTiers() // a failure is counted in the tier's stats
		err = fmt.Errorf("workerrun: role change to %s: %w", role, err)
		w.fail(err)
		return err
	}
	rr.svc.AdoptPrefixCache(handed)
	w.rr.Store(rr)
	changed = true
	w.changing.Store(false)
	w.runRole(rr)
	w.publishNow()
	w.rm.changed(old.role, role)
	rr.log.Info("role changed", zap.String("old_role", string(old.role)),
		zap.Duration("drain", drained.Sub(ordered)), zap.Duration("total", time.Since(ordered)))
	return nil
}

// publishNow publishes a heartbeat at once (a drain, a new role).
func (w *Worker) publishNow() {
	if w.pub == nil {
		return
	}
	if err := w.pub.Publish(); err != nil {
		w.logger().Warn("publish heartbeat", zap.Error(err))
	}
}

// firstInRole is the mux's hook on a role's first request.
func (w *Worker) firstInRole(set *roleSet) {
	rr := w.cur()
	if rr == nil || rr.set != set || rr.ordered.IsZero() {
		return
	}
	d := time.Since(rr.ordered)
	w.rm.first(rr.role, d)
	rr.log.Info("first request in the new role", zap.Duration("since_command", d))
}

// roleMetrics are an elastic worker's role metrics.
type roleMetrics struct {
	role     *prometheus.GaugeVec
	changes  *prometheus.CounterVec
	firstReq *prometheus.HistogramVec
}

func newRoleMetrics(reg prometheus.Registerer) (*roleMetrics, error) {
	m := &roleMetrics{
		role: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pdserve_worker_role",
			Help: "1 for the role the elastic worker has now, 0 for the others.",
		}, []string{"role"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdserve_worker_role_changes_total",
			Help: "Role changes of the elastic worker, by old and new role.",
		}, []string{"from", "to"}),
		firstReq: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pdserve_worker_role_change_first_request_seconds",
			Help:    "Time from a role change command to the first request served in the new role.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}, []string{"role"}),
	}
	for _, c := range []prometheus.Collector{m.role, m.changes, m.firstReq} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("workerrun: role metrics: %w", err)
		}
	}
	return m, nil
}

func (m *roleMetrics) setRole(r control.Role) {
	for _, x := range []control.Role{control.RolePrefill, control.RoleDecode, control.RoleColocated} {
		v := 0.0
		if x == r {
			v = 1
		}
		m.role.WithLabelValues(string(x)).Set(v)
	}
}

func (m *roleMetrics) changed(from, to control.Role) {
	m.changes.WithLabelValues(string(from), string(to)).Inc()
}

func (m *roleMetrics) first(r control.Role, d time.Duration) {
	m.firstReq.WithLabelValues(string(r)).Observe(d.Seconds())
}

// trackingRegisterer registers through r and remembers what, so that a
// role's metrics can be unregistered when it stops. A nil one does
// nothing on unregisterAll.
type trackingRegisterer struct {
	r  prometheus.Registerer
	mu sync.Mutex
	cs []prometheus.Collector
}

func (t *trackingRegisterer) Register(c prometheus.Collector) error {
	if err := t.r.Register(c); err != nil {
		return err
	}
	t.mu.Lock()
	t.cs = append(t.cs, c)
	t.mu.Unlock()
	return nil
}

func (t *trackingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := t.Register(c); err != nil {
			panic(err)
		}
	}
}

func (t *trackingRegisterer) Unregister(c prometheus.Collector) bool { return t.r.Unregister(c) }

func (t *trackingRegisterer) unregisterAll() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.cs {
		t.r.Unregister(c)
	}
	t.cs = nil
}

// registry returns where a worker's metrics go and what /metrics serves.
func registry(o Options, id string) (prometheus.Registerer, prometheus.Gatherer) {
	if o.Registerer != nil {
		reg := prometheus.WrapRegistererWith(prometheus.Labels{"worker": id}, o.Registerer)
		g, _ := o.Registerer.(prometheus.Gatherer)
		return reg, g
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg, reg
}

// roleCommand takes a CmdRole: it checks the command and starts the
// change in the background (the reply says only that it was accepted;
// the heartbeats tell the rest).
func (w *Worker) roleCommand(c control.Command) error {
	ordered := time.Now()
	role := control.Role(c.Arg)
	switch {
	case w.mux == nil:
		return fmt.Errorf("role: worker %s was not started elastic", w.id)
	case role != control.RolePrefill && role != control.RoleDecode && role != control.RoleColocated:
		return fmt.Errorf("role: %q must be %s, %s or %s", c.Arg, control.RolePrefill, control.RoleDecode, control.RoleColocated)
	case w.draining.Load():
		return fmt.Errorf("role: worker %s is draining", w.id)
	case w.changing.Load():
		return fmt.Errorf("role: worker %s is changing role already", w.id)
	}
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		if err := w.ChangeRole(role, ordered, c.Migrate); err != nil && !errors.Is(err, ErrRoleChanging) {
			w.logger().Warn("role command failed", zap.String("new_role", c.Arg), zap.Error(err))
		}
	}()
	return nil
}
