package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/metrics"
	"github.com/pdserve/pdserve/pkg/router"
	"github.com/pdserve/pdserve/pkg/tracing"
	"github.com/pdserve/pdserve/pkg/wire"
)

// rpcTimeout bounds the unary calls of the request flow (Reserve, Cancel,
// Release).
const rpcTimeout = 10 * time.Second

// maxRecoveries bounds the decode-worker failovers of one request.
const maxRecoveries = 3

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
	// tokens (kv.HashBlocks from the plain root, as workers publish their
	// prefix digests) for prefix-aware routing; 0 skips it.
	prefixBlockTokens int
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
// says the call could not reach it (UNAVAILABLE: refused, reset, or the
// worker is shutting down), so that requests stop going to a dead worker
// at once instead of each failing there until its heartbeat expires.
func (b *backend) unreachable(role control.Role, w router.Worker, err error) {
	if status.Code(err) != codes.Unavailable {
		return
	}
	b.members.Unreachable(w.ID, w.Addr)
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
			MaxSeqLen: hb.MaxSeqLen, MaxBatch: hb.MaxBatch,
		}
		if b.kv != nil {
			if v := b.kv.Blocks(hb.ID); v != nil {
				out[i].Prefix = v
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
	r := &run{
		b: b, ctx: ctx, qctx: qctx, req: req, tr: req.Trace, emit: emit,
		events:  make(chan event),
		exclude: make(map[string]bool),
		choices: make([]choice, max(req.N, 1)),
	}
	if err := r.serve(); err != nil {
		return nil, err
	}
	finish := make([]string, len(r.choices))
	for i, c := range r.choices {
		finish[i] = c.finish
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

// eventKind tells what a worker goroutine reports.
type eventKind int

const (
	evPrefill     eventKind = iota // a PrefillResponse
	evPrefillEnd                   // the Prefill stream ended (err nil: cleanly)
	evGenerate                     // a GenerateResponse
	evGenerateEnd                  // the Generate stream ended
	evResend                       // Resend returned
)

type event struct {
	kind    eventKind
	attempt int // decode attempt (Generate, Resend) or prefill attempt (Prefill) the event belongs to
	pre     *pdservev1.PrefillResponse
	gen     *pdservev1.GenerateResponse
	resend  *pdservev1.ResendResponse
	err     error
}

// run is one request in flight. Only the goroutine running serve touches
// its fields; worker goroutines report through events.
type run struct {
	b   *backend
	ctx context.Context
	// qctx is ctx under the request's queue span: the first placement
	// (routing, Reserve) is traced in it.
	qctx context.Context
	req  *frontend.Request
	tr   *budget.Trace
	emit frontend.EmitFunc

	events  chan event
	live    int // goroutines that still owe an end event
	cancels []context.CancelFunc

	// choices holds the state of each of the request's N choices.
	choices []choice
	// stoppedEarly: a stop string ended a choice before its worker did,
	// so the workers still hold the request when it ends.
	stoppedEarly bool

	remote         bool // KV from a prefill worker
	prefillRetries int  // prefill workers tried again after a failure before the first token
	prefill        router.Worker
	prefillGen     int // prefill attempt: > 0 once the prompt was prefilled again after a failure
	prefillEnded   bool
	gotFirst       bool            // the prefill worker reported the first token: its KV is complete
	kvDone         bool            // the prefill worker reported the decode worker's ack of the KV
	prefilledOn    []router.Worker // every prefill worker a Prefill call went to, for Release
	abandoned      []router.Worker // decode workers left alive after a failed KV transfer, for Cancel

	attempt       int
	decode        router.Worker
	decodeHit     int                // prompt tokens the current decode worker holds in its prefix cache (its Reserve's answer)
	cancelDecode  context.CancelFunc // ends the current Generate call
	reserved      bool               // the current decode worker holds a reservation or sequence
	decodeEnded   bool
	resendPending bool

	exclude         map[string]bool
	waitingRecovery bool
	failure         error // why the last decode worker failed
}

// choice is the coordinator's state of one choice of a request.
type choice struct {
	out []int32 // tokens handed to the client so far
	// held is the last token of the current Generate stream when it is an
	// end-of-generation id whose finish has not come yet: it is the
	// sequence's end (finish "stop": dropped) or, for a worker that does
	// not end on it, output like any other (delivered with the next
	// event). At most one token; heldLP is its log-probability.
	held   []int32
	heldLP []engine.TokenLogprob
	// pos is the output position of the next token of the current
	// Generate stream.
	pos    int
	finish string // set once the choice finished
	// stopped: a stop string matched in the client's text; the worker's
	// later tokens are dropped.
	stopped bool
}

// finished reports whether every choice finished.
func (r *run) finished() bool {
	for _, c := range r.choices {
		if c.finish == "" {
			return false
		}
	}
	return true
}

// delivered returns the number of tokens the client got, all choices.
func (r *run) delivered() int {
	n := 0
	for _, c := range r.choices {
		n += len(c.out)
	}
	return n
}

func (r *run) serve() (err error) {
	defer func() { r.cleanup(err) }()
	dec, err := r.place(false)
	if err != nil {
		return err
	}
	r.tr.Routed = r.b.now()
	if r.b.mode == ModeDisaggregated && !dec.Local && r.b.router.Reserved(r.req.ID, len(r.req.Prompt), r.decodeHit) {
		// Routed remote on the router's estimate of the decode worker's
		// cache; its Reserve answered the real hit, which leaves a short
		// prompt: it prefills there (Generate with local_prefill, which
		// looks the cache up again and releases the reservation's pin).
		// The router's estimate was of the prefill worker's cache:
		// none of the decode worker's hit counts as predicted.
		dec.Local, dec.Prefill, dec.PrefixHitTokens = true, router.Worker{}, 0
	}
	r.remote = !dec.Local
	// The router's estimate (dec.PrefixHitTokens, from the KV-event index
	// or heartbeat digests) is not the budget's: the worker that prefills
	// reports its real hit (FirstToken from a prefill worker,
	// GenerateResponse from a local one); the metrics compare the two.
	r.tr.PrefixHitTokens, r.tr.RoutedPrefixHitTokens = 0, dec.PrefixHitTokens
	switch {
	case r.b.mode == ModeColocated:
		r.tr.Mode, r.tr.FirstTokenPolicy = ModeColocated, PolicyDecode
	case dec.Local:
		r.tr.Mode, r.tr.FirstTokenPolicy = "local", PolicyDecode
	default:
		r.tr.Mode, r.tr.FirstTokenPolicy = ModeDisaggregated, r.b.policy
		r.prefill = dec.Prefill
		r.tr.PrefillWorker = dec.Prefill.ID
		if err := r.startPrefill(); err != nil {
			return err
		}
	}
	if err := r.startDecode(); err != nil {
		return err
	}
	for !r.done() && !(r.stoppedEarly && r.finished()) {
		if err := r.handle(<-r.events); err != nil {
			return err
		}
	}
	return nil
}

// done reports whether the request finished and every stream ended.
func (r *run) done() bool {
	return r.finished() && r.decodeEnded && !r.resendPending && (!r.remote || r.prefillEnded)
}

// place routes the request and reserves KV on the chosen decode worker,
// trying the next one when a worker is full or gone. decodeOnly keeps the
// prefill side as it is (recovery).
func (r *run) place(decodeOnly bool) (router.Decision, error) {
	rreq := router.Request{ID: r.req.ID, PromptTokens: len(r.req.Prompt), MaxTokens: r.req.MaxTokens * len(r.choices),
		DecodeOnly: decodeOnly, Local: r.req.PromptLogprobs >= 0, Model: r.req.Model, SeqTokens: r.seqTokens()}
	if n := r.b.prefixBlockTokens; n > 0 && !decodeOnly {
		hs := kv.HashBlocks(0, r.req.Prompt, n)
		rreq.PrefixHashes = make([]uint64, len(hs))
		for i, h := range hs {
			rreq.PrefixHashes[i] = uint64(h)
		}
	}
	full, failed := 0, 0
	var lastErr error // the last worker's failure, when one failed
	// The first placement is part of the queue term; a recovery's is not.
	tctx := r.qctx
	if decodeOnly {
		tctx = r.ctx
	}
	for {
		var prefills []router.Worker
		if r.b.mode == ModeDisaggregated && !decodeOnly {
			prefills = r.b.workers(control.RolePrefill)
		}
		start := r.b.now()
		dec, err := r.b.router.Route(start, rreq, r.b.workers(r.b.decodeRole()), prefills, r.exclude)
		tracing.Route(tctx, start, r.b.now(), err)
		switch {
		case errors.Is(err, router.ErrNoDecodeWorkers) && lastErr != nil && full == 0:
			return dec, grpcError(fmt.Sprintf("reserve on decode workers (%d failed)", failed), "decode", lastErr)
		case errors.Is(err, router.ErrNoDecodeWorkers) && full > 0:
			return dec, frontend.NewError(frontend.ErrOverloaded, "overloaded", "",
				"No decode worker has free KV cache for %d tokens now; retry later.", rreq.PromptTokens+rreq.MaxTokens)
		case errors.Is(err, router.ErrNoCapacity):
			return dec, fmt.Errorf("%w: %w", frontend.NewError(frontend.ErrOverloaded, "overloaded", "",
				"Every prefill worker's queue is full; retry later."), err)
		case err != nil:
			return dec, fmt.Errorf("%w: %w", frontend.NewError(frontend.ErrUnavailable, "no_workers", "",
				"No worker serving model %q can take the request now; retry later.", r.req.Model), err)
		}
		if decodeOnly {
			r.b.router.PrefillDone(r.req.ID)
		}
		err = r.reserve(tctx, dec.Decode, !decodeOnly && !dec.Local)
		switch code := status.Code(err); {
		case err == nil:
			r.decode, r.reserved = dec.Decode, true
			r.tr.DecodeWorker = dec.Decode.ID
			return dec, nil
		case r.ctx.Err() != nil:
			// The reservation may have been made: cleanup cancels it.
			r.decode, r.reserved = dec.Decode, true
			return dec, r.ctx.Err()
		case code == codes.ResourceExhausted:
			full++
			r.exclude[dec.Decode.ID] = true
		case failed >= maxRecoveries:
			return dec, grpcError(fmt.Sprintf("reserve on decode worker %s (after %d failed)", dec.Decode.ID, failed), "decode", err)
		default:
			// Whatever the failure (gone, refused, a worker that is not
			// one), nothing reached the client: try another worker, a
			// bounded number of times.
			failed++
			lastErr = err
			r.b.log.Warn("reserve failed; trying another decode worker", zap.String("request_id", r.req.ID),
				zap.String("worker", dec.Decode.ID), zap.Error(err))
			r.b.unreachable(r.b.decodeRole(), dec.Decode, err)
			r.exclude[dec.Decode.ID] = true
		}
	}
}

// reserve reserves KV for the request on w. fresh: the KV will come
// from a new Prefill, so the worker is shown the prompt and may answer
// the prefix it holds already (skip_tokens); for a local prefill (the
// worker looks its cache up itself) or a Resend (the whole retained KV)
// it is not, and no decode-side hit is recorded.
func (r *run) reserve(ctx context.Context, w router.Worker, fresh bool) error {
	cc, err := r.b.conn(r.decodeRole(), w)
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	req := &pdservev1.ReserveRequest{
		RequestId: r.req.ID, Tokens: int32(len(r.req.Prompt) + r.req.MaxTokens),
		Sequences: int32(len(r.choices)), PromptTokens: int32(len(r.req.Prompt)),
	}
	if fresh {
		req.Prompt = r.req.Prompt // for the worker's prefix cache: it may hold a prefix
	}
	res, err := pdservev1.NewDecodeServiceClient(cc).Reserve(ctx, req)
	// The prompt tokens whose KV the worker holds already: the prefill
	// worker sends the rest (startPrefill's skip_tokens).
	r.decodeHit = 0
	if fresh {
		r.decodeHit = int(res.GetPrefixHitTokens())
	}
	r.tr.DecodePrefixHitTokens = r.decodeHit
	return err
}

func (r *run) sampling() *pdservev1.Sampling { return wire.Sampling(r.req.Sampling) }

// seqTokens is the request's longest sequence, prompt and one choice's
// max_tokens: a worker whose own context is shorter cannot take it.
func (r *run) seqTokens() int { return len(r.req.Prompt) + r.req.MaxTokens }

// spawn runs f in a goroutine with a child context; f's result is sent as
// an event. Every spawned goroutine sends exactly one event of an end kind.
// It returns the function that cancels f's context.
func (r *run) spawn(f func(ctx context.Context) event) context.CancelFunc {
	ctx, cancel := context.WithCancel(r.ctx)
	r.cancels = append(r.cancels, cancel)
	r.live++
	go func() {
		r.events <- f(ctx)
	}()
	return cancel
}

func (r *run) startPrefill() error {
	cc, err := r.b.conn(control.RolePrefill, r.prefill)
	if err != nil {
		return err
	}
	preq := &pdservev1.PrefillRequest{
		RequestId: r.req.ID, PromptTokens: r.req.Prompt, Sampling: r.sampling(),
		DecodeAddr: r.decode.Addr, Codec: r.b.codec, Logprobs: wire.Logprobs(r.req.Logprobs),
		SkipTokens: int32(r.decodeHit),
		// One KV push to this decode worker by this prefill worker: the
		// prefill worker holds no key, and the credential is worth
		// nothing elsewhere.
		DecodeId: r.decode.ID, DecodeCredential: r.b.auth.PushCredential(r.decode.ID, r.prefill.ID),
	}
	if !slices.ContainsFunc(r.prefilledOn, func(w router.Worker) bool { return w.Addr == r.prefill.Addr }) {
		r.prefilledOn = append(r.prefilledOn, r.prefill)
	}
	gen := r.prefillGen
	r.prefillEnded, r.gotFirst, r.kvDone = false, false, false
	r.spawn(func(ctx context.Context) event {
		stream, err := pdservev1.NewPrefillServiceClient(cc).Prefill(ctx, preq)
		for err == nil {
			var resp *pdservev1.PrefillResponse
			if resp, err = stream.Recv(); err == nil {
				r.events <- event{kind: evPrefill, attempt: gen, pre: resp}
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return event{kind: evPrefillEnd, attempt: gen, err: err}
	})
	return nil
}

func (r *run) startDecode() error {
	cc, err := r.b.conn(r.decodeRole(), r.decode)
	if err != nil {
		return err
	}
	greq := &pdservev1.GenerateRequest{
		RequestId: r.req.ID, PromptTokens: r.req.Prompt, Sampling: r.sampling(),
		MaxTokens: int32(r.req.MaxTokens), LocalPrefill: !r.remote, IgnoreEos: r.req.IgnoreEOS,
		GeneratedTokens: slices.Clone(r.choices[0].out),
		N:               int32(len(r.choices)), Logprobs: wire.Logprobs(r.req.Logprobs),
	}
	if r.req.PromptLogprobs >= 0 && r.delivered() == 0 && r.attempt == 0 {
		greq.PromptLogprobs = wire.Logprobs(r.req.PromptLogprobs)
	}
	if len(r.choices) > 1 && r.delivered() > 0 {
		for _, c := range r.choices[1:] {
			greq.GeneratedChoices = append(greq.GeneratedChoices, &pdservev1.Generated{Tokens: slices.Clone(c.out)})
		}
	}
	attempt := r.attempt
	r.decodeEnded = false
	for i := range r.choices {
		c := &r.choices[i]
		c.pos, c.held, c.heldLP = len(c.out), nil, nil
	}
	r.cancelDecode = r.spawn(func(ctx context.Context) event {
		stream, err := pdservev1.NewDecodeServiceClient(cc).Generate(ctx, greq)
		for err == nil {
			var resp *pdservev1.GenerateResponse
			if resp, err = stream.Recv(); err == nil {
				r.events <- event{kind: evGenerate, attempt: attempt, gen: resp}
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return event{kind: evGenerateEnd, attempt: attempt, err: err}
	})
	return nil
}

func (r *run) startResend() error {
	if !r.b.isMember(r.decodeRole(), r.decode) {
		// Never point a prefill worker's KV at an address that is not a
		// live decode worker's.
		return fmt.Errorf("coordinator: request %s: decode worker %s at %s is no longer a member; not re-sending its KV there", r.req.ID, r.decode.ID, r.decode.Addr)
	}
	cc, err := r.b.conn(control.RolePrefill, r.prefill)
	if err != nil {
		return err
	}
	rreq := &pdservev1.ResendRequest{RequestId: r.req.ID, DecodeAddr: r.decode.Addr, Codec: r.b.codec,
		DecodeId: r.decode.ID, DecodeCredential: r.b.auth.PushCredential(r.decode.ID, r.prefill.ID)}
	attempt := r.attempt
	r.resendPending = true
	r.spawn(func(ctx context.Context) event {
		resp, err := pdservev1.NewPrefillServiceClient(cc).Resend(ctx, rreq)
		return event{kind: evResend, attempt: attempt, resend: resp, err: err}
	})
	return nil
}

// handle applies one event; an error ends the request.
func (r *run) handle(ev event) error {
	switch ev.kind {
	case evPrefill:
		if ev.attempt != r.prefillGen {
			return nil
		}
		return r.onPrefill(ev.pre)

	case evPrefillEnd:
		r.live--
		if ev.attempt != r.prefillGen {
			return nil
		}
		r.prefillEnded = true
		switch {
		case r.ctx.Err() != nil:
			return r.ctx.Err()
		case r.waitingRecovery:
			// The decode worker failed first; the prefill worker is done
			// with the prompt, with its KV complete (re-send it) or not
			// (prefill it again).
			return r.recover()
		case ev.err == nil || r.finished():
		default:
			return r.onPrefillFailed(ev.err)
		}

	case evGenerate:
		if ev.attempt != r.attempt {
			return nil
		}
		return r.onGenerate(ev.gen)

	case evGenerateEnd:
		r.live--
		if ev.attempt != r.attempt {
			return nil
		}
		r.decodeEnded = true
		switch {
		case r.finished():
			// The worker freed the sequence, unless a stop string ended a
			// choice it still runs (cleanup cancels it then).
			r.reserved = r.reserved && r.stoppedEarly
			return nil
		case r.ctx.Err() != nil:
			return r.ctx.Err()
		case ev.err == nil && r.delivered() > 0:
			return fmt.Errorf("coordinator: decode worker %s ended request %s without a finish reason", r.decode.ID, r.req.ID)
		case ev.err == nil:
			// Nothing reached the client: another worker may serve it.
			ev.err = status.Errorf(codes.Internal, "decode worker %s ended the stream without a token or a finish reason", r.decode.ID)
		case !recoverable(ev.err) && r.delivered() > 0:
			return grpcError(fmt.Sprintf("generate on decode worker %s", r.decode.ID), "decode", ev.err)
		}
		r.b.unreachable(r.decodeRole(), r.decode, ev.err)
		return r.startRecovery(ev.err)

	case evResend:
		r.live--
		r.resendPending = false
		if ev.attempt != r.attempt {
			return nil
		}
		if ev.err != nil {
			if r.ctx.Err() != nil {
				return r.ctx.Err()
			}
			if !r.finished() && wire.IsKVTransferFailed(ev.err) && recoverableTransfer(ev.err) {
				// The new decode worker could not take the KV either:
				// move on to another one.
				r.abandonDecode()
				return r.startRecovery(ev.err)
			}
			return fmt.Errorf("coordinator: decode worker failed (%v) and prefill worker %s could not re-send the KV of %s: %w",
				r.failure, r.prefill.ID, r.req.ID, ev.err)
		}
		r.addKV(ev.resend.GetKvDone())
	}
	return nil
}

// onPrefillFailed handles a Prefill call that failed while the decode
// worker's Generate call is open. A failed KV transfer means the decode
// worker cannot get the KV (it is gone, unreachable, or lost the request):
// it would wait for it as long as its call lasts, so the request moves to
// another decode worker. So does a prefill stream that broke after the
// first token but before the decode worker acknowledged the KV. Any other
// failure before the first token is the prefill worker's, and ends the
// request.
func (r *run) onPrefillFailed(err error) error {
	r.b.log.Debug("prefill stream failed", zap.String("request_id", r.req.ID), zap.String("worker", r.prefill.ID), zap.Error(err))
	switch transfer := wire.IsKVTransferFailed(err); {
	case transfer && !recoverableTransfer(err):
		return grpcError(fmt.Sprintf("kv transfer from prefill worker %s to decode worker %s", r.prefill.ID, r.decode.ID), "KV transfer", err)
	case !transfer && !r.gotFirst:
		// The prefill worker failed before the first token: the decode
		// worker still waits for the KV, so another prefill worker may
		// send it.
		r.b.unreachable(control.RolePrefill, r.prefill, err)
		if retryablePrefill(err) {
			rerr := r.retryPrefill(err)
			if rerr == nil {
				return nil
			}
			r.b.log.Warn("no other prefill worker can take the request", zap.String("request_id", r.req.ID), zap.Error(rerr))
		}
		return grpcError(fmt.Sprintf("prefill on worker %s", r.prefill.ID), "prefill", err)
	case !transfer && r.kvDone:
		// The decode worker has the KV; its stream tells the rest.
		return nil
	}
	r.abandonDecode()
	return r.startRecovery(err)
}

// retryablePrefill reports whether a Prefill call that failed before its
// first token may succeed on another prefill worker: whatever the
// failure, nothing reached the client (a worker that is gone, broke off,
// was full, or refused: one that is not a prefill worker at all); the
// retries are bounded (maxRecoveries).
func retryablePrefill(error) bool { return true }

// retryPrefill sends the prompt to another prefill worker (the failed one
// and earlier ones excluded) for the same decode worker, whose Generate
// call keeps waiting for the KV. It returns an error, and changes nothing,
// when no other prefill worker can take it or the retries are used up.
func (r *run) retryPrefill(cause error) error {
	if r.prefillRetries >= maxRecoveries {
		return fmt.Errorf("%d prefill retries used up", r.prefillRetries)
	}
	exclude := maps.Clone(r.exclude)
	exclude[r.prefill.ID] = true
	rreq := router.Request{ID: r.req.ID, PromptTokens: len(r.req.Prompt), MaxTokens: r.req.MaxTokens * len(r.choices), Model: r.req.Model, SeqTokens: r.seqTokens()}
	dec, err := r.b.router.Route(r.b.now(), rreq, []router.Worker{r.decode}, r.b.workers(control.RolePrefill), exclude)
	switch {
	case err != nil:
		return err
	case dec.Local || dec.Decode.ID != r.decode.ID:
		return errors.New("the router would prefill on the decode worker, whose call waits for remote KV")
	}
	r.exclude[r.prefill.ID] = true
	r.prefillRetries++
	r.tr.PrefillRetries++
	r.b.log.Warn("prefill worker failed before the first token; retrying on another", zap.String("request_id", r.req.ID),
		zap.String("worker", r.prefill.ID), zap.String("retry_on", dec.Prefill.ID), zap.Error(cause))
	r.prefill, r.tr.PrefillWorker = dec.Prefill, dec.Prefill.ID
	r.tr.PrefillQueued, r.tr.PrefillStart, r.tr.PrefillEnd = time.Time{}, time.Time{}, time.Time{}
	r.prefillGen++
	return r.startPrefill()
}

// abandonDecode ends the current Generate call, whose worker cannot get
// the request's KV; its end event is ignored as that of an old attempt,
// and the worker frees the request when the call ends.
//
// The worker is alive: when the Generate call is cancelled before it
// reached the worker, only a Cancel frees its reservation, so cleanup
// sends one (rather than leaving it to the reservation's TTL).
func (r *run) abandonDecode() {
	if r.cancelDecode != nil {
		r.cancelDecode()
	}
	r.abandoned = append(r.abandoned, r.decode)
	r.attempt++
	r.decodeEnded = true
}

func (r *run) onPrefill(resp *pdservev1.PrefillResponse) error {
	switch e := resp.GetEvent().(type) {
	case *pdservev1.PrefillResponse_Queued:
		setOnce(&r.tr.PrefillQueued, e.Queued.GetUnixNano())
	case *pdservev1.PrefillResponse_FirstToken:
		ft := e.FirstToken
		r.gotFirst = true
		r.b.router.PrefillDone(r.req.ID)
		setOnce(&r.tr.PrefillStart, ft.GetPrefillStartUnixNano())
		setOnce(&r.tr.PrefillEnd, ft.GetPrefillEndUnixNano())
		r.tr.PrefillBatch = int(ft.GetBatchSize())
		r.tr.PrefixHitTokens = int(ft.GetPrefixHitTokens())
		tok := ft.GetToken()
		var lps []engine.TokenLogprob
		if r.req.Logprobs >= 0 {
			lps = []engine.TokenLogprob{wire.FromTokenLogprob(ft.GetLogprob())}
		}
		if r.b.policy == PolicyPrefill && len(r.choices[0].out) == 0 && (r.req.IgnoreEOS || !r.b.eog[tok]) {
			// An end-of-generation first token is left to the decode
			// stream, which ends the request with it.
			return r.deliver(0, 0, []int32{tok}, lps)
		}
	case *pdservev1.PrefillResponse_KvDone:
		r.kvDone = true
		r.addKV(e.KvDone)
	}
	return nil
}

func (r *run) addKV(kd *pdservev1.KVDone) {
	if kd == nil {
		return
	}
	setOnce(&r.tr.KVFirstByte, kd.GetFirstByteUnixNano())
	setOnce(&r.tr.KVDone, kd.GetDoneUnixNano())
	r.tr.KVBytesRaw += kd.GetBytesRaw()
	r.tr.KVBytesWire += kd.GetBytesWire()
	if kd.GetCodec() != "" {
		r.tr.Codec, r.tr.CodecReason = kd.GetCodec(), kd.GetCodecReason()
	}
}

func (r *run) onGenerate(resp *pdservev1.GenerateResponse) error {
	for _, s := range resp.GetStamps() {
		switch s.GetName() {
		case "kv_first_byte":
			setOnce(&r.tr.KVFirstByte, s.GetUnixNano())
		case "kv_done":
			setOnce(&r.tr.KVDone, s.GetUnixNano())
		case "prefill_start":
			setOnce(&r.tr.PrefillStart, s.GetUnixNano())
		case "prefill_end":
			setOnce(&r.tr.PrefillEnd, s.GetUnixNano())
		case "decode_joined":
			setOnce(&r.tr.DecodeJoined, s.GetUnixNano())
		}
	}
	r.tr.BatchSize = max(r.tr.BatchSize, int(resp.GetBatchSize()))
	if h := resp.GetPrefixHitTokens(); h > 0 && !r.remote {
		r.tr.PrefixHitTokens = int(h)
	}
	if pl := resp.GetPromptLogprobs(); len(pl) > 0 && r.req.PromptLogprobs >= 0 {
		if err := r.emit(frontend.Output{Prompt: true, Logprobs: wire.FromTokenLogprobs(pl)}); err != nil {
			return err
		}
	}
	i := int(resp.GetIndex())
	if i < 0 || i >= len(r.choices) {
		return fmt.Errorf("coordinator: decode worker %s sent choice %d of request %s, which has %d", r.decode.ID, i, r.req.ID, len(r.choices))
	}
	c := &r.choices[i]
	toks := resp.GetTokens()
	var lps []engine.TokenLogprob
	if r.req.Logprobs >= 0 {
		if lps = wire.FromTokenLogprobs(resp.GetLogprobs()); len(lps) != len(toks) {
			return fmt.Errorf("coordinator: decode worker %s sent %d logprobs for %d tokens of request %s", r.decode.ID, len(lps), len(toks), r.req.ID)
		}
	}
	pos := c.pos - len(c.held)
	c.pos += len(toks)
	if len(c.held) > 0 {
		toks, c.held = slices.Concat(c.held, toks), nil
		if lps != nil {
			lps = slices.Concat(c.heldLP, lps)
		}
		c.heldLP = nil
	}
	finish := resp.GetFinishReason()
	if n := len(toks); n > 0 && !r.req.IgnoreEOS && r.b.eog[toks[n-1]] {
		// Without ignore_eos an end-of-generation token ends the
		// sequence with "stop", as its last token; the client never sees
		// it. Its finish may come in a later event: until then it is
		// held back.
		switch finish {
		case "":
			c.held, toks = toks[n-1:], toks[:n-1]
			if lps != nil {
				c.heldLP, lps = lps[n-1:], lps[:n-1]
			}
		case "stop":
			toks = toks[:n-1]
			if lps != nil {
				lps = lps[:n-1]
			}
		}
	}
	if err := r.deliver(i, pos, toks, lps); err != nil {
		return err
	}
	if finish != "" && c.finish == "" {
		c.finish = finish
	}
	return nil
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

// deliver hands the tokens of choice i at output positions pos… (with
// their log-probabilities, when asked) to the client, skipping those it
// already has (the first token under policy "prefill") and those of a
// choice a stop string ended.
func (r *run) deliver(i, pos int, toks []int32, lps []engine.TokenLogprob) error {
	c := &r.choices[i]
	if c.stopped {
		return nil
	}
	if pos > len(c.out) {
		return fmt.Errorf("coordinator: request %s: tokens from position %d arrived with %d delivered", r.req.ID, pos, len(c.out))
	}
	skip := min(len(c.out)-pos, len(toks))
	for k := range skip {
		if c.out[pos+k] != toks[k] {
			r.b.log.Warn("decode worker's token differs from the one already sent",
				zap.String("request_id", r.req.ID), zap.Int("choice", i), zap.Int("position", pos+k),
				zap.Int32("sent", c.out[pos+k]), zap.Int32("decode", toks[k]))
		}
	}
	toks = toks[skip:]
	if lps != nil {
		lps = lps[skip:]
	}
	if len(toks) == 0 {
		return nil
	}
	c.out = append(c.out, toks...)
	err := r.emit(frontend.Output{Index: i, Tokens: toks, Logprobs: lps})
	if errors.Is(err, frontend.ErrStopped) {
		// Only this choice ends (the worker's later tokens of it are
		// dropped); once every choice has, serve returns and cleanup
		// ends the calls and frees the request on the workers.
		c.stopped, c.finish, r.stoppedEarly = true, "stop", true
		return nil
	}
	return err
}

// startRecovery begins moving the request off a failed decode worker.
func (r *run) startRecovery(cause error) error {
	r.failure = fmt.Errorf("decode worker %s: %w", r.decode.ID, cause)
	r.reserved = false
	r.exclude[r.decode.ID] = true
	r.tr.Recoveries++
	if r.tr.Recoveries > maxRecoveries && !recoverable(cause) {
		// The workers refused the request itself: say so, as for one.
		return grpcError(fmt.Sprintf("generate on decode worker %s (after %d failovers)", r.decode.ID, maxRecoveries), "decode", cause)
	}
	if r.tr.Recoveries > maxRecoveries {
		return fmt.Errorf("coordinator: request %s: giving up after %d decode failures: %v: %w", r.req.ID, maxRecoveries, r.failure,
			frontend.NewError(frontend.ErrUnavailable, "decode_failed", "", "The request failed on %d decode workers in turn; retry later.", maxRecoveries+1))
	}
	r.b.log.Warn("decode worker failed; recovering the request", zap.String("request_id", r.req.ID),
		zap.String("worker", r.decode.ID), zap.Int("tokens_sent", r.delivered()), zap.Error(cause))
	if r.remote && !r.prefillEnded {
		// Wait until the prefill worker is done with the prompt: Resend
		// needs its complete KV, and a prompt whose KV never completes
		// (its transfer to the failed worker fails) is prefilled again.
		r.waitingRecovery = true
		return nil
	}
	return r.recover()
}

// recover re-reserves on another decode worker and resumes generation
// there, with the tokens already sent as generated_tokens. The new
// reservation is made before anything can send KV to the worker. The KV
// comes from the prefill worker's retained copy (Resend) when the prompt
// was prefilled; when it was not (the decode worker failed before the KV
// completed, so the transfer to it failed and nothing was retained), the
// prompt is prefilled again, routed afresh, for the new decode worker;
// with local prefill the new worker prefills itself.
func (r *run) recover() error {
	r.waitingRecovery = false
	restart := r.remote && !r.gotFirst
	dec, err := r.place(!restart)
	if err != nil {
		return fmt.Errorf("coordinator: request %s: %v; no other decode worker could take it: %v: %w", r.req.ID, r.failure, err,
			frontend.NewError(frontend.ErrUnavailable, "decode_failed", "", "The decode worker serving the request failed and no other decode worker could take it; retry later."))
	}
	r.attempt++
	if restart {
		// No token reached the client (the first comes with the KV), so
		// the request starts over.
		r.tr.PrefillStart, r.tr.PrefillEnd, r.tr.KVFirstByte, r.tr.KVDone = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		r.tr.PrefixHitTokens, r.tr.RoutedPrefixHitTokens = 0, dec.PrefixHitTokens // reported anew by the worker that prefills now
		if dec.Local {
			r.remote = false
			r.tr.Mode, r.tr.FirstTokenPolicy = "local", PolicyDecode
		} else {
			r.prefill, r.tr.PrefillWorker = dec.Prefill, dec.Prefill.ID
			r.prefillGen++
			if err := r.startPrefill(); err != nil {
				return err
			}
		}
	}
	if err := r.startDecode(); err != nil {
		return err
	}
	if r.remote && !restart {
		return r.startResend()
	}
	return nil
}

// cleanup cancels what still runs, waits for every goroutine, and frees
// the request's KV on the workers.
func (r *run) cleanup(err error) {
	for _, cancel := range r.cancels {
		cancel()
	}
	for r.live > 0 {
		switch ev := <-r.events; ev.kind {
		case evPrefillEnd, evGenerateEnd, evResend:
			r.live--
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), rpcTimeout)
	defer cancel()
	cancelOn := r.abandoned
	if (err != nil || r.stoppedEarly) && r.reserved {
		// Frees a reservation whose Generate never started, or a sequence
		// the cancelled call has not freed yet.
		cancelOn = append(cancelOn, r.decode)
	}
	// Best effort: the worker also frees the request when its call ends or
	// the reservation expires.
	for _, w := range cancelOn {
		if cc, cerr := r.b.conn(r.decodeRole(), w); cerr == nil {
			if _, cerr := pdservev1.NewDecodeServiceClient(cc).Cancel(ctx, &pdservev1.CancelRequest{RequestId: r.req.ID}); cerr != nil {
				r.b.log.Debug("cancel on decode worker failed", zap.String("request_id", r.req.ID),
					zap.String("worker", w.ID), zap.Error(cerr))
			}
		}
	}
	for _, w := range r.prefilledOn {
		if cc, cerr := r.b.conn(control.RolePrefill, w); cerr == nil {
			if _, cerr := pdservev1.NewPrefillServiceClient(cc).Release(ctx, &pdservev1.ReleaseRequest{RequestId: r.req.ID}); cerr != nil {
				r.b.log.Warn("release on prefill worker failed", zap.String("request_id", r.req.ID),
					zap.String("worker", w.ID), zap.Error(cerr))
			}
		}
	}
}

// recoverable reports whether a Generate failure means the decode worker
// (or the KV transfer to it) failed, so that another worker may finish the
// request.
func recoverable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.Aborted, codes.Internal, codes.Unknown, codes.DeadlineExceeded:
		return true
	}
	return false
}

// recoverableTransfer reports whether a failed KV transfer (a status
// wire.IsKVTransferFailed reports) may succeed to another decode worker:
// the worker was gone or unreachable, lost the request (no reservation),
// or broke off. A transfer the worker refused as malformed or too big
// would fail anywhere.
func recoverableTransfer(err error) bool {
	return recoverable(err) || status.Code(err) == codes.FailedPrecondition
}

// grpcError wraps a worker's error (of the operation op, for the log)
// with a client-facing frontend.Error of the kind its code maps to; part
// names the worker's part for the client ("prefill", "decode", "KV
// transfer"). No worker text or address reaches the client.
func grpcError(op, part string, err error) error {
	var fe error
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange:
		fe = frontend.NewError(frontend.ErrInvalid, "invalid_request", "", "The %s worker cannot serve the request as asked.", part)
	case codes.ResourceExhausted:
		fe = frontend.NewError(frontend.ErrOverloaded, "overloaded", "", "The %s workers have no room for the request now (queue full); retry later.", part)
	case codes.Unavailable:
		fe = frontend.NewError(frontend.ErrUnavailable, "unavailable", "", "The %s worker is unavailable; retry later.", part)
	default:
		return fmt.Errorf("coordinator: %s: %w", op, err)
	}
	return fmt.Errorf("coordinator: %s: %v: %w", op, err, fe)
}

// setOnce sets *t from Unix nanoseconds unless it is set or ns is 0.
func setOnce(t *time.Time, ns int64) {
	if t.IsZero() && ns != 0 {
		*t = time.Unix(0, ns)
	}
}
