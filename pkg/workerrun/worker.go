package workerrun

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/decode"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefill"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/tracing"
)

// Bounds of the steps of a stop that Options do not set.
const (
	grpcStopTimeout = 5 * time.Second // GracefulStop before forcing
	httpStopTimeout = 5 * time.Second
	natsStopTimeout = 5 * time.Second
	resendTimeout   = 5 * time.Minute // a "resend" command's transfer
)

// service is what the worker runs: a prefill or decode server.
type service interface {
	register(g grpc.ServiceRegistrar)
	Run(ctx context.Context) error
	Stop()
	SetDraining(bool)
	WaitIdle(ctx context.Context) error
	// fill fills hb in; digest: with the prefix digest.
	fill(hb *control.Heartbeat, digest bool)
	// prefixBlocks is the prefix cache's blocks, nil when it is off.
	prefixBlocks() prefixcache.Blocks
	// hostBlocks is its host tier's, nil when it has none.
	hostBlocks() prefixcache.Blocks
	cancel(id string) bool
	live() int
	// HandOverPrefixCache and AdoptPrefixCache move the prefix cache's
	// engine tier from a role's batch to the next one's (ChangeRole).
	HandOverPrefixCache(to chan<- prefixcache.Handover)
	AdoptPrefixCache(h prefixcache.Handover)
}

// diskBlocks returns the blocks of the disk tier behind host, a host
// tier's blocks (a *prefixcache.Host), for its own KV events; nil when
// there is none.
func diskBlocks(host prefixcache.Blocks) prefixcache.Blocks {
	h, ok := host.(interface{ Disk() *prefixcache.Disk })
	if !ok || h.Disk() == nil {
		return nil
	}
	return h.Disk()
}

type prefillService struct{ *prefill.Server }

func (p prefillService) register(g grpc.ServiceRegistrar) { p.Register(g) }
func (p prefillService) cancel(id string) bool            { return p.Cancel(id) }
func (p prefillService) live() int                        { return p.Stats().Live }
func (p prefillService) prefixBlocks() prefixcache.Blocks { return p.PrefixBlocks() }
func (p prefillService) hostBlocks() prefixcache.Blocks   { return p.HostBlocks() }
func (p prefillService) fill(hb *control.Heartbeat, digest bool) {
	st := p.Stats()
	hb.QueuedPrefillTokens = st.QueuedPrefillTokens
	hb.RunningBatch = st.LastBatch
	hb.StepTimesMs = st.StepTimesMs
	if digest {
		hb.PrefixDigest = p.PrefixDigest(prefixcache.DefaultDigestHashes)
	}
	hb.BlockTokens = p.BlockTokens()
	hb.PeerPullCost = p.PeerPullCost()
}

type decodeService struct {
	*decode.Server
	opts []kvtransfer.ServerOption
}

func (d decodeService) register(g grpc.ServiceRegistrar) { d.Register(g, d.opts...) }
func (d decodeService) cancel(id string) bool            { return d.CancelRequest(id) }
func (d decodeService) live() int                        { return d.Stats().Requests }
func (d decodeService) prefixBlocks() prefixcache.Blocks { return d.PrefixBlocks() }
func (d decodeService) hostBlocks() prefixcache.Blocks   { return d.HostBlocks() }
func (d decodeService) fill(hb *control.Heartbeat, digest bool) {
	st := d.Stats()
	hb.KVBlocksFree, hb.KVBlocksTotal = st.KVBlocksFree, st.KVBlocksTotal
	hb.MaxBatch = d.MaxBatch()
	hb.QueuedPrefillTokens = st.QueuedPrefillTokens
	hb.RunningBatch = st.Running
	hb.StepTimesMs = st.StepTimesMs
	if digest {
		hb.PrefixDigest = d.PrefixDigest(prefixcache.DefaultDigestHashes)
	}
	hb.BlockTokens = d.BlockTokens()
	hb.PeerPullCost = d.PeerPullCost()
}

