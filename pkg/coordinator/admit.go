package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
)

// Admission timing: how often pending members are looked at, how long a
// probe may take, and how long a failed one waits before the next.
const (
	admitEvery   = 50 * time.Millisecond
	probeTimeout = 5 * time.Second
	probeBackoff = time.Second
	// probeBackoffMax caps the backoff, which doubles at each failure
	// of the same peer.
	probeBackoffMax = 30 * time.Second
)

// Reasons a heartbeat is refused, the label of
// pdserve_coordinator_heartbeats_refused_total.
const (
	refusedRole        = "role"         // a role this mode does not use
	refusedLimits      = "limits"       // counts that contradict each other or the role
	refusedBlockTokens = "block_tokens" // a block size other than --block-tokens
	refusedCodec       = "codec"        // cannot code --codec on its KV
	refusedModel       = "model"        // no model name
	refusedNetwork     = "network"      // a grpc_addr outside --worker-networks
	refusedHashKey     = "kv_hash_key"  // block hashes under another key
)

// refusal is one reason checkHeartbeat refuses a heartbeat.
type refusal struct {
	reason string
	err    error
}

func (r refusal) Error() string { return r.err.Error() }

// checkHeartbeat refuses a heartbeat whose limits or shape contradict the
// coordinator's configuration of its role: negative counts, more free KV
// blocks than the pool has, a decode worker without KV blocks, a context
// shorter than one KV block, a role this mode does not use, a block size
// other than --block-tokens (prefix hashes and the KV room estimate would
// be wrong), block hashes under another --kv-hash-key-file, or KV that --codec cannot code. It is the Membership's
// check (control.WithCheck): a refused worker is removed and logged once
// per reason. The error joins one refusal per reason.
func (o Options) checkHeartbeat(hb control.Heartbeat) error {
	var errs []error
	bad := func(reason, format string, a ...any) {
		errs = append(errs, refusal{reason, fmt.Errorf(format, a...)})
	}
	want := []control.Role{control.RolePrefill, control.RoleDecode}
	if o.Mode == ModeColocated {
		want = []control.Role{control.RoleColocated}
	}
	known := false
	for _, r := range want {
		known = known || hb.Role == string(r)
	}
	if !known {
		bad(refusedRole, "role %q is not one of this %s coordinator's (%v)", hb.Role, o.Mode, want)
	}
	for name, v := range map[string]int{"kv_blocks_free": hb.KVBlocksFree, "kv_blocks_total": hb.KVBlocksTotal,
		"queued_prefill_tokens": hb.QueuedPrefillTokens, "running_batch": hb.RunningBatch, "max_seq_len": hb.MaxSeqLen,
		"block_tokens": hb.BlockTokens} {
		if v < 0 {
			bad(refusedLimits, "%s %d is negative", name, v)
		}
	}
	if hb.KVBlocksFree > hb.KVBlocksTotal {
		bad(refusedLimits, "kv_blocks_free %d exceeds kv_blocks_total %d", hb.KVBlocksFree, hb.KVBlocksTotal)
	}
	if hb.Role != string(control.RolePrefill) && known && hb.KVBlocksTotal <= 0 {
		bad(refusedLimits, "a %s worker without KV blocks (kv_blocks_total %d)", hb.Role, hb.KVBlocksTotal)
	}
	// The shortest context a worker may advertise is one block of prefix
	// hashing: max_seq_len 1 is a forgery, not a model.
	if hb.MaxSeqLen > 0 && hb.MaxSeqLen < o.BlockTokens {
		bad(refusedLimits, "max_seq_len %d is shorter than one KV block (%d tokens)", hb.MaxSeqLen, o.BlockTokens)
	}
	if hb.BlockTokens > 0 && hb.BlockTokens != o.BlockTokens {
		bad(refusedBlockTokens, "block_tokens %d differs from the coordinator's --block-tokens %d: give every worker and the coordinator the same --block-tokens",
			hb.BlockTokens, o.BlockTokens)
	}
	if id := o.HashKey.ID(); hb.HashKeyID != id {
		show := func(id string) string {
			if id == "" {
				return "no key (public hashes)"
			}
			return "key " + id
		}
		bad(refusedHashKey, "its KV block hashes are keyed with %s, the coordinator's with %s: give every worker and the coordinator the same --kv-hash-key-file",
			show(hb.HashKeyID), show(id))
	}
	if auto, _ := codecpick.AutoName(o.Codec); o.Codec != "" && !auto && o.Mode == ModeDisaggregated && len(hb.Codecs) > 0 {
		if c, err := codec.ByName(o.Codec); err == nil && !slices.Contains(hb.Codecs, c.Name()) {
			bad(refusedCodec, "its KV cannot be coded with --codec %s (it takes %s)", o.Codec, strings.Join(hb.Codecs, ", "))
		}
	}
	if hb.Model == "" && o.ModelName == "" {
		bad(refusedModel, "no model name (and no --model-name)")
	}
	if ns, err := parseNetworks(o.workerNetworks()); err == nil {
		if err := ns.checkLiteral(hb.GRPCAddr); err != nil {
			bad(refusedNetwork, "%w: the coordinator does not dial it", err)
		}
	}
	return errors.Join(errs...)
}

