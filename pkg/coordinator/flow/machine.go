package flow

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/router"
	"github.com/pdserve/pdserve/pkg/wire"
)

// MaxRecoveries bounds the decode-worker failovers of one request, the
// prefill retries before its first token, and the failed Reserve calls of
// one placement.
const MaxRecoveries = 3

// Modes and first-token policies (the coordinator's Options.Mode and
// Options.FirstTokenPolicy values).
const (
	ModeDisaggregated = "disaggregated"
	ModeColocated     = "colocated"
	PolicyPrefill     = "prefill"
	PolicyDecode      = "decode"
)

// Config is one request as the flow sees it. Read only once given.
type Config struct {
	ID           string
	Model        string
	PromptTokens int
	MaxTokens    int // per choice
	N            int // choices; < 1 is 1
	// PrefixHashes are the prompt's full blocks' hashes for prefix-aware
	// routing (nil: none).
	PrefixHashes []uint64
	Mode         string // ModeDisaggregated or ModeColocated
	Policy       string // first-token policy: PolicyPrefill or PolicyDecode
	IgnoreEOS    bool
	// EOG is the model's end-of-generation ids: without IgnoreEOS one ends
	// a sequence and the client never sees it. Read only.
	EOG            map[int32]bool
	Logprobs       bool // the client asked for tokens' log-probabilities
	PromptLogprobs bool // ... and the prompt's (local prefill only)
	// Trace is the request's budget trace: the Machine records the
	// workers, modes, stamps and counts in it. The caller's; the Machine
	// writes it only inside Step.
	Trace *budget.Trace
}

// choice is the flow's state of one choice of a request.
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

// phase is what the Machine waits for.
type phase int

const (
	phaseIdle     phase = iota // Start not stepped yet
	phasePlacing               // a Route or Reserve answer
	phaseRunning               // the calls' messages
	phaseDelivery              // a Delivered answer
	phaseDone                  // ended
)

// placing is one placement in progress: routing and Reserve, trying the
// next decode worker when one is full or fails.
type placing struct {
	decodeOnly bool // recovery: the prefill side stays as it is
	restart    bool // recovery that prefills the prompt again
	full       int
	failed     int
	lastErr    error // the last worker's failure, when one failed
	// retry, when set, is the prefill failure this routing looks for
	// another prefill worker after (for the same decode worker).
	retry error
	dec   router.Decision
}

// pending is what follows a Delivered answer.
type pending struct {
	gen    *pdservev1.GenerateResponse // its tokens still to deliver (after the prompt's log-probabilities)
	index  int                         // the choice a Deliver was for
	finish string                      // the finish to set on choice index
}

// Machine is one request's flow. Not safe for concurrent use.
type Machine struct {
	cfg   Config
	tr    *budget.Trace
	phase phase
	err   error // the request's failure once ended

	choices []choice
	// stoppedEarly: a stop string ended a choice before its worker did,
	// so the workers still hold the request when it ends.
	stoppedEarly bool
	gone         error // the client's context's error once it left

	place *placing
	after pending

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
	decodeHit     int  // prompt tokens the current decode worker holds in its prefix cache (its Reserve's answer)
	promptHeld    bool // the current decode worker keeps the prompt its Reserve showed it
	reserved      bool // the current decode worker holds a reservation or sequence
	decodeEnded   bool
	resendPending bool

	exclude         map[string]bool
	waitingRecovery bool
	failure         error // why the last decode worker failed

	// firstFromPrefill: the current Generate call carries
	// first_token_from_prefill (FirstToken is the source of position 0).
	// Until FirstToken comes, its messages wait in early and a clean end
	// in earlyEnd; firstSeen: choice 0's first event came.
	firstFromPrefill bool
	firstSeen        bool
	early            []*pdservev1.GenerateResponse
	earlyEnd         bool
	firstTok         int32                 // FirstToken's token
	firstLP          []engine.TokenLogprob // and its log-probability, when asked

	acts []Action // the current Step's output
}

// NewMachine returns the flow of the request cfg. It returns an error for
// a Config it cannot run.
func NewMachine(cfg Config) (*Machine, error) {
	switch {
	case cfg.Trace == nil:
		return nil, errors.New("flow: Config.Trace is nil")
	case cfg.Mode != ModeDisaggregated && cfg.Mode != ModeColocated:
		return nil, fmt.Errorf("flow: mode %q is neither %q nor %q", cfg.Mode, ModeDisaggregated, ModeColocated)
	case cfg.Policy != PolicyPrefill && cfg.Policy != PolicyDecode:
		return nil, fmt.Errorf("flow: first-token policy %q is neither %q nor %q", cfg.Policy, PolicyPrefill, PolicyDecode)
	case cfg.PromptTokens < 0 || cfg.MaxTokens < 0:
		return nil, fmt.Errorf("flow: negative size (prompt %d, max_tokens %d)", cfg.PromptTokens, cfg.MaxTokens)
	}
	return &Machine{cfg: cfg, tr: cfg.Trace, choices: make([]choice, max(cfg.N, 1)), exclude: map[string]bool{}}, nil
}