// Worker is a started worker. Its methods are safe for concurrent use.
type Worker struct {
	o     Options
	log   *zap.Logger
	id    string
	addr  string // advertised gRPC address
	lis   net.Listener
	model string
	// hashKeyID is o.HashKey.ID(), for the heartbeats.
	hashKeyID string
	// epoch is this start's boot epoch (grpcauth.NewEpoch), for the
	// heartbeats.
	epoch  string
	eng    engine.Engine
	ownEng bool
	// rr is the role the worker serves now (see roleRun); a role change
	// replaces it.
	rr atomic.Pointer[roleRun]
	// base is the logger without the role, which each roleRun's log adds.
	base *zap.Logger
	// reg is where the worker's metrics go; each role's server registers
	// through its own roleRun.reg on an elastic worker.
	reg    prometheus.Registerer
	tlsCfg *grpcnet.TLS
	auth   *grpcauth.Auth
	// mux serves the role services of an elastic worker (nil: not
	// elastic, the role's server is registered on grpc directly).
	mux *roleMux
	// roleMu serializes role changes and the stop.
	roleMu sync.Mutex
	// changing is set while a role change drains the old role.
	changing atomic.Bool
	// benched: the codec self-benchmark has started (once per worker).
	benched atomic.Bool
	rm      *roleMetrics // nil unless elastic
	// tracer is the trace exporter built from Options.Tracing, nil when
	// Options.TracerProvider was given; closeAll flushes and stops it.
	tracer *tracing.Provider

	maxSeqLen int // the engine's MaxSeqLen, for heartbeats
	// codecs are the KV codecs that work on the engine's KV dtype, for
	// heartbeats; read only.
	codecs []string

	grpc   *grpc.Server
	health *health.Server
	http   *http.Server
	mlis   net.Listener
	nc     *nats.Conn
	ncDone chan struct{} // closed when nc closed
	pub    *control.Publisher
	// kvDType is the engine's KV dtype, which decode and colocated workers
	// benchmark the codecs on; codecSpeeds their figures once measured.
	kvDType     engine.DType
	codecSpeeds atomic.Pointer[[]control.CodecSpeed]

	bgCtx    context.Context // ends at stop; background work (heartbeats, resend commands)
	bgCancel context.CancelFunc
	wg       sync.WaitGroup // goroutines of the worker
	bg       sync.WaitGroup // background command work
	draining atomic.Bool

	failOnce sync.Once
	done     chan struct{} // closed when a part failed or the worker stopped
	errMu    sync.Mutex
	err      error // first failure of a part

	stopOnce sync.Once
	stopErr  error
}

