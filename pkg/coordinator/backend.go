package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator/flow"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
	"github.com/pdserve/pdserve/pkg/metrics"
	"github.com/pdserve/pdserve/pkg/router"
	"github.com/pdserve/pdserve/pkg/tracing"
	"github.com/pdserve/pdserve/pkg/wire"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// rpcTimeout bounds the unary calls of the request flow (Reserve, Cancel,
// Release).
const rpcTimeout = 10 * time.Second

// backend runs requests over the workers: it implements frontend.Backend.
// Safe for concurrent use.
type backend struct {
	mode    string
	policy  string // first-token policy
	codec   string
	log     *zap.Logger
	members *control.Membership
	router  *router.Router
	conns   *conns
	auth    *grpcauth.Auth // signs the KV-push credentials; nil: none
	metrics *metrics.Metrics
	pricing *budget.Pricing // the policy's, set on every trace; nil: no cost
	now     func() time.Time
	// eog holds the model's end-of-generation ids (engine.EOGTokens of the
	// coordinator's tokenizer; see eogSet): without ignore_eos the decode
	// worker ends a sequence on one, and the client never sees it. Read
	// only.
	eog map[int32]bool
	// prefixBlockTokens > 0 hashes each prompt's full blocks of that many
	// tokens (hashKey's chain from the request's partition root, as
	// workers publish their prefix digests) for prefix-aware routing; 0
	// skips it.
	prefixBlockTokens int
	// hashKey keys the block hashes and the partition roots
	// (--kv-hash-key-file), as the workers' must.
	hashKey kv.HashKey
	// kv is every worker's cached blocks from their KV events (nil: none);
	// a worker it has no view of routes on its heartbeat's digest.
	kv *control.KVIndex
	// modelName is --model-name: every worker serves it. Empty: each
	// serves the model its heartbeat names, and requests are routed by
	// model.
	modelName string

	mu      sync.Mutex
	running int           // Complete calls in progress
	changed chan struct{} // closed and replaced when running drops
}

var _ frontend.Backend = (*backend)(nil)

func (b *backend) decodeRole() control.Role {
	if b.mode == ModeColocated {
		return control.RoleColocated
	}
	return control.RoleDecode
}

// isMember reports whether w (by id and address) is a live member of
// role now, draining or not.
func (b *backend) isMember(role control.Role, w router.Worker) bool {
	for _, hb := range b.members.All() {
		if hb.Role == string(role) && hb.ID == w.ID && hb.GRPCAddr == w.Addr {
			return true
		}
	}
	return false
}

func (r *run) decodeRole() control.Role { return r.b.decodeRole() }

// conn returns the connection to w in role.
func (b *backend) conn(role control.Role, w router.Worker) (*grpc.ClientConn, error) {
	return b.conns.get(peer{id: w.ID, role: string(role), addr: w.Addr})
}

// unreachable takes w out of routing until its next heartbeat when err
// says the call could not reach it (flow.CodeUnavailable: refused, reset,
// or the worker is shutting down), so that requests stop going to a dead
// worker at once instead of each failing there until its heartbeat
// expires.
func (b *backend) unreachable(role control.Role, w router.Worker, err *flow.CallError) {
	if err == nil || err.Code != flow.CodeUnavailable {
		return
	}
	b.members.Unreachable(w.ID, w.Addr, time.Now())
	b.log.Warn("worker unreachable; routing around it until its next heartbeat", zap.String("role", string(role)),
		zap.String("worker", w.ID), zap.Error(err))
}