// Done reports whether the request ended.
func (m *Machine) Done() bool { return m.phase == phaseDone }

// Err returns the request's failure once it ended (nil: success).
func (m *Machine) Err() error { return m.err }

// Finish returns each choice's finish reason ("" for one that has none).
// The slice is the caller's.
func (m *Machine) Finish() []string {
	out := make([]string, len(m.choices))
	for i, c := range m.choices {
		out[i] = c.finish
	}
	return out
}

// Step applies one event and returns the actions to perform, in order
// (the caller's slice).
func (m *Machine) Step(ev Event) []Action {
	m.acts = nil
	if m.phase == phaseDone {
		return nil
	}
	if err := m.step(ev); err != nil {
		m.end(err)
	} else if m.phase == phaseRunning && (m.done() || (m.stoppedEarly && m.finished())) {
		m.end(nil)
	}
	return m.acts
}

func (m *Machine) emit(a Action) { m.acts = append(m.acts, a) }

func (m *Machine) log(level zapcore.Level, msg string, fields ...zap.Field) {
	m.emit(Log{Level: level, Msg: msg, Fields: append([]zap.Field{zap.String("request_id", m.cfg.ID)}, fields...)})
}

func (m *Machine) step(ev Event) error {
	switch ev := ev.(type) {
	case ClientGone:
		if m.gone == nil {
			m.gone = ev.Err
		}
		return nil
	case Abort:
		return ev.Err
	}
	switch m.phase {
	case phaseIdle:
		if _, ok := ev.(Start); !ok {
			return fmt.Errorf("flow: request %s: %T before Start", m.cfg.ID, ev)
		}
		m.startPlacing(&placing{})
		return nil
	case phasePlacing:
		switch ev := ev.(type) {
		case Routed:
			return m.onRouted(ev)
		case Reserved:
			return m.onReserved(ev)
		}
		return fmt.Errorf("flow: request %s: %T while placing", m.cfg.ID, ev)
	case phaseDelivery:
		if ev, ok := ev.(Delivered); ok {
			return m.onDelivered(ev)
		}
		return fmt.Errorf("flow: request %s: %T while delivering", m.cfg.ID, ev)
	}
	switch ev := ev.(type) {
	case PrefillMsg:
		if ev.Attempt != m.prefillGen {
			return nil
		}
		return m.onPrefill(ev.Resp)
	case PrefillEnded:
		if ev.Attempt != m.prefillGen {
			return nil
		}
		m.prefillEnded = true
		switch {
		case m.gone != nil:
			return m.gone
		case m.waitingRecovery:
			// The decode worker failed first; the prefill worker is done
			// with the prompt, with its KV complete (re-send it) or not
			// (prefill it again).
			m.recover()
			return nil
		case m.finished():
			return nil
		case ev.Err == nil && m.waitingFirst():
			// Nothing else can tell the decode stream's position 0.
			return m.onPrefillFailed(status.Errorf(codes.Internal, "prefill worker %s ended the stream without the first token", m.prefill.ID))
		case ev.Err == nil:
			return nil
		}
		return m.onPrefillFailed(ev.Err)
	case GenerateMsg:
		if ev.Attempt != m.attempt {
			return nil
		}
		if m.waitingFirst() {
			m.early = append(m.early, ev.Resp)
			return nil
		}
		return m.onGenerate(ev.Resp)
	case GenerateEnded:
		if ev.Attempt != m.attempt {
			return nil
		}
		if m.waitingFirst() {
			if ev.Err == nil {
				m.earlyEnd = true
				return nil
			}
			// The decode worker failed: what it sent is dropped with it
			// (none of it reached the client).
			m.early = nil
		}
		return m.onGenerateEnded(ev.Err)
	case ResendDone:
		m.resendPending = false
		if ev.Attempt != m.attempt {
			return nil
		}
		if ev.Err != nil {
			if m.gone != nil {
				return m.gone
			}
			if !m.finished() && wire.IsKVTransferFailed(ev.Err) && recoverableTransfer(ev.Err) {
				// The new decode worker could not take the KV either:
				// move on to another one.
				m.abandonDecode()
				return m.startRecovery(ev.Err)
			}
			return fmt.Errorf("coordinator: decode worker failed (%v) and prefill worker %s could not re-send the KV of %s: %w",
				m.failure, m.prefill.ID, m.cfg.ID, ev.Err)
		}
		m.addKV(ev.Resp.GetKvDone())
		return nil
	}
	return fmt.Errorf("flow: request %s: unexpected %T", m.cfg.ID, ev)
}