// Start builds and starts a worker; it returns once every listener is open
// (Addr is valid). The NATS connection need not be up: it is retried in
// the background, forever, and the worker is not Ready (publishes no
// heartbeats) until it connects. ctx bounds only the start; stop the
// worker with Stop. Errors: invalid options, engine construction, listen,
// NATS credential files (control.ConnOptions.NATSOptions) or subscription
// errors, wrapped.
func Start(ctx context.Context, o Options, logger *zap.Logger) (_ *Worker, err error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	if o.ID == "" {
		o.ID = string(o.Role) + "-" + randomHex(4)
	}
	w := &Worker{id: o.ID, done: make(chan struct{})}
	w.base = logger.With(zap.String("worker", o.ID))
	log := w.base.With(zap.String("role", string(o.Role)))
	w.bgCtx, w.bgCancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			w.closeAll()
		}
	}()

	if o.EngineOverride != nil {
		w.eng = o.EngineOverride
	} else {
		enginebuild.SetLogger(log)
		if w.eng, err = enginebuild.Build(o.Engine); err != nil {
			return nil, fmt.Errorf("workerrun: %w", err)
		}
		w.ownEng = true
	}
	w.model, w.maxSeqLen = w.eng.Spec().Name, w.eng.Spec().MaxSeqLen
	for _, c := range codec.All() {
		if c.Supports(w.eng.Spec().KVDType) == nil {
			w.codecs = append(w.codecs, c.Name())
		}
	}
	if o.KVHashKeyFile != "" {
		if o.HashKey, err = kv.LoadHashKey(o.KVHashKeyFile); err != nil {
			return nil, fmt.Errorf("workerrun: %w", err)
		}
	}
	o.Prefill.PrefixCache.HashKey, o.Decode.PrefixCache.HashKey = o.HashKey, o.HashKey
	w.hashKeyID = o.HashKey.ID()
	if !o.HashKey.Keyed() && (o.Prefill.PrefixCache.Enabled() || o.Decode.PrefixCache.Enabled()) {
		log.Warn("KV block hashes are public: anyone can compute a prompt's hashes from its text and claim or ask for its cached KV by them; give every process the same --kv-hash-key-file")
	}
	o.Decode = fitPool(o.Decode, w.eng, log)

	reg, gatherer := registry(o, w.id)
	w.reg = reg
	if err := registerEngineMetrics(reg, w.eng); err != nil {
		return nil, err
	}
	tlsCfg, err := o.TLS.Load(o.tlsUse(), log.Named("tls"))
	if err != nil {
		return nil, fmt.Errorf("workerrun: %w", err)
	}
	w.tlsCfg = tlsCfg
	if reason := o.pullsUnverified(tlsCfg != nil); reason != "" && (o.Prefill.PeerLinkGbps > 0 || o.Decode.PeerLinkGbps > 0) {
		// A peer whose identity is not verified could serve anything as a
		// prompt's KV: it would be used, cached and passed on as computed.
		o.Prefill.PeerLinkGbps, o.Decode.PeerLinkGbps = 0, 0
		log.Warn("peer pulls are off: "+reason, zap.String("kv_security", "peer KV is not verified"))
	}
	o.GRPCAuth.Self = o.ID
	// This start's epoch: credentials signed for an earlier one are
	// refused, so a pull credential is single use across restarts.
	o.GRPCAuth.Epoch = grpcauth.NewEpoch()
	w.epoch = o.GRPCAuth.Epoch
	if w.auth, err = o.GRPCAuth.Load(o.authSends(), log.Named("grpcauth")); err != nil {
		return nil, fmt.Errorf("workerrun: %w", err)
	}
	w.o = o
	w.warnOpen(w.auth, log)
	tp := o.TracerProvider
	if tp == nil {
		if w.tracer, err = tracing.New(ctx, o.Tracing); err != nil {
			return nil, fmt.Errorf("workerrun: %w", err)
		}
		tp = w.tracer.TracerProvider()
	}
	gopts := append(w.auth.ServerOptions(), o.Keepalive.ServerOptions()...)
	gopts = append(gopts, tracing.ServerOptions(tp)...)
	if o.Role != control.RolePrefill || o.Elastic {
		gopts = append(gopts, kvtransfer.GRPCServerOptions(kvServerOptions(log)...)...)
	}
	if o.Elastic {
		if w.rm, err = newRoleMetrics(reg); err != nil {
			return nil, err
		}
		w.mux = &roleMux{first: w.firstInRole}
	}
	rr, err := w.buildRole(o.Role)
	if err != nil {
		return nil, err
	}
	w.rr.Store(rr)

	if w.lis, err = net.Listen("tcp", o.GRPCAddr); err != nil {
		return nil, fmt.Errorf("workerrun: grpc listen: %w", err)
	}
	if w.addr, err = advertise(o.AdvertiseAddr, w.lis.Addr()); err != nil {
		return nil, err
	}
	w.grpc = grpc.NewServer(append(gopts, grpc.Creds(tlsCfg.ServerCredentials()))...)
	if w.mux != nil {
		w.mux.install(w.grpc)
	} else {
		rr.svc.register(w.grpc)
	}
	w.health = health.NewServer()
	healthpb.RegisterHealthServer(w.grpc, w.health)
	w.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)

	if o.MetricsAddr != "" {
		if w.mlis, err = net.Listen("tcp", o.MetricsAddr); err != nil {
			return nil, fmt.Errorf("workerrun: metrics listen: %w", err)
		}
		w.http = &http.Server{Handler: w.httpHandler(gatherer), ReadHeaderTimeout: 10 * time.Second}
	}

	if o.NATSURL != "" {
		w.ncDone = make(chan struct{})
		// Connect returns at once; without a NATS server yet, it retries
		// in the background and the worker stays not ready until then.
		w.nc, err = o.NATS.Connect(o.NATSURL, "pdserve-"+o.ID, w.base.Named("nats"),
			nats.DrainTimeout(natsStopTimeout),
			nats.ClosedHandler(func(*nats.Conn) { close(w.ncDone) }),
		)
		if err != nil {
			w.ncDone = nil
			return nil, fmt.Errorf("workerrun: %w", err)
		}
		w.pub = control.NewPublisher(w.nc, o.HeartbeatInterval, w.heartbeat)
	}
	if err := w.connectRole(rr); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("workerrun: start: %w", err)
	}
	if w.nc == nil {
		log.Warn("no NATS URL: the worker publishes no heartbeats and takes no commands")
	} else if remote := remoteNATS(o.NATSURL); isLoopback(w.addr) && remote != "" {
		log.Warn("the worker advertises a loopback gRPC address on a NATS server of another host: "+
			"a coordinator or prefill worker on another host cannot dial it; give --grpc-addr (e.g. :9000, every interface) "+
			"or --advertise-addr (the address others dial)",
			zap.String("advertise_addr", w.addr), zap.String("nats_host", remote))
	}

	// Everything is set up: start the goroutines.
	w.runRole(rr)
	w.goPart("grpc", func() error {
		// A stop that comes before Serve started is a stop, not a failure.
		if err := w.grpc.Serve(w.lis); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	if w.http != nil {
		w.goPart("http", func() error {
			if err := w.http.Serve(w.mlis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if w.pub != nil {
		w.goPart("heartbeat", func() error { return w.pub.Run(w.bgCtx) })
	}
	log.Info("worker started", zap.String("grpc_addr", w.lis.Addr().String()), zap.String("advertise_addr", w.addr),
		zap.String("metrics_addr", w.MetricsAddr()), zap.String("model", w.model), zap.Bool("tls", o.TLS.Enabled()), zap.Bool("elastic", o.Elastic))
	return w, nil
}

// warnOpen warns when the gRPC server lets in more than the coordinator
// and the prefill workers.
func (w *Worker) warnOpen(a *grpcauth.Auth, log *zap.Logger) {
	mutual := w.o.TLS.CAFile != "" && w.o.TLS.CertFile != ""
	switch {
	case !a.Tokens() && !a.Verifies() && !mutual:
		log.Warn("gRPC is open: without --grpc-verify-key, --grpc-token-file or mutual TLS (--tls-cert, --tls-key, --tls-ca) anyone who reaches this port may call every method")
	case !a.Tokens() && !a.Verifies() && !a.Identities():
		log.Warn("gRPC roles are not checked: any certificate the CA signs may call every method; set --tls-allow-coordinator and --tls-allow-prefill, or --grpc-verify-key")
	}
}

func serviceName(r control.Role) string {
	if r == control.RolePrefill {
		return pdservev1.PrefillService_ServiceDesc.ServiceName
	}
	return pdservev1.DecodeService_ServiceDesc.ServiceName
}

func (w *Worker) httpHandler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	if g != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.WriteHeader(http.StatusOK)
		_, _ = rw.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if err := w.Ready(); err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = rw.Write([]byte("ok\n"))
	})
	return mux
}

// advertise returns addr, or the listen address with the host name for an
// unspecified host.
func advertise(addr string, l net.Addr) (string, error) {
	if addr != "" {
		return addr, nil
	}
	host, port, err := net.SplitHostPort(l.String())
	if err != nil {
		return "", fmt.Errorf("workerrun: listen address %s: %w", l, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if host, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("workerrun: advertise address: %w", err)
		}
	}
	return net.JoinHostPort(host, port), nil
}

// isLoopback reports whether the host of addr (host:port) is a loopback
// address or localhost: reachable from this host only.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	return host == "localhost" || strings.HasSuffix(host, ".localhost")
}

// remoteNATS returns the first host of the NATS URLs in urls (comma
// separated, as nats.Connect takes them) that is not a loopback one, or ""
// when all are on this host (or none parses).
func remoteNATS(urls string) string {
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			continue
		}
		if !strings.Contains(u, "://") {
			u = "nats://" + u
		}
		p, err := url.Parse(u)
		if err != nil || p.Hostname() == "" {
			continue
		}
		if !isLoopback(net.JoinHostPort(p.Hostname(), "0")) {
			return p.Hostname()
		}
	}
	return ""
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// goPart runs one part of the worker; an error fails the worker.
func (w *Worker) goPart(name string, f func() error) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		if err := f(); err != nil {
			w.fail(fmt.Errorf("workerrun: %s: %w", name, err))
		}
	}()
}