// workers returns the live, non-draining members of role as router input.
func (b *backend) workers(role control.Role) []router.Worker {
	hbs := b.members.Members(role)
	out := make([]router.Worker, len(hbs))
	for i, hb := range hbs {
		out[i] = router.Worker{
			ID: hb.ID, Addr: hb.GRPCAddr,
			KVBlocksFree: hb.KVBlocksFree, KVBlocksTotal: hb.KVBlocksTotal,
			QueuedPrefillTokens: hb.QueuedPrefillTokens, RunningBatch: hb.RunningBatch,
			PrefixDigest: hb.PrefixDigest, Draining: hb.Draining, Time: hb.Time,
			MaxSeqLen: hb.MaxSeqLen, MaxBatch: hb.MaxBatch, PeerPullCost: hb.PeerPullCost,
		}
		if b.kv != nil {
			if v := b.kv.Blocks(hb.ID); v != nil {
				out[i].Prefix = v
			}
			if v := b.kv.HostBlocks(hb.ID); v != nil {
				out[i].HostPrefix = v
			}
			if v := b.kv.DiskBlocks(hb.ID); v != nil {
				out[i].DiskPrefix = v
			}
		}
		if b.modelName == "" {
			// Workers serve the model they report; under --model-name
			// every worker serves that one name.
			out[i].Model = hb.Model
		}
	}
	return out
}

// Complete implements frontend.Backend: routing, the request flow over
// the workers, recovery from a failed decode worker, and cleanup (both
// RPCs cancelled, the decode worker's KV and the prefill worker's
// retained KV released) on every path. Admission is the frontend's
// (Options.MaxInFlight, from Policy.Limits.QueueLimit).
func (b *backend) Complete(ctx context.Context, req *frontend.Request, emit frontend.EmitFunc) ([]string, error) {
	if err := checkSizes(req); err != nil {
		return nil, err
	}
	req.Trace.Pricing = b.pricing
	b.track(1)
	defer b.track(-1)
	b.metrics.AddInFlight(1)
	defer b.metrics.AddInFlight(-1)
	defer b.router.Done(req.ID)

	// The queue span (routing and Reserve under it) and the phases after
	// it, from the budget's boundaries once the request ended.
	qctx, queue := tracing.StartQueue(ctx, req.Trace)
	defer func() { tracing.EndPhases(ctx, queue, req.Trace, b.now()) }()
	r := &run{b: b, ctx: ctx, qctx: qctx, req: req, emit: emit, events: make(chan event)}
	finish, err := r.serve()
	if err != nil {
		return nil, clientError(err, req)
	}
	return finish, nil
}

func (b *backend) track(delta int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.running += delta
	if delta < 0 && b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
}