// end ends the request with err: every call stopped, the workers freed.
func (m *Machine) end(err error) {
	m.phase, m.err = phaseDone, err
	m.emit(Stop{})
	cancelOn := slices.Clone(m.abandoned)
	if (err != nil || m.stoppedEarly) && m.reserved {
		// Frees a reservation whose Generate never started, or a sequence
		// the cancelled call has not freed yet.
		cancelOn = append(cancelOn, m.decode)
	}
	// Best effort: the worker also frees the request when its call ends or
	// the reservation expires.
	for _, w := range cancelOn {
		m.emit(Cancel{Worker: w})
	}
	for _, w := range m.prefilledOn {
		m.emit(Release{Worker: w})
	}
	if err != nil {
		m.emit(Fail{Err: err})
	} else {
		m.emit(Finish{})
	}
}

// finished reports whether every choice finished.
func (m *Machine) finished() bool {
	for _, c := range m.choices {
		if c.finish == "" {
			return false
		}
	}
	return true
}

// done reports whether the request finished and every stream ended.
func (m *Machine) done() bool {
	return m.finished() && m.decodeEnded && !m.resendPending && (!m.remote || m.prefillEnded)
}

// delivered returns the number of tokens the client got, all choices.
func (m *Machine) delivered() int {
	n := 0
	for _, c := range m.choices {
		n += len(c.out)
	}
	return n
}

func (m *Machine) seqTokens() int { return m.cfg.PromptTokens + m.cfg.MaxTokens }

func (m *Machine) routerRequest() router.Request {
	return router.Request{ID: m.cfg.ID, PromptTokens: m.cfg.PromptTokens, MaxTokens: m.cfg.MaxTokens * len(m.choices),
		Model: m.cfg.Model, SeqTokens: m.seqTokens()}
}

// startPlacing routes the request; the Reserve follows on the router's
// answer.
func (m *Machine) startPlacing(p *placing) {
	m.phase, m.place = phasePlacing, p
	req := m.routerRequest()
	req.DecodeOnly, req.Local = p.decodeOnly, m.cfg.PromptLogprobs
	if !p.decodeOnly {
		req.PrefixHashes = m.cfg.PrefixHashes
	}
	m.emit(Route{Req: req, Exclude: maps.Clone(m.exclude), Prefill: m.cfg.Mode == ModeDisaggregated && !p.decodeOnly,
		Trace: true, Queue: !p.decodeOnly})
}

func (m *Machine) onRouted(ev Routed) error {
	p, err := m.place, ev.Err
	p.dec = ev.Decision
	if p.retry != nil {
		return m.onPrefillRetry(ev)
	}
	switch {
	case errors.Is(err, router.ErrNoDecodeWorkers) && p.lastErr != nil && p.full == 0:
		return m.placeFailed(GRPCError(fmt.Sprintf("reserve on decode workers (%d failed)", p.failed), "decode", p.lastErr))
	case errors.Is(err, router.ErrNoDecodeWorkers) && p.full > 0:
		return m.placeFailed(frontend.NewError(frontend.ErrOverloaded, "overloaded", "",
			"No decode worker has free KV cache for %d tokens now; retry later.", m.cfg.PromptTokens+m.cfg.MaxTokens*len(m.choices)))
	case errors.Is(err, router.ErrNoCapacity):
		return m.placeFailed(fmt.Errorf("%w: %w", frontend.NewError(frontend.ErrOverloaded, "overloaded", "",
			"Every prefill worker's queue is full; retry later."), err))
	case err != nil:
		return m.placeFailed(fmt.Errorf("%w: %w", frontend.NewError(frontend.ErrUnavailable, "no_workers", "",
			"No worker serving model %q can take the request now; retry later.", m.cfg.Model), err))
	}
	if p.decodeOnly {
		m.emit(PrefillDone{})
	}
	fresh := !p.decodeOnly && !p.dec.Local
	m.emit(Reserve{Worker: p.dec.Decode, Fresh: fresh, Queue: !p.decodeOnly,
		Ask: m.cfg.Mode == ModeDisaggregated && !p.decodeOnly && !p.restart && !p.dec.Local})
	return nil
}