func (w *Worker) fail(err error) {
	w.errMu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.errMu.Unlock()
	w.failOnce.Do(func() { close(w.done) })
}

// ID returns the worker's id.
func (w *Worker) ID() string { return w.id }

// Role returns the worker's role now (see ChangeRole).
func (w *Worker) Role() control.Role { return w.cur().role }

// pullsUnverified returns why this worker cannot verify the peers it
// would pull KV from ("" when it can): plaintext gRPC, or TLS that takes
// any certificate of the CA as any worker (an empty
// --tls-worker-identity). Workers of one process (PeersInProcess) need
// no proof.
func (o Options) pullsUnverified(tls bool) string {
	switch {
	case o.PeersInProcess:
		return ""
	case !tls:
		return "gRPC is plaintext, so a peer's identity cannot be verified (a fake peer claiming a prompt's blocks would serve its KV); serve gRPC over TLS (--tls-cert, --tls-key, --tls-ca) to pull"
	case o.GRPCAuth.WorkerIdentities != nil && len(o.GRPCAuth.WorkerIdentities) == 0:
		return "--tls-worker-identity is empty, so any certificate of the CA passes for any peer; name the peers' identities to pull"
	}
	return ""
}

// BootEpoch returns this start's epoch (its heartbeats' boot_epoch):
// the credentials the coordinator signs for it name it.
func (w *Worker) BootEpoch() string { return w.epoch }

// Addr returns the gRPC address others dial (the advertised address).
func (w *Worker) Addr() string { return w.addr }

// ListenAddr returns the address the gRPC server listens on.
func (w *Worker) ListenAddr() string { return w.lis.Addr().String() }

// MetricsAddr returns the HTTP server's address, or "" without one.
func (w *Worker) MetricsAddr() string {
	if w.mlis == nil {
		return ""
	}
	return w.mlis.Addr().String()
}

// Engine returns the worker's engine. The worker's scheduler owns it: do
// not call its methods while the worker runs.
func (w *Worker) Engine() engine.Engine { return w.eng }