// waitIdle blocks until no Complete call is in progress (each has freed
// its workers' KV) or ctx ends, returning ctx's error.
func (b *backend) waitIdle(ctx context.Context) error {
	for {
		b.mu.Lock()
		if b.running == 0 {
			b.mu.Unlock()
			return nil
		}
		if b.changed == nil {
			b.changed = make(chan struct{})
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// run is one request in flight: the shell around its flow.Machine. It
// performs the Machine's actions (router and gRPC calls, writes to the
// client) and steps what comes back. Only the goroutine running serve
// touches its fields; the call goroutines report through events.
type run struct {
	b   *backend
	ctx context.Context
	// qctx is ctx under the request's queue span: the first placement
	// (routing, Reserve) is traced in it.
	qctx context.Context
	req  *frontend.Request
	emit frontend.EmitFunc
	m    *flow.Machine
	// hashes are the prompt's blocks for prefix-aware routing (nil
	// without): a pull's credential is bound to them.
	hashes []uint64
	// root is the root of the prompt's block hash chain, its tenant's
	// partition, sent to every worker that hashes the prompt.
	root kv.Hash

	events chan event
	// queue holds the events to step before the next one from events:
	// the answers of synchronous actions (and Aborts), in order.
	queue   []flow.Event
	live    int // goroutines that still owe an end event
	cancels []context.CancelFunc
	// cancelDecode ends the Generate call of decode attempt decodeAttempt.
	cancelDecode  context.CancelFunc
	decodeAttempt int
	gone          bool // the Machine was told the client left

	// unary bounds the Cancel and Release calls at the end; nil until one.
	unary       context.Context
	unaryCancel context.CancelFunc
}

// event is what a call goroutine reports; end: the goroutine's last.
type event struct {
	ev  flow.Event
	end bool
}

// serve runs the request to its end and returns each choice's finish.
//
// It is the Machine's only caller, and never re-enters it: it steps one
// event, performs the actions the Step returned in order, queues the
// answer of a synchronous one (or the Abort of one it could not
// perform, which skips the rest of that Step's actions, as the Machine
// ends the request on it), and steps the queue before it waits for the
// calls' next event.
func (r *run) serve() ([]string, error) {
	cfg := flow.Config{
		ID: r.req.ID, Model: r.req.Model, PromptTokens: len(r.req.Prompt), MaxTokens: r.req.MaxTokens, N: max(r.req.N, 1),
		Mode: r.b.mode, Policy: r.b.policy, IgnoreEOS: r.req.IgnoreEOS, EOG: r.b.eog,
		Logprobs: r.req.Logprobs >= 0, PromptLogprobs: r.req.PromptLogprobs >= 0,
	}
	// The request's partition of every prefix cache: its tenant's root.
	r.root = r.b.hashKey.Root(r.req.Tenant)
	if n := r.b.prefixBlockTokens; n > 0 {
		hs := r.b.hashKey.Blocks(r.root, r.req.Prompt, n)
		cfg.PrefixHashes = make([]uint64, len(hs))
		for i, h := range hs {
			cfg.PrefixHashes[i] = uint64(h)
		}
	}
	m, err := flow.NewMachine(cfg)
	if err != nil {
		return nil, err
	}
	r.m, r.hashes = m, cfg.PrefixHashes
	r.queue = append(r.queue, flow.Start{})
	for {
		for len(r.queue) > 0 {
			ev := r.queue[0]
			r.queue = r.queue[1:]
			if r.step(ev) {
				return r.m.Finish(), r.m.Err()
			}
		}
		ev := <-r.events
		if ev.end {
			r.live--
		}
		r.queue = append(r.queue, ev.ev)
	}
}

// step feeds ev to the Machine and performs what it returns. It reports
// whether the request ended. The Machine hears that the client left
// before the first event after it did.
func (r *run) step(ev flow.Event) bool {
	if !r.gone && r.ctx.Err() != nil {
		r.gone = true
		// ev waits until the Machine heard it.
		r.queue = append([]flow.Event{ev}, r.queue...)
		ev = flow.ClientGone{Err: r.ctx.Err()}
	}
	for _, a := range r.m.Step(ev) {
		switch a.(type) {
		case flow.Finish, flow.Fail:
			r.end()
			return true
		}
		if ans := r.do(a); ans != nil {
			// A synchronous action is a Step's last; an Abort ends the
			// request, so the rest of its actions are moot.
			r.queue = append([]flow.Event{ans}, r.queue...)
			return false
		}
	}
	return false
}

// do performs a; it returns the event that answers it (a synchronous
// action's result, or Abort), or nil.
func (r *run) do(a flow.Action) flow.Event {
	switch a := a.(type) {
	case flow.Route:
		decodes := []router.Worker{}
		if a.Decode != nil {
			decodes = append(decodes, *a.Decode)
		} else {
			decodes = r.b.workers(r.b.decodeRole())
		}
		var prefills []router.Worker
		if a.Prefill {
			prefills = r.b.workers(control.RolePrefill)
		}
		req := a.Req
		if len(req.PrefixHashes) > 0 {
			// Every worker that keeps prompts may be the peer a
			// prefilling worker pulls the prompt's prefix from.
			for _, role := range peerRoles {
				req.Peers = append(req.Peers, r.b.workers(role)...)
			}
		}
		start := r.b.now()
		dec, err := r.b.router.Route(start, req, decodes, prefills, a.Exclude)
		if a.Trace {
			tracing.Route(r.traceCtx(a.Queue), start, r.b.now(), err)
		}
		return flow.Routed{Decision: dec, Err: err}
	case flow.Reserve:
		return r.reserve(a)
	case flow.Revised:
		r.b.router.Revised(r.req.ID)
	case flow.Record:
		a.Budget.Apply(r.req.Trace)
	case flow.Prefill:
		return r.startPrefill(a)
	case flow.Generate:
		return r.startDecode(a)
	case flow.Resend:
		if err := r.startResend(a); err != nil {
			return flow.Abort{Err: err}
		}
	case flow.CancelGenerate:
		if r.cancelDecode != nil && r.decodeAttempt == a.Attempt {
			r.cancelDecode()
		}
	case flow.PrefillDone:
		r.b.router.PrefillDone(r.req.ID)
	case flow.Unreachable:
		role := r.decodeRole()
		if a.Prefill {
			role = control.RolePrefill
		}
		r.b.unreachable(role, a.Worker, a.Err)
	case flow.Deliver:
		return delivered(r.emit(frontend.Output{Index: a.Index, Tokens: a.Tokens, Logprobs: a.Logprobs}))
	case flow.DeliverPrompt:
		return delivered(r.emit(frontend.Output{Prompt: true, Logprobs: a.Logprobs}))
	case flow.Log:
		if ce := r.b.log.Check(a.Level, a.Msg); ce != nil {
			ce.Write(a.Fields...)
		}
	case flow.Stop:
		r.stop()
	case flow.Cancel:
		if cc, err := r.b.conn(r.decodeRole(), a.Worker); err == nil {
			if _, err := pdservev1.NewDecodeServiceClient(cc).Cancel(r.unaryCtx(), &pdservev1.CancelRequest{RequestId: r.req.ID}); err != nil {
				r.b.log.Debug("cancel on decode worker failed", zap.String("request_id", r.req.ID),
					zap.String("worker", a.Worker.ID), zap.Error(err))
			}
		}
	case flow.Release:
		if cc, err := r.b.conn(control.RolePrefill, a.Worker); err == nil {
			if _, err := pdservev1.NewPrefillServiceClient(cc).Release(r.unaryCtx(), &pdservev1.ReleaseRequest{RequestId: r.req.ID}); err != nil {
				r.b.log.Warn("release on prefill worker failed", zap.String("request_id", r.req.ID),
					zap.String("worker", a.Worker.ID), zap.Error(err))
			}
		}
	default:
		return flow.Abort{Err: fmt.Errorf("coordinator: request %s: unknown flow action %T", r.req.ID, a)}
	}
	return nil
}

// traceCtx is the context a placement is traced in: under the queue span
// or not.
func (r *run) traceCtx(queue bool) context.Context {
	if queue {
		return r.qctx
	}
	return r.ctx
}

// reserve reserves KV for the request on a.Worker. Fresh: the KV will
// come from a new Prefill, so the worker is shown the prompt and may
// answer the prefix it holds already (skip_tokens); for a local prefill
// (the worker looks its cache up itself) or a Resend (the whole retained
// KV) it is not.
func (r *run) reserve(a flow.Reserve) flow.Event {
	cc, err := r.b.conn(r.decodeRole(), a.Worker)
	if err != nil {
		return flow.Reserved{Err: &flow.CallError{Code: flow.CodeUnavailable, Err: err}, At: r.b.now()}
	}
	ctx, cancel := context.WithTimeout(r.traceCtx(a.Queue), rpcTimeout)
	defer cancel()
	req := &pdservev1.ReserveRequest{
		RequestId: r.req.ID, Tokens: int32(len(r.req.Prompt) + r.req.MaxTokens),
		Sequences: int32(max(r.req.N, 1)), PromptTokens: int32(len(r.req.Prompt)),
		PrefixRoot: uint64(r.root),
	}
	if a.Fresh {
		req.Prompt = r.req.Prompt // for the worker's prefix cache: it may hold a prefix
	}
	res, err := pdservev1.NewDecodeServiceClient(cc).Reserve(ctx, req)
	return flow.Reserved{Hit: int(res.GetPrefixHitTokens()), Err: callError(err), At: r.b.now(), PromptHeld: res.GetPromptHeld()}
}

func (r *run) sampling() *pdservev1.Sampling { return wire.Sampling(r.req.Sampling) }

// priority is the request's class in the workers' queues: its
// objective's (interactive when none applied).
func (r *run) priority() pdservev1.Priority {
	if r.req.Trace != nil && r.req.Trace.Objective.Priority == config.PriorityBatch {
		return wire.Priority(vocab.PriorityBatch)
	}
	return wire.Priority(vocab.PriorityInteractive)
}

// spawn runs f in a goroutine with a child context; f's result is sent as
// an end event. Every spawned goroutine sends exactly one end event.
// It returns the function that cancels f's context.
func (r *run) spawn(f func(ctx context.Context) flow.Event) context.CancelFunc {
	ctx, cancel := context.WithCancel(r.ctx)
	r.cancels = append(r.cancels, cancel)
	r.live++
	go func() {
		r.events <- event{ev: f(ctx), end: true}
	}()
	return cancel
}

func (r *run) startPrefill(a flow.Prefill) flow.Event {
	cc, err := r.b.conn(control.RolePrefill, a.Worker)
	if err != nil {
		return flow.Abort{Err: err}
	}
	preq := &pdservev1.PrefillRequest{
		RequestId: r.req.ID, PromptTokens: r.req.Prompt, Sampling: r.sampling(),
		DecodeAddr: a.Decode.Addr, Codec: r.b.codec, Logprobs: wire.Logprobs(r.req.Logprobs),
		SkipTokens: int32(a.SkipTokens), PrefixRoot: uint64(r.root), Priority: r.priority(),
		// One KV push to this decode worker by this prefill worker: the
		// prefill worker holds no key, and the credential is worth
		// nothing elsewhere.
		DecodeId: a.Decode.ID, DecodeCredential: r.b.auth.PushCredential(a.Decode.ID, a.Worker.ID),
		// A worker that holds more of the prompt's prefix than this one:
		// it may pull instead of computing it.
		Peer: r.b.pullPrefix(a.Worker.ID, a.Peer, r.hashes),
	}
	gen := a.Attempt
	r.spawn(func(ctx context.Context) flow.Event {
		stream, err := pdservev1.NewPrefillServiceClient(cc).Prefill(ctx, preq)
		for err == nil {
			var resp *pdservev1.PrefillResponse
			if resp, err = stream.Recv(); err == nil {
				if ev := prefillEvent(gen, resp); ev != nil {
					r.events <- event{ev: ev}
				}
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return flow.PrefillEnded{Attempt: gen, Err: callError(err)}
	})
	return nil
}

func (r *run) startDecode(a flow.Generate) flow.Event {
	cc, err := r.b.conn(r.decodeRole(), a.Worker)
	if err != nil {
		return flow.Abort{Err: err}
	}
	greq := &pdservev1.GenerateRequest{
		RequestId: r.req.ID, PromptTokens: r.req.Prompt, Sampling: r.sampling(),
		MaxTokens: int32(r.req.MaxTokens), LocalPrefill: a.LocalPrefill, IgnoreEos: r.req.IgnoreEOS,
		N: int32(max(r.req.N, 1)), Logprobs: wire.Logprobs(r.req.Logprobs),
		PrefixRoot: uint64(r.root), Priority: r.priority(),
		// A decode worker of the previous release streams position 0
		// unless asked not to; this one never streams it with remote KV.
		FirstTokenFromPrefill: !a.LocalPrefill,
	}
	if a.OmitPrompt {
		// The worker holds it from Reserve (prompt_held).
		greq.PromptTokens = nil
	}
	if len(a.Generated) > 0 {
		greq.GeneratedTokens = a.Generated[0]
		for _, g := range a.Generated[1:] {
			greq.GeneratedChoices = append(greq.GeneratedChoices, &pdservev1.Generated{Tokens: g})
		}
	}
	if a.MigrateFrom != nil {
		// A live migration: the worker pulls the KV from the one that
		// moved the request out, in the codec of the deployment's KV
		// transfers (an automatic name is the sender's choice, so none).
		greq.MigrateFrom = r.b.migrateFrom(*a.MigrateFrom, a.Worker.ID, r.req.ID)
		if auto, _ := codecpick.AutoName(r.b.codec); !auto {
			greq.MigrateCodec = r.b.codec
		}
	}
	if a.PromptLogprobs {
		greq.PromptLogprobs = wire.Logprobs(r.req.PromptLogprobs)
	} else if a.LocalPrefill && a.MigrateFrom == nil && r.b.auth.DecodePullsAuthorized() {
		// A worker that holds more of the prompt's prefix than this one:
		// its local prefill may pull instead of computing it (prompt
		// logprobs need every position computed; a decode worker cannot
		// prove the prefill role under tokens without a signing key).
		greq.Peer = r.b.pullPrefix(a.Worker.ID, a.Peer, r.hashes)
	}
	attempt := a.Attempt
	r.decodeAttempt = attempt
	r.cancelDecode = r.spawn(func(ctx context.Context) flow.Event {
		stream, err := pdservev1.NewDecodeServiceClient(cc).Generate(ctx, greq)
		for err == nil {
			var resp *pdservev1.GenerateResponse
			if resp, err = stream.Recv(); err == nil {
				r.events <- event{ev: tokensEvent(attempt, resp)}
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return flow.GenerateEnded{Attempt: attempt, Err: callError(err)}
	})
	return nil
}

// startResend asks a.Prefill to re-send its retained KV to a.Decode. It
// refuses a target that is not a live decode worker (by id and address).
func (r *run) startResend(a flow.Resend) error {
	if !r.b.isMember(r.decodeRole(), a.Decode) {
		// Never point a prefill worker's KV at an address that is not a
		// live decode worker's.
		return fmt.Errorf("coordinator: request %s: decode worker %s at %s is no longer a member; not re-sending its KV there", r.req.ID, a.Decode.ID, a.Decode.Addr)
	}
	cc, err := r.b.conn(control.RolePrefill, a.Prefill)
	if err != nil {
		return err
	}
	rreq := &pdservev1.ResendRequest{RequestId: r.req.ID, DecodeAddr: a.Decode.Addr, Codec: r.b.codec,
		DecodeId: a.Decode.ID, DecodeCredential: r.b.auth.PushCredential(a.Decode.ID, a.Prefill.ID)}
	attempt := a.Attempt
	r.spawn(func(ctx context.Context) flow.Event {
		resp, err := pdservev1.NewPrefillServiceClient(cc).Resend(ctx, rreq)
		ev := flow.ResendDone{Attempt: attempt, Err: callError(err)}
		if kd := resp.GetKvDone(); kd != nil {
			kv := kvReport(kd)
			ev.KV = &kv
		}
		return ev
	})
	return nil
}

// stop cancels what still runs and waits for every goroutine, dropping
// their events.
func (r *run) stop() {
	for _, cancel := range r.cancels {
		cancel()
	}
	for r.live > 0 {
		if ev := <-r.events; ev.end {
			r.live--
		}
	}
}

// unaryCtx is the context of the Cancel and Release calls at the end:
// not the client's (which may have ended), bounded by rpcTimeout.
func (r *run) unaryCtx() context.Context {
	if r.unary == nil {
		r.unary, r.unaryCancel = context.WithTimeout(context.WithoutCancel(r.ctx), rpcTimeout)
	}
	return r.unary
}

// end runs once the request ended: every call stopped, nothing left.
func (r *run) end() {
	r.stop() // a no-op after the Machine's Stop
	if r.unaryCancel != nil {
		r.unaryCancel()
	}
}

// eogSet returns the set of ids, ignoring negative ones (an absent EOS).
func eogSet(ids []int32) map[int32]bool {
	set := make(map[int32]bool, len(ids))
	for _, id := range ids {
		if id >= 0 {
			set[id] = true
		}
	}
	return set
}