func (m *Machine) onReserved(ev Reserved) error {
	p, err := m.place, ev.Err
	w := p.dec.Decode
	// The prompt tokens whose KV the worker holds already: the prefill
	// worker sends the rest (Prefill.SkipTokens).
	m.decodeHit = 0
	if !p.decodeOnly && !p.dec.Local {
		m.decodeHit = ev.Hit
	}
	m.tr.DecodePrefixHitTokens = m.decodeHit
	switch code := status.Code(err); {
	case err == nil:
		m.decode, m.reserved = w, true
		m.promptHeld = ev.PromptHeld && !p.decodeOnly && !p.dec.Local
		m.tr.DecodeWorker = w.ID
		m.place = nil
		if p.decodeOnly || p.restart {
			return m.resume(p)
		}
		return m.begin(p.dec, ev)
	case m.gone != nil:
		// The reservation may have been made: the end cancels it.
		m.decode, m.reserved = w, true
		return m.placeFailed(m.gone)
	case code == codes.ResourceExhausted:
		p.full++
		m.exclude[w.ID] = true
	case p.failed >= MaxRecoveries:
		return m.placeFailed(GRPCError(fmt.Sprintf("reserve on decode worker %s (after %d failed)", w.ID, p.failed), "decode", err))
	default:
		// Whatever the failure (gone, refused, a worker that is not
		// one), nothing reached the client: try another worker, a
		// bounded number of times.
		p.failed++
		p.lastErr = err
		m.log(zapcore.WarnLevel, "reserve failed; trying another decode worker", zap.String("worker", w.ID), zap.Error(err))
		m.emit(Unreachable{Worker: w, Err: err})
		m.exclude[w.ID] = true
	}
	m.startPlacing(p)
	return nil
}

// placeFailed ends a placement with err: the request's error on the first
// placement, wrapped as a failed recovery on a later one.
func (m *Machine) placeFailed(err error) error {
	p := m.place
	if !p.decodeOnly && !p.restart {
		return err
	}
	return fmt.Errorf("coordinator: request %s: %v; no other decode worker could take it: %v: %w", m.cfg.ID, m.failure, err,
		frontend.NewError(frontend.ErrUnavailable, "decode_failed", "", "The decode worker serving the request failed and no other decode worker could take it; retry later."))
}

// begin starts the calls of the first placement.
func (m *Machine) begin(dec router.Decision, ev Reserved) error {
	m.phase = phaseRunning
	m.tr.Routed = ev.At
	if ev.Local {
		// Routed remote on the router's estimate of the decode worker's
		// cache; its Reserve answered the real hit, which leaves a short
		// prompt: it prefills there (Generate with local_prefill, which
		// looks the cache up again and releases the reservation's pin).
		// The router's estimate was of the prefill worker's cache:
		// none of the decode worker's hit counts as predicted.
		dec.Local, dec.Prefill, dec.PrefixHitTokens = true, router.Worker{}, 0
	}
	m.remote = !dec.Local
	// The router's estimate (dec.PrefixHitTokens, from the KV-event index
	// or heartbeat digests) is not the budget's: the worker that prefills
	// reports its real hit (FirstToken from a prefill worker,
	// GenerateResponse from a local one); the metrics compare the two.
	m.tr.PrefixHitTokens, m.tr.RoutedPrefixHitTokens, m.tr.HostHitTokens, m.tr.HostLoad = 0, dec.PrefixHitTokens, 0, 0
	m.tr.DiskHitTokens, m.tr.PeerHitTokens, m.tr.PeerLoad = 0, 0, 0
	switch {
	case m.cfg.Mode == ModeColocated:
		m.tr.Mode, m.tr.FirstTokenPolicy = ModeColocated, PolicyDecode
	case dec.Local:
		m.tr.Mode, m.tr.FirstTokenPolicy = "local", PolicyDecode
	default:
		m.tr.Mode, m.tr.FirstTokenPolicy = ModeDisaggregated, m.cfg.Policy
		m.prefill = dec.Prefill
		m.tr.PrefillWorker = dec.Prefill.ID
		m.startPrefill()
		// FirstToken is the source of the first token: the decode worker
		// need not stream it.
		m.firstFromPrefill = m.cfg.Policy == PolicyPrefill
	}
	m.startDecode()
	return nil
}

func (m *Machine) startPrefill() {
	if !slices.ContainsFunc(m.prefilledOn, func(w router.Worker) bool { return w.Addr == m.prefill.Addr }) {
		m.prefilledOn = append(m.prefilledOn, m.prefill)
	}
	m.prefillEnded, m.gotFirst, m.kvDone = false, false, false
	m.emit(Prefill{Worker: m.prefill, Decode: m.decode, SkipTokens: m.decodeHit, Attempt: m.prefillGen})
}

func (m *Machine) startDecode() {
	g := Generate{Worker: m.decode, Attempt: m.attempt, LocalPrefill: !m.remote,
		PromptLogprobs:   m.cfg.PromptLogprobs && m.delivered() == 0 && m.attempt == 0,
		FirstFromPrefill: m.firstFromPrefill, OmitPrompt: m.promptHeld}
	m.firstSeen, m.early, m.earlyEnd = false, nil, false
	if m.delivered() > 0 {
		g.Generated = make([][]int32, len(m.choices))
		for i, c := range m.choices {
			g.Generated[i] = slices.Clone(c.out)
		}
	}
	m.decodeEnded = false
	for i := range m.choices {
		c := &m.choices[i]
		c.pos, c.held, c.heldLP = len(c.out), nil, nil
	}
	m.emit(g)
}