// countingCheck returns check counting each refusal of a heartbeat by
// reason in pdserve_coordinator_heartbeats_refused_total, registered
// with reg.
func countingCheck(check func(control.Heartbeat) error, reg prometheus.Registerer) func(control.Heartbeat) error {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pdserve_coordinator_heartbeats_refused_total",
		Help: "Worker heartbeats the coordinator refused, by reason: role, limits, block_tokens, codec, model, network, kv_hash_key (a refused worker is not routed to; its heartbeats go on being refused and counted).",
	}, []string{"reason"})
	for _, r := range []string{refusedRole, refusedLimits, refusedBlockTokens, refusedCodec, refusedModel, refusedNetwork, refusedHashKey} {
		refused.WithLabelValues(r)
	}
	reg.MustRegister(refused)
	return func(hb control.Heartbeat) error {
		err := check(hb)
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			seen := map[string]bool{}
			for _, e := range j.Unwrap() {
				if r, ok := e.(refusal); ok && !seen[r.reason] {
					seen[r.reason] = true
					refused.WithLabelValues(r.reason).Inc()
				}
			}
		}
		return err
	}
}

// admitter admits the members the coordinator verified (see
// control.RequireAdmission): it calls each new member's gRPC health
// service over the connection every later call uses, whose TLS handshake
// (with TLS) verifies that the certificate names the heartbeat's role and
// id before anything is sent; only then is the member routable and its
// model listed. Without TLS the call only shows that a gRPC server
// answers at the address: the member is admitted unverified (see the
// package doc).
type admitter struct {
	members  *control.Membership
	conns    *conns
	log      *zap.Logger
	verified bool // TLS: admission proves the identity

	mu       sync.Mutex
	inFlight map[string]bool      // peer keys probed now
	retryAt  map[string]time.Time // peer key → not before
	failure  map[string]string    // peer key → the last failure logged
	backoff  map[string]time.Duration
	// onAdmit is called for each member admitted (nil: none); it must
	// not block.
	onAdmit func(id, role string)
}

func newAdmitter(m *control.Membership, cs *conns, verified bool, log *zap.Logger) *admitter {
	return &admitter{members: m, conns: cs, log: log, verified: verified,
		inFlight: map[string]bool{}, retryAt: map[string]time.Time{}, failure: map[string]string{}, backoff: map[string]time.Duration{}}
}

// run probes pending members until ctx ends.
func (a *admitter) run(ctx context.Context, wg *sync.WaitGroup) {
	t := time.NewTicker(admitEvery)
	defer t.Stop()
	for {
		a.round(ctx, wg, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round starts a probe of each pending member not probed now and not
// waiting after a failure, and forgets the state of peers that left.
func (a *admitter) round(ctx context.Context, wg *sync.WaitGroup, now time.Time) {
	pending := a.members.Pending()
	live := make(map[string]bool, len(pending))
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, hb := range pending {
		p := peer{id: hb.ID, role: hb.Role, addr: hb.GRPCAddr}
		k := p.key()
		live[k] = true
		if a.inFlight[k] || now.Before(a.retryAt[k]) {
			continue
		}
		a.inFlight[k] = true
		wg.Go(func() { a.probe(ctx, p, hb.Model) })
	}
	for k := range a.retryAt {
		if !live[k] && !a.inFlight[k] {
			delete(a.retryAt, k)
			delete(a.failure, k)
			delete(a.backoff, k)
		}
	}
}

// probe calls p's health service and admits p when it answers SERVING.
func (a *admitter) probe(ctx context.Context, p peer, model string) {
	err := a.check(ctx, p)
	a.mu.Lock()
	delete(a.inFlight, p.key())
	if err != nil {
		b := min(max(2*a.backoff[p.key()], probeBackoff), probeBackoffMax)
		a.backoff[p.key()] = b
		a.retryAt[p.key()] = time.Now().Add(b)
		first := a.failure[p.key()] != err.Error()
		a.failure[p.key()] = err.Error()
		a.mu.Unlock()
		if first && ctx.Err() == nil {
			a.log.Warn("worker not admitted: its gRPC server did not pass the coordinator's check; it gets no requests",
				zap.String("worker", p.id), zap.String("role", p.role), zap.String("addr", p.addr), zap.Error(err))
		}
		return
	}
	delete(a.retryAt, p.key())
	delete(a.failure, p.key())
	delete(a.backoff, p.key())
	a.mu.Unlock()
	if a.members.Admit(p.id, p.role, p.addr) {
		if a.onAdmit != nil {
			a.onAdmit(p.id, p.role)
		}
		if a.verified {
			a.log.Info("worker admitted: certificate verified", zap.String("worker", p.id), zap.String("role", p.role),
				zap.String("addr", p.addr), zap.String("model", model))
		} else {
			a.log.Info("worker admitted unverified (plaintext gRPC: anyone with the role's NATS credential can register one)",
				zap.String("worker", p.id), zap.String("role", p.role), zap.String("addr", p.addr), zap.String("model", model))
		}
	}
}

func (a *admitter) check(ctx context.Context, p peer) error {
	cc, err := a.conns.get(p)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	res, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	switch {
	case err != nil:
		return fmt.Errorf("health check: %w", err)
	case res.GetStatus() != healthpb.HealthCheckResponse_SERVING:
		return fmt.Errorf("health check: %v", res.GetStatus())
	}
	return nil
}