// Done is closed when a part of the worker failed (see Err) or it stopped.
func (w *Worker) Done() <-chan struct{} { return w.done }

// Err returns the first failure of a part of the worker, or nil.
func (w *Worker) Err() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

// Ready returns nil when the worker takes new requests and the
// coordinator can find it: not draining and, with a NATS URL, connected to
// NATS (heartbeats fall while it is not). /readyz answers 503 otherwise.
func (w *Worker) Ready() error {
	switch {
	case w.draining.Load():
		return errors.New("draining")
	case w.nc != nil && !w.nc.IsConnected():
		return errors.New("not connected to NATS")
	}
	return nil
}

// Draining reports whether the worker was told to drain.
func (w *Worker) Draining() bool { return w.draining.Load() }

// Drain marks the worker draining and tells the coordinator at once: new
// Prefill and Reserve calls fail with UNAVAILABLE; requests in flight go on.
func (w *Worker) Drain() {
	if w.draining.Swap(true) {
		return
	}
	w.cur().svc.SetDraining(true)
	w.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	w.publishNow()
	w.logger().Info("worker draining")
}

// heartbeat is the Publisher's snapshot.
func (w *Worker) heartbeat() control.Heartbeat {
	rr := w.cur()
	hb := control.Heartbeat{
		ID:       w.id,
		Role:     string(rr.role),
		GRPCAddr: w.addr,
		Model:    w.model,
		// A role change drains the old role: the router sends it nothing
		// more until the heartbeat of the new role.
		Draining: w.draining.Load() || w.changing.Load(),
		Elastic:  w.mux != nil,
	}
	hb.MaxSeqLen = w.maxSeqLen
	hb.Codecs = w.codecs
	hb.HashKeyID, hb.BootEpoch = w.hashKeyID, w.epoch
	rr.svc.fill(&hb, rr.kvpub == nil)
	if sp := w.codecSpeeds.Load(); sp != nil {
		hb.CodecSpeeds, hb.CodecCores = *sp, runtime.GOMAXPROCS(0)
	}
	return hb
}

// benchCodecs runs the codec self-benchmark of a worker that receives KV
// (decode, colocated) and publishes its figures in the heartbeats from
// then on, for the prefill workers' codec choice. It runs once, in the
// background, after the worker started; a failure is logged.
func (w *Worker) benchCodecs() {
	sp, err := codec.SelfBench(w.bgCtx, w.kvDType, codec.DefaultBenchBudget)
	if err != nil {
		if w.bgCtx.Err() == nil {
			w.logger().Warn("codec self-benchmark failed; heartbeats carry no codec speeds", zap.Error(err))
		}
		return
	}
	out := make([]control.CodecSpeed, 0, len(sp.Codecs))
	for _, c := range sp.Codecs {
		out = append(out, control.CodecSpeed{Codec: c.Codec, EncodeBytesPerSec: c.EncodeBytesPerSec, DecodeBytesPerSec: c.DecodeBytesPerSec, Ratio: c.Ratio})
		w.logger().Info("codec self-benchmark", zap.String("codec", c.Codec), zap.Stringer("dtype", sp.DType),
			zap.Float64("encode_mb_per_s_per_core", c.EncodeBytesPerSec/1e6), zap.Float64("decode_mb_per_s_per_core", c.DecodeBytesPerSec/1e6),
			zap.Float64("ratio", c.Ratio), zap.Bool("cpu_time", sp.CPUTime))
	}
	w.codecSpeeds.Store(&out)
}

// receiverTTLBeats is how many heartbeat intervals a receiver's codec
// speeds are kept after its last heartbeat.
const receiverTTLBeats = 10

// watchReceivers makes a prefill worker read the heartbeats of decode and
// colocated workers (its NATS permissions allow those) and hand their
// codec speeds to its codec choice, by gRPC address.
func (w *Worker) watchReceivers(rr *roleRun) error {
	m := control.NewMembership(receiverTTLBeats * w.o.HeartbeatInterval)
	stop, err := control.Watch(rr.ctx, w.nc, m, time.Now, w.o.HeartbeatInterval,
		control.WatchRoles(control.RoleDecode, control.RoleColocated), control.WatchLogger(rr.log.Named("watch")))
	if err != nil {
		return fmt.Errorf("workerrun: watch receivers: %w", err)
	}
	rr.unwatch, rr.receivers = stop, m
	rr.pre.SetReceivers(func(addr string) (kvtransfer.ReceiverSpeeds, bool) { return receiverSpeeds(m, addr) })
	return nil
}