func (m *Machine) onGenerateEnded(err error) error {
	m.decodeEnded = true
	switch {
	case m.finished():
		// The worker freed the sequence, unless a stop string ended a
		// choice it still runs (the end cancels it then).
		m.reserved = m.reserved && m.stoppedEarly
		return nil
	case m.gone != nil:
		return m.gone
	case err == nil && m.delivered() > 0:
		return fmt.Errorf("coordinator: decode worker %s ended request %s without a finish reason", m.decode.ID, m.cfg.ID)
	case err == nil:
		// Nothing reached the client: another worker may serve it.
		err = status.Errorf(codes.Internal, "decode worker %s ended the stream without a token or a finish reason", m.decode.ID)
	case !Recoverable(err) && m.delivered() > 0, wire.IsGrammarRefused(err):
		// A grammar that allows no token ends the request on any worker.
		return GRPCError(fmt.Sprintf("generate on decode worker %s", m.decode.ID), "decode", err)
	}
	m.emit(Unreachable{Worker: m.decode, Err: err})
	return m.startRecovery(err)
}

// onPrefillFailed handles a Prefill call that failed while the decode
// worker's Generate call is open. A failed KV transfer means the decode
// worker cannot get the KV (it is gone, unreachable, or lost the request):
// it would wait for it as long as its call lasts, so the request moves to
// another decode worker. So does a prefill stream that broke after the
// first token but before the decode worker acknowledged the KV. Any other
// failure before the first token is the prefill worker's: another prefill
// worker is tried for the same decode worker, a bounded number of times.
func (m *Machine) onPrefillFailed(err error) error {
	m.log(zapcore.DebugLevel, "prefill stream failed", zap.String("worker", m.prefill.ID), zap.Error(err))
	switch transfer := wire.IsKVTransferFailed(err); {
	case wire.IsGrammarRefused(err):
		// The request's grammar allows no first token: so on any worker.
		return GRPCError(fmt.Sprintf("prefill on worker %s", m.prefill.ID), "prefill", err)
	case transfer && !recoverableTransfer(err):
		return GRPCError(fmt.Sprintf("kv transfer from prefill worker %s to decode worker %s", m.prefill.ID, m.decode.ID), "KV transfer", err)
	case !transfer && !m.gotFirst && (len(m.early) > 0 || m.earlyEnd):
		// The decode worker has the KV (it streams) but not position 0,
		// which only FirstToken had: nothing reached the client, so the
		// request starts over on other workers.
		m.emit(Unreachable{Worker: m.prefill, Prefill: true, Err: err})
		m.exclude[m.prefill.ID] = true
		m.abandonDecode()
		return m.startRecovery(err)
	case !transfer && !m.gotFirst:
		// The prefill worker failed before the first token: the decode
		// worker still waits for the KV, so another prefill worker may
		// send it. Whatever the failure, nothing reached the client.
		m.emit(Unreachable{Worker: m.prefill, Prefill: true, Err: err})
		if m.prefillRetries < MaxRecoveries {
			m.retryPrefill(err)
			return nil
		}
		m.log(zapcore.WarnLevel, "no other prefill worker can take the request",
			zap.Error(fmt.Errorf("%d prefill retries used up", m.prefillRetries)))
		return GRPCError(fmt.Sprintf("prefill on worker %s", m.prefill.ID), "prefill", err)
	case !transfer && m.kvDone:
		// The decode worker has the KV; its stream tells the rest.
		return nil
	}
	m.abandonDecode()
	return m.startRecovery(err)
}

// retryPrefill routes the prompt to another prefill worker (the failed
// one and earlier ones excluded) for the same decode worker, whose
// Generate call keeps waiting for the KV; onPrefillRetry takes the answer.
func (m *Machine) retryPrefill(cause error) {
	exclude := maps.Clone(m.exclude)
	exclude[m.prefill.ID] = true
	d := m.decode
	m.phase, m.place = phasePlacing, &placing{retry: cause}
	m.emit(Route{Req: m.routerRequest(), Exclude: exclude, Prefill: true, Decode: &d})
}

// onPrefillRetry takes the router's answer for another prefill worker.
func (m *Machine) onPrefillRetry(ev Routed) error {
	p, dec, err := m.place, ev.Decision, ev.Err
	m.place, m.phase = nil, phaseRunning
	if err == nil && (dec.Local || dec.Decode.ID != m.decode.ID) {
		err = errors.New("the router would prefill on the decode worker, whose call waits for remote KV")
	}
	if err != nil {
		m.log(zapcore.WarnLevel, "no other prefill worker can take the request", zap.Error(err))
		return GRPCError(fmt.Sprintf("prefill on worker %s", m.prefill.ID), "prefill", p.retry)
	}
	m.exclude[m.prefill.ID] = true
	m.prefillRetries++
	m.tr.PrefillRetries++
	m.log(zapcore.WarnLevel, "prefill worker failed before the first token; retrying on another",
		zap.String("worker", m.prefill.ID), zap.String("retry_on", dec.Prefill.ID), zap.Error(p.retry))
	m.prefill, m.tr.PrefillWorker = dec.Prefill, dec.Prefill.ID
	m.tr.PrefillQueued, m.tr.PrefillStart, m.tr.PrefillEnd = time.Time{}, time.Time{}, time.Time{}
	m.prefillGen++
	m.startPrefill()
	return nil
}

