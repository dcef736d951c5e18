package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/pdserve/pdserve/pkg/control"
)

// minWorkerSeqLen is the shortest context a worker may advertise: one KV
// block of prefix hashing. A shorter one contradicts any role's
// configuration (heartbeat max_seq_len 1 is a forgery, not a model).
const minWorkerSeqLen = prefixBlockTokens

// Admission timing: how often pending members are looked at, how long a
// probe may take, and how long a failed one waits before the next.
const (
	admitEvery   = 50 * time.Millisecond
	probeTimeout = 5 * time.Second
	probeBackoff = time.Second
)

// checkHeartbeat refuses a heartbeat whose limits contradict the
// coordinator's configuration of its role: negative counts, more free KV
// blocks than the pool has, a decode worker without KV blocks, a context
// shorter than one KV block, or a role this mode does not use. It is the
// Membership's check (control.WithCheck): a refused worker is removed
// and logged once per reason.
func (o Options) checkHeartbeat(hb control.Heartbeat) error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	want := []control.Role{control.RolePrefill, control.RoleDecode}
	if o.Mode == ModeColocated {
		want = []control.Role{control.RoleColocated}
	}
	known := false
	for _, r := range want {
		known = known || hb.Role == string(r)
	}
	if !known {
		bad("role %q is not one of this %s coordinator's (%v)", hb.Role, o.Mode, want)
	}
	for name, v := range map[string]int{"kv_blocks_free": hb.KVBlocksFree, "kv_blocks_total": hb.KVBlocksTotal,
		"queued_prefill_tokens": hb.QueuedPrefillTokens, "running_batch": hb.RunningBatch, "max_seq_len": hb.MaxSeqLen} {
		if v < 0 {
			bad("%s %d is negative", name, v)
		}
	}
	if hb.KVBlocksFree > hb.KVBlocksTotal {
		bad("kv_blocks_free %d exceeds kv_blocks_total %d", hb.KVBlocksFree, hb.KVBlocksTotal)
	}
	if hb.Role != string(control.RolePrefill) && known && hb.KVBlocksTotal <= 0 {
		bad("a %s worker without KV blocks (kv_blocks_total %d)", hb.Role, hb.KVBlocksTotal)
	}
	if hb.MaxSeqLen > 0 && hb.MaxSeqLen < minWorkerSeqLen {
		bad("max_seq_len %d is shorter than one KV block (%d tokens)", hb.MaxSeqLen, minWorkerSeqLen)
	}
	if hb.Model == "" && o.ModelName == "" {
		bad("no model name (and no --model-name)")
	}
	return errors.Join(errs...)
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
}

func newAdmitter(m *control.Membership, cs *conns, verified bool, log *zap.Logger) *admitter {
	return &admitter{members: m, conns: cs, log: log, verified: verified,
		inFlight: map[string]bool{}, retryAt: map[string]time.Time{}, failure: map[string]string{}}
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
		}
	}
}

// probe calls p's health service and admits p when it answers SERVING.
func (a *admitter) probe(ctx context.Context, p peer, model string) {
	err := a.check(ctx, p)
	a.mu.Lock()
	delete(a.inFlight, p.key())
	if err != nil {
		a.retryAt[p.key()] = time.Now().Add(probeBackoff)
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
	a.mu.Unlock()
	if a.members.Admit(p.id, p.role, p.addr) {
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