// receiverSpeeds returns what the live decode or colocated member at
// addr says of its decoding.
func receiverSpeeds(m *control.Membership, addr string) (kvtransfer.ReceiverSpeeds, bool) {
	for _, hb := range m.All() {
		if hb.GRPCAddr != addr || (hb.Role != string(control.RoleDecode) && hb.Role != string(control.RoleColocated)) || len(hb.CodecSpeeds) == 0 {
			continue
		}
		r := kvtransfer.ReceiverSpeeds{Cores: hb.CodecCores, DecodeBytesPerSec: make(map[string]float64, len(hb.CodecSpeeds))}
		for _, c := range hb.CodecSpeeds {
			if c.DecodeBytesPerSec > 0 && !math.IsInf(c.DecodeBytesPerSec, 0) {
				r.DecodeBytesPerSec[c.Codec] = c.DecodeBytesPerSec
			}
		}
		return r, true
	}
	return kvtransfer.ReceiverSpeeds{}, false
}

// kvObserver hands the prefix cache's reports to the KV publisher.
type kvObserver struct{ p *control.KVPublisher }

func (o kvObserver) Stored(h kv.Hash)  { o.p.Stored(uint64(h)) }
func (o kvObserver) Removed(h kv.Hash) { o.p.Removed(uint64(h)) }

// command handles one control-plane command.
func (w *Worker) command(c control.Command) error {
	rr := w.cur()
	switch c.Kind {
	case control.CmdDrain:
		w.Drain()
		return nil
	case control.CmdCancel:
		if c.RequestID == "" {
			return errors.New("cancel: request id is empty")
		}
		if !rr.svc.cancel(c.RequestID) {
			w.logger().Debug("cancel command for an unknown request", zap.String("request_id", c.RequestID))
		}
		return nil
	case control.CmdKVSnapshot:
		if rr.kvpub == nil {
			return fmt.Errorf("kv snapshot: worker %s publishes no KV events", w.id)
		}
		rr.kvpub.RequestSnapshot()
		if rr.hostpub != nil {
			rr.hostpub.RequestSnapshot()
		}
		if rr.diskpub != nil {
			rr.diskpub.RequestSnapshot()
		}
		return nil
	case control.CmdResend:
		pre := rr.pre
		if pre == nil {
			return fmt.Errorf("resend: worker %s is not a prefill worker", w.id)
		}
		if c.RequestID == "" || c.Arg == "" {
			return errors.New("resend: request id and decode address (arg) are required")
		}
		w.bg.Add(1)
		go func() {
			defer w.bg.Done()
			ctx, cancel := context.WithTimeout(w.bgCtx, resendTimeout)
			defer cancel()
			if _, err := pre.Resend(ctx, &pdservev1.ResendRequest{RequestId: c.RequestID, DecodeAddr: c.Arg}); err != nil {
				w.logger().Warn("resend command failed", zap.String("request_id", c.RequestID), zap.String("decode_addr", c.Arg), zap.Error(err))
				return
			}
			w.logger().Info("kv re-sent by command", zap.String("request_id", c.RequestID), zap.String("decode_addr", c.Arg))
		}()
		return nil
	case control.CmdRole:
		return w.roleCommand(c)
	}
	return fmt.Errorf("unknown command kind %q", c.Kind)
}

// Stop stops the worker gracefully: drain (bounded by Options.DrainTimeout
// and ctx), stop the scheduler, stop gRPC (forcibly once ctx ends or after
// a few seconds), drain NATS, shut HTTP down, close the engine. It returns
// the first failure of a part of the worker or of the stop itself; later
// calls return the same.
func (w *Worker) Stop(ctx context.Context) error {
	w.stopOnce.Do(func() { w.stopErr = w.stop(ctx, true) })
	return w.stopErr
}

// Kill stops the worker at once, as a crash would: open streams and
// transfers break with UNAVAILABLE, nothing drains. For failure tests and
// for a second signal. It returns what Stop returns.
func (w *Worker) Kill() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.stopOnce.Do(func() { w.stopErr = w.stop(ctx, false) })
	return w.stopErr
}