// abandonDecode ends the current Generate call, whose worker cannot get
// the request's KV; its end event is dropped as that of an old attempt,
// and the worker frees the request when the call ends.
//
// The worker is alive: when the Generate call is cancelled before it
// reached the worker, only a Cancel frees its reservation, so the end
// sends one (rather than leaving it to the reservation's TTL).
func (m *Machine) abandonDecode() {
	m.emit(CancelGenerate{Attempt: m.attempt})
	m.abandoned = append(m.abandoned, m.decode)
	m.attempt++
	m.decodeEnded = true
	m.firstFromPrefill, m.early, m.earlyEnd = false, nil, false
}

// startRecovery begins moving the request off a failed decode worker.
func (m *Machine) startRecovery(cause error) error {
	m.failure = fmt.Errorf("decode worker %s: %w", m.decode.ID, cause)
	m.reserved = false
	m.exclude[m.decode.ID] = true
	m.tr.Recoveries++
	if m.tr.Recoveries > MaxRecoveries && !Recoverable(cause) {
		// The workers refused the request itself: say so, as for one.
		return GRPCError(fmt.Sprintf("generate on decode worker %s (after %d failovers)", m.decode.ID, MaxRecoveries), "decode", cause)
	}
	if m.tr.Recoveries > MaxRecoveries {
		return fmt.Errorf("coordinator: request %s: giving up after %d decode failures: %v: %w", m.cfg.ID, MaxRecoveries, m.failure,
			frontend.NewError(frontend.ErrUnavailable, "decode_failed", "", "The request failed on %d decode workers in turn; retry later.", MaxRecoveries+1))
	}
	m.log(zapcore.WarnLevel, "decode worker failed; recovering the request",
		zap.String("worker", m.decode.ID), zap.Int("tokens_sent", m.delivered()), zap.Error(cause))
	if m.remote && !m.prefillEnded {
		// Wait until the prefill worker is done with the prompt: Resend
		// needs its complete KV, and a prompt whose KV never completes
		// (its transfer to the failed worker fails) is prefilled again.
		m.waitingRecovery = true
		return nil
	}
	m.recover()
	return nil
}

// recover re-reserves on another decode worker (resume goes on once it
// did). The new reservation is made before anything can send KV to the
// worker. The KV comes from the prefill worker's retained copy (Resend)
// when the prompt was prefilled; when it was not (the decode worker
// failed before the KV completed, so the transfer to it failed and
// nothing was retained), the prompt is prefilled again, routed afresh,
// for the new decode worker; with local prefill the new worker prefills
// itself.
func (m *Machine) recover() {
	m.waitingRecovery = false
	restart := m.remote && !m.gotFirst
	m.startPlacing(&placing{decodeOnly: !restart, restart: restart})
}

// resume resumes generation on the recovery's decode worker, with the
// tokens already sent as generated_tokens.
func (m *Machine) resume(p *placing) error {
	m.phase = phaseRunning
	m.attempt++
	// A recovery's Generate streams its first token itself: after the
	// first token went out, it streams only later ones; before, the
	// decode stream stays the source (see the package coordinator doc).
	m.firstFromPrefill = false
	dec := p.dec
	if p.restart {
		// No token reached the client (the first comes with the KV), so
		// the request starts over.
		m.tr.PrefillStart, m.tr.PrefillEnd, m.tr.KVFirstByte, m.tr.KVDone = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		m.tr.PrefixHitTokens, m.tr.RoutedPrefixHitTokens, m.tr.HostHitTokens, m.tr.HostLoad = 0, dec.PrefixHitTokens, 0, 0 // reported anew by the worker that prefills now
		m.tr.DiskHitTokens, m.tr.PeerHitTokens, m.tr.PeerLoad = 0, 0, 0
		if dec.Local {
			m.remote = false
			m.tr.Mode, m.tr.FirstTokenPolicy = "local", PolicyDecode
		} else {
			m.prefill, m.tr.PrefillWorker = dec.Prefill, dec.Prefill.ID
			m.prefillGen++
			m.startPrefill()
		}
	}
	m.startDecode()
	if m.remote && !p.restart {
		m.resendPending = true
		m.emit(Resend{Prefill: m.prefill, Decode: m.decode, Attempt: m.attempt})
	}
	return nil
}