func (w *Worker) stop(ctx context.Context, graceful bool) error {
	var errs []error
	if !graceful {
		// Break the calls in flight, a role change's drain included.
		w.draining.Store(true)
		w.grpc.Stop()
	}
	w.roleMu.Lock() // a role change waits, then finds the worker stopping
	rr := w.cur()
	if graceful {
		w.Drain()
		dctx, cancel := context.WithTimeout(ctx, w.o.DrainTimeout)
		if err := rr.svc.WaitIdle(dctx); err != nil {
			rr.log.Warn("drain timed out; failing the requests left", zap.Int("requests", rr.svc.live()), zap.Duration("drain_timeout", w.o.DrainTimeout))
		}
		cancel()
	} else {
		rr.svc.SetDraining(true)
	}
	// Stop the scheduler (it fails what is left) and background work.
	w.bgCancel()
	w.stopRole(rr)
	w.roleMu.Unlock() // before the wait: a role command's goroutine may be waiting for it
	w.bg.Wait()
	if graceful {
		stopped := make(chan struct{})
		go func() {
			w.grpc.GracefulStop()
			close(stopped)
		}()
		t := time.NewTimer(grpcStopTimeout)
		select {
		case <-stopped:
		case <-ctx.Done():
			w.grpc.Stop()
		case <-t.C:
			rr.log.Warn("grpc graceful stop timed out; forcing")
			w.grpc.Stop()
		}
		t.Stop()
		<-stopped
	}
	if err := w.closeNATS(graceful); err != nil {
		errs = append(errs, err)
	}
	if w.http != nil {
		hctx, cancel := context.WithTimeout(context.Background(), httpStopTimeout)
		if !graceful {
			_ = w.http.Close()
		} else if err := w.http.Shutdown(hctx); err != nil {
			errs = append(errs, fmt.Errorf("workerrun: http shutdown: %w", err))
			_ = w.http.Close()
		}
		cancel()
	}
	w.wg.Wait()
	w.closeAll()
	w.failOnce.Do(func() { close(w.done) })
	if err := w.Err(); err != nil {
		errs = append([]error{err}, errs...)
	}
	rr.log.Info("worker stopped", zap.Bool("graceful", graceful))
	return errors.Join(errs...)
}

// closeNATS drains (graceful) or closes the NATS connection and waits for
// it to close.
func (w *Worker) closeNATS(graceful bool) error {
	if w.nc == nil {
		return nil
	}
	if !graceful {
		w.nc.Close()
		<-w.ncDone
		return nil
	}
	switch err := w.nc.Drain(); {
	case errors.Is(err, nats.ErrConnectionReconnecting):
		// Not connected: Drain closed the connection; nothing to drain.
		<-w.ncDone
		return nil
	case err != nil && !errors.Is(err, nats.ErrConnectionClosed):
		w.nc.Close()
		<-w.ncDone
		return fmt.Errorf("workerrun: nats drain: %w", err)
	}
	t := time.NewTimer(natsStopTimeout + time.Second)
	defer t.Stop()
	select {
	case <-w.ncDone:
	case <-t.C:
		w.nc.Close()
		<-w.ncDone
	}
	return nil
}

// closeAll releases what Start acquired; safe after a partial Start.
func (w *Worker) closeAll() {
	if w.bgCancel != nil {
		w.bgCancel()
	}
	rr := w.cur()
	if rr != nil && rr.unwatch != nil {
		rr.unwatch() // idempotent
	}
	if w.nc != nil && !w.nc.IsClosed() {
		w.nc.Close()
	}
	if w.lis != nil {
		_ = w.lis.Close()
	}
	if w.mlis != nil {
		_ = w.mlis.Close()
	}
	if rr != nil {
		if rr.dialer != nil {
			_ = rr.dialer.Close()
		}
		rr.svc.Stop()
	}
	if w.ownEng && w.eng != nil {
		enginebuild.Close(w.eng)
	}
	if w.tracer != nil {
		ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
		if err := w.tracer.Shutdown(ctx); err != nil {
			w.logger().Warn("trace export did not finish", zap.Error(err))
		}
		cancel()
		w.tracer = nil
	}
}

// traceFlushTimeout bounds the export of the spans left at stop.
const traceFlushTimeout = 5 * time.Second

// Run starts a worker, calls ready (if not nil) with its gRPC address,
// blocks until ctx ends or a part of the worker fails, and stops it
// gracefully. It returns the failure, or nil after a clean stop: also
// when ctx ends while it starts (a SIGTERM then; Start has undone what
// it started).
func Run(ctx context.Context, o Options, logger *zap.Logger, ready func(addr string)) error {
	w, err := Start(ctx, o, logger)
	if err != nil {
		if ctx.Err() != nil {
			if logger != nil {
				logger.Info("worker stopped while starting", zap.NamedError("cause", err))
			}
			return nil
		}
		return err
	}
	if ready != nil {
		ready(w.Addr())
	}
	select {
	case <-ctx.Done():
	case <-w.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), w.o.DrainTimeout+grpcStopTimeout+httpStopTimeout+natsStopTimeout)
	defer cancel()
	return w.Stop(sctx)
}

// transferEngine is an engine that can tell whether its KV can leave and
// enter it (llamacpp: not for every architecture).
type transferEngine interface {
	Transferable() error
}

// capacityEngine is an engine whose KV memory is fixed when it is built
// (llamacpp: the cells of its context and its sequence slots), so that a
// pool larger than it would fail steps.
type capacityEngine interface {
	KVCapacity() (tokens, seqs int)
}

// decodeDialer returns the dialer a decode or colocated worker's local
// prefills pull a prompt's cached prefix from a peer worker with
// (GenerateRequest.peer), with the gRPC credentials of auth and the
// pull's credential per call: over TLS only from a peer whose
// certificate, verified against --tls-ca, names the role and id the
// coordinator's index says. Nil when the worker does not pull
// (--peer-link-gbps 0, no prefix cache), or when TLS is on without
// --tls-ca: no peer could be verified (logged).
func decodeDialer(o Options, tlsCfg *grpcnet.TLS, auth *grpcauth.Auth, log *zap.Logger) *kvtransfer.Dialer {
	if o.Decode.PeerLinkGbps <= 0 || o.Decode.PrefixCache.MaxTokens == 0 {
		return nil
	}
	if tlsCfg != nil && o.TLS.CAFile == "" {
		log.Info("peer pulls off: over TLS a pull verifies the peer's certificate, which needs --tls-ca")
		return nil
	}
	dopts := []kvtransfer.DialOption{kvtransfer.WithConnsPerAddr(1), kvtransfer.WithLinkGbps(o.PaceGbps), kvtransfer.WithLogger(log.Named("kvtransfer")),
		kvtransfer.WithKeepalive(o.Keepalive.ClientParameters()), kvtransfer.WithGRPCDialOptions(auth.DialOptions()...)}
	if tlsCfg != nil {
		base := tlsCfg.ClientConfig()
		dopts = append(dopts, kvtransfer.WithPullTLS(func(role, id string) *tls.Config {
			return auth.WorkerTLS(base, role, id)
		}))
	}
	return kvtransfer.NewDialer(dopts...)
}

// decodeHostTier turns the auto host tier of a decode worker of role
// decode off, logging it: with remote prefill it loads from its host tier
// only the prompts it prefills itself, while every entry it evicts would
// be copied there in its decode loop (loadtest/results/host-tier/). A
// colocated worker, and a size asked for, keep theirs.
func decodeHostTier(role control.Role, o decode.Options, log *zap.Logger) decode.Options {
	if role == control.RoleDecode && o.PrefixCache.HostBytes == prefixcache.Auto && o.PrefixCache.DiskBytes == 0 {
		o.PrefixCache.HostBytes = 0
		log.Info("no host tier on a decode worker of role decode by default: it would spill in its decode loop for prompts it seldom prefills (--host-cache-bytes N turns it on)")
	}
	return o
}

// sizeHostTier resolves an auto host tier of an enabled prefix cache to
// its size, logged: a quarter of the memory the process may still use
// (auto: prefixcache.AutoHostBytes). Where that cannot be read (no /proc, as in a
// bare chroot) the worker serves without a host tier and says so, rather
// than not starting for a default.
func sizeHostTier(o prefixcache.Options, auto func() (int64, error), log *zap.Logger) prefixcache.Options {
	if !o.Enabled() || o.HostBytes != prefixcache.Auto {
		return o
	}
	bytes, err := auto()
	if err != nil {
		log.Warn("no host tier: the free memory is unknown (--host-cache-bytes N sets one)", zap.Error(err))
		o.HostBytes = 0
		return o
	}
	o.HostBytes = bytes
	log.Info("host tier sized by the free memory", zap.Int64("host_cache_bytes", bytes))
	return o
}

// fitPool shrinks the decode pool and batch to what e can hold, logging
// any change; engines without a fixed capacity leave o as it is.
func fitPool(o decode.Options, e engine.Engine, log *zap.Logger) decode.Options {
	c, ok := e.(capacityEngine)
	if !ok {
		return o
	}
	tokens, seqs := c.KVCapacity()
	if blocks := tokens / o.BlockTokens; o.KVBlocks > blocks {
		log.Info("KV pool fitted to the engine's KV cache", zap.Int("kv_blocks_asked", o.KVBlocks), zap.Int("kv_blocks", blocks), zap.Int("engine_kv_tokens", tokens))
		o.KVBlocks = blocks
	}
	if o.MaxBatch > seqs {
		log.Info("batch fitted to the engine's sequence slots", zap.Int("max_batch_asked", o.MaxBatch), zap.Int("max_batch", seqs))
		o.MaxBatch = seqs
	}
	// Cached prompts are engine sequences too: they get the slots the
	// batch leaves (each running sequence and a trim fork need one).
	if pc := &o.PrefixCache; pc.Enabled() {
		if free := seqs - o.MaxBatch - 1; pc.MaxEntries > free {
			log.Info("prefix cache entries fitted to the engine's sequence slots", zap.Int("prefix_cache_entries_asked", pc.MaxEntries), zap.Int("prefix_cache_entries", max(free, 0)))
			pc.MaxEntries = free
			if free <= 0 {
				log.Warn("no sequence slot left for the prefix cache; it is off")
				pc.MaxTokens = 0
			}
		}
	}
	return o
}