func (m *Machine) onPrefill(resp *pdservev1.PrefillResponse) error {
	switch e := resp.GetEvent().(type) {
	case *pdservev1.PrefillResponse_Queued:
		setOnce(&m.tr.PrefillQueued, e.Queued.GetUnixNano())
	case *pdservev1.PrefillResponse_FirstToken:
		ft := e.FirstToken
		m.gotFirst = true
		m.emit(PrefillDone{})
		setOnce(&m.tr.PrefillStart, ft.GetPrefillStartUnixNano())
		setOnce(&m.tr.PrefillEnd, ft.GetPrefillEndUnixNano())
		m.tr.PrefillBatch = int(ft.GetBatchSize())
		m.tr.PrefixHitTokens = int(ft.GetPrefixHitTokens())
		m.tr.HostHitTokens, m.tr.HostLoad = int(ft.GetHostHitTokens()), time.Duration(ft.GetHostLoadNanos())
		m.tr.DiskHitTokens = int(ft.GetDiskHitTokens())
		m.tr.PeerHitTokens, m.tr.PeerLoad = int(ft.GetPeerHitTokens()), time.Duration(ft.GetPeerLoadNanos())
		tok := ft.GetToken()
		var lps []engine.TokenLogprob
		if m.cfg.Logprobs {
			lps = []engine.TokenLogprob{wire.FromTokenLogprob(ft.GetLogprob())}
		}
		m.firstTok, m.firstLP = tok, lps
		if m.cfg.Policy == PolicyPrefill && len(m.choices[0].out) == 0 && (m.cfg.IgnoreEOS || !m.cfg.EOG[tok]) {
			// An end-of-generation first token is left to the decode
			// stream, which ends the request with it.
			if err := m.deliver(0, 0, []int32{tok}, lps, ""); err != nil {
				return err
			}
		}
		return m.flushEarly()
	case *pdservev1.PrefillResponse_KvDone:
		m.kvDone = true
		m.addKV(e.KvDone)
	}
	return nil
}

func (m *Machine) addKV(kd *pdservev1.KVDone) {
	if kd == nil {
		return
	}
	setOnce(&m.tr.KVFirstByte, kd.GetFirstByteUnixNano())
	setOnce(&m.tr.KVDone, kd.GetDoneUnixNano())
	m.tr.KVBytesRaw += kd.GetBytesRaw()
	m.tr.KVBytesWire += kd.GetBytesWire()
	if kd.GetCodec() != "" {
		m.tr.Codec, m.tr.CodecReason = kd.GetCodec(), kd.GetCodecReason()
	}
}

func (m *Machine) onGenerate(resp *pdservev1.GenerateResponse) error {
	for _, s := range resp.GetStamps() {
		switch s.GetName() {
		case "kv_first_byte":
			setOnce(&m.tr.KVFirstByte, s.GetUnixNano())
		case "kv_done":
			setOnce(&m.tr.KVDone, s.GetUnixNano())
		case "prefill_start":
			setOnce(&m.tr.PrefillStart, s.GetUnixNano())
		case "prefill_end":
			setOnce(&m.tr.PrefillEnd, s.GetUnixNano())
		case "decode_joined":
			setOnce(&m.tr.DecodeJoined, s.GetUnixNano())
		}
	}
	m.tr.BatchSize = max(m.tr.BatchSize, int(resp.GetBatchSize()))
	if h := resp.GetPrefixHitTokens(); h > 0 && !m.remote {
		m.tr.PrefixHitTokens = int(h)
		m.tr.HostHitTokens, m.tr.HostLoad = int(resp.GetHostHitTokens()), time.Duration(resp.GetHostLoadNanos())
		m.tr.DiskHitTokens = int(resp.GetDiskHitTokens())
		m.tr.PeerHitTokens, m.tr.PeerLoad = int(resp.GetPeerHitTokens()), time.Duration(resp.GetPeerLoadNanos())
	}
	if pl := resp.GetPromptLogprobs(); len(pl) > 0 && m.cfg.PromptLogprobs {
		m.phase, m.after = phaseDelivery, pending{gen: resp}
		m.emit(DeliverPrompt{Logprobs: wire.FromTokenLogprobs(pl)})
		return nil
	}
	return m.generateTokens(resp)
}

// generateTokens takes the tokens and finish of a GenerateResponse.
func (m *Machine) generateTokens(resp *pdservev1.GenerateResponse) error {
	i := int(resp.GetIndex())
	if i < 0 || i >= len(m.choices) {
		return fmt.Errorf("coordinator: decode worker %s sent choice %d of request %s, which has %d", m.decode.ID, i, m.cfg.ID, len(m.choices))
	}
	c := &m.choices[i]
	toks := resp.GetTokens()
	var lps []engine.TokenLogprob
	if m.cfg.Logprobs {
		if lps = wire.FromTokenLogprobs(resp.GetLogprobs()); len(lps) != len(toks) {
			return fmt.Errorf("coordinator: decode worker %s sent %d logprobs for %d tokens of request %s", m.decode.ID, len(lps), len(toks), m.cfg.ID)
		}
	}
	if i == 0 && m.firstFromPrefill && !m.firstSeen && (len(toks) > 0 || resp.GetFinishReason() != "") {
		m.firstSeen = true
		if resp.GetFirstTokenOmitted() {
			// The worker honoured first_token_from_prefill: its tokens
			// start at position 1. Position 0 is FirstToken's, put back
			// so that the stream reads as positional from 0 (delivered
			// already, it is skipped; an end-of-generation id ends the
			// choice or is held as the stream's).
			toks = slices.Concat([]int32{m.firstTok}, toks)
			if lps != nil {
				lps = slices.Concat(m.firstLP, lps)
			}
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
	if n := len(toks); n > 0 && !m.cfg.IgnoreEOS && m.cfg.EOG[toks[n-1]] {
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
	return m.deliver(i, pos, toks, lps, finish)
}

// deliver hands the tokens of choice i at output positions pos… (with
// their log-probabilities, when asked) to the client, skipping those it
// already has (the first token under policy "prefill") and those of a
// choice a stop string ended; finish, when set, is the choice's finish
// once they are delivered.
func (m *Machine) deliver(i, pos int, toks []int32, lps []engine.TokenLogprob, finish string) error {
	c := &m.choices[i]
	if c.stopped {
		return m.finishChoice(i, finish)
	}
	if pos > len(c.out) {
		return fmt.Errorf("coordinator: request %s: tokens from position %d arrived with %d delivered", m.cfg.ID, pos, len(c.out))
	}
	skip := min(len(c.out)-pos, len(toks))
	for k := range skip {
		if c.out[pos+k] != toks[k] {
			m.log(zapcore.WarnLevel, "decode worker's token differs from the one already sent",
				zap.Int("choice", i), zap.Int("position", pos+k), zap.Int32("sent", c.out[pos+k]), zap.Int32("decode", toks[k]))
		}
	}
	toks = toks[skip:]
	if lps != nil {
		lps = lps[skip:]
	}
	if len(toks) == 0 {
		return m.finishChoice(i, finish)
	}
	c.out = append(c.out, toks...)
	m.phase, m.after = phaseDelivery, pending{index: i, finish: finish}
	m.emit(Deliver{Index: i, Tokens: toks, Logprobs: lps})
	return nil
}

func (m *Machine) finishChoice(i int, finish string) error {
	if c := &m.choices[i]; finish != "" && c.finish == "" {
		c.finish = finish
	}
	return nil
}

func (m *Machine) onDelivered(ev Delivered) error {
	m.phase = phaseRunning
	after := m.after
	m.after = pending{}
	if after.gen != nil {
		// The prompt's log-probabilities went out; now its tokens.
		if ev.Err != nil {
			return ev.Err
		}
		return m.generateTokens(after.gen)
	}
	switch {
	case errors.Is(ev.Err, frontend.ErrStopped):
		// Only this choice ends (the worker's later tokens of it are
		// dropped); once every choice has, the request ends, its calls
		// are cancelled and the workers free it.
		c := &m.choices[after.index]
		c.stopped, c.finish, m.stoppedEarly = true, "stop", true
	case ev.Err != nil:
		return ev.Err
	}
	if err := m.finishChoice(after.index, after.finish); err != nil {
		return err
	}
	return m.flushEarly()
}

// waitingFirst reports whether the current Generate stream's messages
// wait for FirstToken, the source of their position 0.
func (m *Machine) waitingFirst() bool { return m.firstFromPrefill && !m.gotFirst }

// flushEarly takes the Generate stream's messages and clean end that
// waited for FirstToken, in order, until one is to be delivered (the
// rest follow its Delivered).
func (m *Machine) flushEarly() error {
	for m.phase == phaseRunning && !m.waitingFirst() && len(m.early) > 0 {
		resp := m.early[0]
		m.early = m.early[1:]
		if err := m.onGenerate(resp); err != nil {
			return err
		}
	}
	if m.phase == phaseRunning && !m.waitingFirst() && len(m.early) == 0 && m.earlyEnd {
		m.earlyEnd = false
		return m.onGenerateEnded(nil)
	}
	return nil
}

// Recoverable reports whether a Generate failure means the decode worker
// (or the KV transfer to it) failed, so that another worker may finish the
// request.
func Recoverable(err error) bool {
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
	return Recoverable(err) || status.Code(err) == codes.FailedPrecondition
}

// GRPCError wraps a worker's error (of the operation op, for the log)
// with a client-facing frontend.Error of the kind its code maps to; part
// names the worker's part for the client ("prefill", "decode", "KV
// transfer"). No worker text or address reaches the client.
func GRPCError(op, part string, err error) error {
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
