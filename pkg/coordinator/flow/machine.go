package flow

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/router"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// MaxRecoveries bounds the decode-worker failovers of one request, the
// prefill retries before its first token, and the failed Reserve calls of
// one placement.
const MaxRecoveries = 3

// Modes and first-token policies (the coordinator's Options.Mode and
// Options.FirstTokenPolicy values).
const (
	ModeDisaggregated = vocab.ModeDisaggregated
	ModeColocated     = vocab.ModeColocated
	PolicyPrefill     = vocab.PolicyPrefill
	PolicyDecode      = vocab.PolicyDecode
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
	lastErr    *CallError // the last worker's failure, when one failed
	// retry, when set, is the prefill failure this routing looks for
	// another prefill worker after (for the same decode worker).
	retry *CallError
	dec   router.Decision
}

// pending is what follows a Delivered answer.
type pending struct {
	gen    *Tokens // its tokens still to deliver (after the prompt's log-probabilities)
	index  int     // the choice a Deliver was for
	finish string  // the finish to set on choice index
}

// Machine is one request's flow. Not safe for concurrent use.
type Machine struct {
	cfg Config
	// tr is the flow's part of the budget; sent is the last one a Record
	// carried.
	tr, sent Budget
	phase    phase
	err      error // the request's failure once ended

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
	prefillPeer    router.Pull // the pull the prefill worker may make
	prefillGen     int         // prefill attempt: > 0 once the prompt was prefilled again after a failure
	prefillEnded   bool
	gotFirst       bool            // the prefill worker reported the first token: its KV is complete
	kvDone         bool            // the prefill worker reported the decode worker's ack of the KV
	prefilledOn    []router.Worker // every prefill worker a Prefill call went to, for Release
	abandoned      []router.Worker // decode workers left alive after a failed KV transfer, for Cancel

	attempt       int
	decode        router.Worker
	decodePeer    router.Pull // the pull the decode worker's local prefill may make
	decodeHit     int         // prompt tokens the current decode worker holds in its prefix cache (its Reserve's answer)
	promptHeld    bool        // the current decode worker keeps the prompt its Reserve showed it
	reserved      bool        // the current decode worker holds a reservation or sequence
	decodeEnded   bool
	resendPending bool

	exclude         map[string]bool
	waitingRecovery bool
	// migrating: the current Generate stream said its worker moved the
	// sequence out (Tokens.Migrated); migrateFrom is that worker until a
	// later decode worker streamed a token (so pulled the KV, or computed
	// it): a decode worker that fails before pulls from it too.
	migrating   bool
	migrateFrom *router.Worker
	failure     error // why the last decode worker failed

	// With remote KV choice 0's position 0 is FirstToken's, and the
	// decode stream starts at position 1 (see the package coordinator
	// doc). first is FirstToken as choice 0's position 0 while it waits
	// to go out: under policy "decode", until the decode stream's first
	// tokens. early are the decode stream's messages (Tokens, a clean
	// GenerateEnded) that came before FirstToken, or that wait for
	// position 0 to be delivered; they follow it, in order.
	first *Tokens
	early []Event

	acts []Action // the current Step's output
}

// NewMachine returns the flow of the request cfg. It returns an error for
// a Config it cannot run.
func NewMachine(cfg Config) (*Machine, error) {
	switch {
	case cfg.Mode != ModeDisaggregated && cfg.Mode != ModeColocated:
		return nil, fmt.Errorf("flow: mode %q is neither %q nor %q", cfg.Mode, ModeDisaggregated, ModeColocated)
	case cfg.Policy != PolicyPrefill && cfg.Policy != PolicyDecode:
		return nil, fmt.Errorf("flow: first-token policy %q is neither %q nor %q", cfg.Policy, PolicyPrefill, PolicyDecode)
	case cfg.PromptTokens < 0 || cfg.MaxTokens < 0:
		return nil, fmt.Errorf("flow: negative size (prompt %d, max_tokens %d)", cfg.PromptTokens, cfg.MaxTokens)
	}
	return &Machine{cfg: cfg, choices: make([]choice, max(cfg.N, 1)), exclude: map[string]bool{}}, nil
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
	m.record()
	return m.acts
}

// emit appends a to the Step's actions, after a Record of the budget when
// it changed (so that the caller's trace is current when it performs a).
func (m *Machine) emit(a Action) {
	if _, ok := a.(Log); !ok {
		m.record()
	}
	m.acts = append(m.acts, a)
}

// record emits a Record when the budget changed since the last.
func (m *Machine) record() {
	if m.tr != m.sent {
		m.sent = m.tr
		m.acts = append(m.acts, Record{Budget: m.tr})
	}
}

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
	case PrefillQueued:
		if ev.Attempt == m.prefillGen {
			setOnce(&m.tr.PrefillQueued, ev.At)
		}
		return nil
	case FirstToken:
		if ev.Attempt != m.prefillGen {
			return nil
		}
		return m.onFirstToken(ev)
	case KVDone:
		if ev.Attempt != m.prefillGen {
			return nil
		}
		m.kvDone = true
		m.addKV(&ev.KV)
		return nil
	case PrefillEnded:
		if ev.Attempt != m.prefillGen {
			return nil
		}
		m.prefillEnded = true
		switch {
		case m.gone != nil:
			return m.gone
		case m.waitingRecovery && ev.Err != nil && ev.Err.Grammar:
			// The decode worker's call ended first, but its KV transfer
			// was aborted because the prefill worker refused the
			// request: a grammar that allows no token would be refused
			// on any worker, so the prefill failure is the request's,
			// whichever end the shell saw first.
			return m.onPrefillFailed(ev.Err)
		case m.waitingRecovery:
			// The decode worker failed first; the prefill worker is done
			// with the prompt, with its KV complete (re-send it) or not
			// (prefill it again).
			m.recover()
			return nil
		case m.finished():
			return nil
		case ev.Err == nil && m.waitingFirst() && !m.gotFirst:
			// Nothing else carries choice 0's position 0.
			return m.onPrefillFailed(&CallError{Code: CodeBroken,
				Err: fmt.Errorf("prefill worker %s ended the stream without the first token", m.prefill.ID)})
		case ev.Err == nil:
			return nil
		}
		return m.onPrefillFailed(ev.Err)
	case Tokens:
		if ev.Attempt != m.attempt {
			return nil
		}
		if m.waitingFirst() || m.first != nil {
			// Position 0 goes out first (under policy "decode", now).
			m.early = append(m.early, ev)
			return m.releaseFirst()
		}
		return m.onGenerate(ev)
	case GenerateEnded:
		if ev.Attempt != m.attempt {
			return nil
		}
		if m.waitingFirst() {
			if ev.Err == nil {
				m.early = append(m.early, ev)
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
			if !m.finished() && ev.Err.Transfer && ev.Err.recoverableTransfer() {
				// The new decode worker could not take the KV either:
				// move on to another one.
				m.abandonDecode()
				return m.startRecovery(ev.Err)
			}
			return fmt.Errorf("coordinator: decode worker failed (%v) and prefill worker %s could not re-send the KV of %s: %w",
				m.failure, m.prefill.ID, m.cfg.ID, ev.Err)
		}
		m.addKV(ev.KV)
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
	if !p.decodeOnly || !m.remote {
		// The prompt's blocks, where the decision's worker prefills: a
		// decode-only recovery of a remote prefill takes the whole KV
		// from the prefill worker.
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
		return m.placeFailed(callFailure(fmt.Sprintf("reserve on decode workers (%d failed)", p.failed), "decode", p.lastErr))
	case errors.Is(err, router.ErrNoDecodeWorkers) && p.full > 0:
		return m.placeFailed(&Failure{Kind: KindNoKVRoom, Part: "decode", Cause: fmt.Errorf("coordinator: request %s: every decode worker was full for %d tokens (%d refused): %w",
			m.cfg.ID, m.cfg.PromptTokens+m.cfg.MaxTokens*len(m.choices), p.full, err)})
	case errors.Is(err, router.ErrNoCapacity):
		return m.placeFailed(&Failure{Kind: KindQueuesFull, Part: "prefill", Cause: err})
	case err != nil:
		return m.placeFailed(&Failure{Kind: KindNoWorkers, Cause: err})
	}
	if p.decodeOnly {
		m.emit(PrefillDone{})
	}
	fresh := !p.decodeOnly && !p.dec.Local
	m.emit(Reserve{Worker: p.dec.Decode, Fresh: fresh, Queue: !p.decodeOnly})
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
	switch {
	case err == nil:
		m.decode, m.reserved = w, true
		m.promptHeld = ev.PromptHeld && !p.decodeOnly && !p.dec.Local
		m.tr.DecodeWorker = w.ID
		m.place = nil
		if p.decodeOnly || p.restart {
			return m.resume(p)
		}
		dec := p.dec
		if m.cfg.Mode == ModeDisaggregated {
			// The router decided on its estimate of the decode worker's
			// cache; Reserve answered the real hit.
			var revised bool
			if dec, revised = router.Revise(dec, m.cfg.PromptTokens, ev.Hit); revised {
				m.emit(Revised{})
			}
		}
		return m.begin(dec, ev.At)
	case m.gone != nil:
		// The reservation may have been made: the end cancels it.
		m.decode, m.reserved = w, true
		return m.placeFailed(m.gone)
	case err.Code == CodeFull:
		p.full++
		m.exclude[w.ID] = true
	case p.failed >= MaxRecoveries:
		return m.placeFailed(callFailure(fmt.Sprintf("reserve on decode worker %s (after %d failed)", w.ID, p.failed), "decode", err))
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
	return &Failure{Kind: KindNotRecovered, Part: "decode",
		Cause: fmt.Errorf("coordinator: request %s: %v; no other decode worker could take it: %v", m.cfg.ID, m.failure, err)}
}

// begin starts the calls of the first placement, as decided (and
// revised on Reserve's real hit: a local prefill then looks the cache up
// again and releases the reservation's pin), routed at.
func (m *Machine) begin(dec router.Decision, at time.Time) error {
	m.phase = phaseRunning
	m.tr.Routed = at
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
		m.decodePeer = dec.Peer
	case dec.Local:
		m.tr.Mode, m.tr.FirstTokenPolicy = vocab.ModeLocal, PolicyDecode
		m.decodePeer = dec.Peer
	default:
		m.tr.Mode, m.tr.FirstTokenPolicy = ModeDisaggregated, m.cfg.Policy
		m.prefill, m.prefillPeer = dec.Prefill, dec.Peer
		m.tr.PrefillWorker = dec.Prefill.ID
		m.startPrefill()
	}
	m.startDecode()
	return nil
}

func (m *Machine) startPrefill() {
	if !slices.ContainsFunc(m.prefilledOn, func(w router.Worker) bool { return w.Addr == m.prefill.Addr }) {
		m.prefilledOn = append(m.prefilledOn, m.prefill)
	}
	m.prefillEnded, m.gotFirst, m.kvDone, m.first = false, false, false, nil
	m.emit(Prefill{Worker: m.prefill, Decode: m.decode, SkipTokens: m.decodeHit, Attempt: m.prefillGen, Peer: m.prefillPeer})
}

func (m *Machine) startDecode() {
	g := Generate{Worker: m.decode, Attempt: m.attempt, LocalPrefill: !m.remote,
		PromptLogprobs: m.cfg.PromptLogprobs && m.delivered() == 0 && m.attempt == 0,
		OmitPrompt:     m.promptHeld}
	if !m.remote {
		g.Peer = m.decodePeer
	}
	if m.migrateFrom != nil && m.delivered() > 0 {
		// The KV comes from the worker that moved the request out.
		g.LocalPrefill, g.Peer = true, router.Pull{}
		src := *m.migrateFrom
		g.MigrateFrom = &src
	}
	m.early = nil
	if m.delivered() > 0 {
		g.Generated = make([][]int32, len(m.choices))
		for i, c := range m.choices {
			g.Generated[i] = slices.Clone(c.out)
		}
	}
	m.decodeEnded = false
	for i := range m.choices {
		c := &m.choices[i]
		if i == 0 && !g.LocalPrefill && len(c.out) == 0 && c.pos > 0 {
			// Position 0 is FirstToken's, held (an end-of-generation
			// id): the stream starts at position 1, after it.
			continue
		}
		c.pos, c.held, c.heldLP = len(c.out), nil, nil
	}
	m.emit(g)
}

func (m *Machine) onGenerateEnded(err *CallError) error {
	m.decodeEnded = true
	switch {
	case m.finished():
		// The worker freed the sequence, unless a stop string ended a
		// choice it still runs (the end cancels it then).
		m.reserved = m.reserved && m.stoppedEarly
		return nil
	case m.gone != nil:
		return m.gone
	case err == nil && m.migrating:
		return m.startMigration()
	case err == nil && m.delivered() > 0:
		return fmt.Errorf("coordinator: decode worker %s ended request %s without a finish reason", m.decode.ID, m.cfg.ID)
	case err == nil:
		// Nothing reached the client: another worker may serve it.
		err = &CallError{Code: CodeBroken, Err: fmt.Errorf("decode worker %s ended the stream without a token or a finish reason", m.decode.ID)}
	case !err.recoverable() && m.delivered() > 0, err.Grammar:
		// A grammar that allows no token ends the request on any worker.
		return callFailure(fmt.Sprintf("generate on decode worker %s", m.decode.ID), "decode", err)
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
func (m *Machine) onPrefillFailed(err *CallError) error {
	m.log(zapcore.DebugLevel, "prefill stream failed", zap.String("worker", m.prefill.ID), zap.Error(err))
	switch transfer := err.Transfer; {
	case err.Grammar:
		// The request's grammar allows no first token: so on any worker.
		return callFailure(fmt.Sprintf("prefill on worker %s", m.prefill.ID), "prefill", err)
	case transfer && !err.recoverableTransfer():
		return callFailure(fmt.Sprintf("kv transfer from prefill worker %s to decode worker %s", m.prefill.ID, m.decode.ID), "KV transfer", err)
	case !transfer && !m.gotFirst && len(m.early) > 0:
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
		return callFailure(fmt.Sprintf("prefill on worker %s", m.prefill.ID), "prefill", err)
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
func (m *Machine) retryPrefill(cause *CallError) {
	exclude := maps.Clone(m.exclude)
	exclude[m.prefill.ID] = true
	d := m.decode
	m.phase, m.place = phasePlacing, &placing{retry: cause}
	req := m.routerRequest()
	req.PrefixHashes = m.cfg.PrefixHashes
	m.emit(Route{Req: req, Exclude: exclude, Prefill: true, Decode: &d})
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
		return callFailure(fmt.Sprintf("prefill on worker %s", m.prefill.ID), "prefill", p.retry)
	}
	m.exclude[m.prefill.ID] = true
	m.prefillRetries++
	m.tr.PrefillRetries++
	m.log(zapcore.WarnLevel, "prefill worker failed before the first token; retrying on another",
		zap.String("worker", m.prefill.ID), zap.String("retry_on", dec.Prefill.ID), zap.Error(p.retry))
	m.prefill, m.prefillPeer, m.tr.PrefillWorker = dec.Prefill, dec.Peer, dec.Prefill.ID
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
	m.early = nil
}

// startRecovery begins moving the request off a failed decode worker.
func (m *Machine) startRecovery(cause *CallError) error {
	m.failure = fmt.Errorf("decode worker %s: %w", m.decode.ID, cause)
	m.reserved = false
	m.exclude[m.decode.ID] = true
	m.tr.Recoveries++
	if m.tr.Recoveries > MaxRecoveries && !cause.recoverable() {
		// The workers refused the request itself: say so, as for one.
		return callFailure(fmt.Sprintf("generate on decode worker %s (after %d failovers)", m.decode.ID, MaxRecoveries), "decode", cause)
	}
	if m.tr.Recoveries > MaxRecoveries {
		return &Failure{Kind: KindDecodeFailed, Part: "decode",
			Cause: fmt.Errorf("coordinator: request %s: giving up after %d decode failures: %v", m.cfg.ID, MaxRecoveries, m.failure)}
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

// startMigration goes on with the request on another decode worker after
// its worker moved it out (a live migration): not a failure, so no
// recovery is counted. The new worker is routed and reserved as for a
// recovery, then pulls the KV from the old one (resume). The old one
// holds that KV until it was pulled: the end cancels the request there
// too, so that a pull that never came frees it.
func (m *Machine) startMigration() error {
	src := m.decode
	m.migrating, m.migrateFrom = false, &src
	m.reserved = false
	m.exclude[src.ID] = true
	m.failure = fmt.Errorf("decode worker %s moved the request out", src.ID)
	if !slices.ContainsFunc(m.abandoned, func(w router.Worker) bool { return w.ID == src.ID }) {
		m.abandoned = append(m.abandoned, src)
	}
	m.log(zapcore.InfoLevel, "decode worker moved the request out; resuming it on another",
		zap.String("worker", src.ID), zap.Int("tokens_sent", m.delivered()))
	m.startPlacing(&placing{decodeOnly: true})
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
	dec := p.dec
	if p.restart {
		// No token reached the client (the first comes with the KV), so
		// the request starts over.
		m.tr.PrefillStart, m.tr.PrefillEnd, m.tr.KVFirstByte, m.tr.KVDone = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		m.tr.PrefixHitTokens, m.tr.RoutedPrefixHitTokens, m.tr.HostHitTokens, m.tr.HostLoad = 0, dec.PrefixHitTokens, 0, 0 // reported anew by the worker that prefills now
		m.tr.DiskHitTokens, m.tr.PeerHitTokens, m.tr.PeerLoad = 0, 0, 0
		if dec.Local {
			m.remote = false
			m.tr.Mode, m.tr.FirstTokenPolicy = vocab.ModeLocal, PolicyDecode
		} else {
			m.prefill, m.prefillPeer, m.tr.PrefillWorker = dec.Prefill, dec.Peer, dec.Prefill.ID
			m.prefillGen++
			m.startPrefill()
		}
	}
	if !m.remote {
		// The new decode worker prefills: its own pull.
		m.decodePeer = dec.Peer
	}
	m.startDecode()
	if m.remote && !p.restart && m.migrateFrom == nil {
		m.resendPending = true
		m.emit(Resend{Prefill: m.prefill, Decode: m.decode, Attempt: m.attempt})
	}
	return nil
}

func (m *Machine) onFirstToken(ft FirstToken) error {
	if !m.waitingFirst() {
		return fmt.Errorf("coordinator: prefill worker %s sent request %s's first token with position 0 gone out", m.prefill.ID, m.cfg.ID)
	}
	m.gotFirst = true
	m.emit(PrefillDone{})
	setOnce(&m.tr.PrefillStart, ft.Start)
	setOnce(&m.tr.PrefillEnd, ft.End)
	m.tr.PrefillBatch = ft.Batch
	m.tr.setHits(ft.Hits)
	// Position 0 of choice 0, as the decode stream's tokens are.
	first := Tokens{Attempt: m.attempt, Tokens: []int32{ft.Token}}
	if m.cfg.Logprobs {
		first.Logprobs = []engine.TokenLogprob{ft.Logprob}
	}
	m.first = &first
	if m.cfg.Policy == PolicyDecode && !slices.ContainsFunc(m.early, isTokens) {
		// It goes out with the decode stream's first tokens (the KV
		// reached the decode worker, which runs the sequence), so that
		// the transfer is part of TTFT. A clean end that came before
		// them is the decode worker's failure, as it would be now.
		if len(m.early) > 0 {
			m.early = nil
			return m.onGenerateEnded(nil)
		}
		return nil
	}
	return m.releaseFirst()
}

func isTokens(ev Event) bool { _, ok := ev.(Tokens); return ok }

// releaseFirst hands FirstToken, as choice 0's position 0, to the
// client when it waits (an end-of-generation id is held as the decode
// stream's would be: the stream's finish ends the choice with it), then
// the decode stream's messages that waited for position 0, as far as
// it can (the rest follow a Delivered).
func (m *Machine) releaseFirst() error {
	if m.first != nil {
		first := *m.first
		m.first = nil
		if err := m.generateTokens(first); err != nil {
			return err
		}
	}
	return m.flushEarly()
}

func (m *Machine) addKV(kd *KV) {
	if kd == nil {
		return
	}
	setOnce(&m.tr.KVFirstByte, kd.FirstByte)
	setOnce(&m.tr.KVDone, kd.Done)
	m.tr.KVBytesRaw += kd.BytesRaw
	m.tr.KVBytesWire += kd.BytesWire
	if kd.Codec != "" {
		m.tr.Codec, m.tr.CodecReason = kd.Codec, kd.CodecReason
	}
}

func (m *Machine) onGenerate(resp Tokens) error {
	if m.migrating {
		return fmt.Errorf("coordinator: decode worker %s sent request %s's tokens after it moved it out", m.decode.ID, m.cfg.ID)
	}
	if resp.Migrated {
		m.migrating = true
		if len(resp.Tokens) == 0 && resp.Finish == "" && len(resp.PromptLogprobs) == 0 {
			return nil
		}
	} else if len(resp.Tokens) > 0 {
		m.migrateFrom = nil
	}
	st := resp.Stamps
	setOnce(&m.tr.PrefillStart, st.PrefillStart)
	setOnce(&m.tr.PrefillEnd, st.PrefillEnd)
	setOnce(&m.tr.DecodeJoined, st.DecodeJoined)
	m.tr.BatchSize = max(m.tr.BatchSize, resp.Batch)
	if resp.Hits.Prefix > 0 && !m.remote {
		m.tr.setHits(resp.Hits)
	}
	if len(resp.PromptLogprobs) > 0 && m.cfg.PromptLogprobs {
		rest := resp // only here on the heap: resp stays on the stack
		m.phase, m.after = phaseDelivery, pending{gen: &rest}
		m.emit(DeliverPrompt{Logprobs: resp.PromptLogprobs})
		return nil
	}
	return m.generateTokens(resp)
}

// generateTokens takes the tokens and finish of a Tokens message.
func (m *Machine) generateTokens(resp Tokens) error {
	i := resp.Index
	if i < 0 || i >= len(m.choices) {
		return fmt.Errorf("coordinator: decode worker %s sent choice %d of request %s, which has %d", m.decode.ID, i, m.cfg.ID, len(m.choices))
	}
	c := &m.choices[i]
	toks := resp.Tokens
	var lps []engine.TokenLogprob
	if m.cfg.Logprobs {
		if lps = resp.Logprobs; len(lps) != len(toks) {
			return fmt.Errorf("coordinator: decode worker %s sent %d logprobs for %d tokens of request %s", m.decode.ID, len(lps), len(toks), m.cfg.ID)
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
	finish := resp.Finish
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
		case vocab.FinishStop:
			toks = toks[:n-1]
			if lps != nil {
				lps = lps[:n-1]
			}
		}
	}
	return m.deliver(i, pos, toks, lps, finish)
}

// deliver hands the tokens of choice i at output positions pos… (with
// their log-probabilities, when asked) to the client, but those of a
// choice a stop string ended; finish, when set, is the choice's finish
// once they are delivered. Every position has one carrier, so pos is
// the next one the client lacks.
func (m *Machine) deliver(i, pos int, toks []int32, lps []engine.TokenLogprob, finish string) error {
	c := &m.choices[i]
	if c.stopped {
		return m.finishChoice(i, finish)
	}
	if pos != len(c.out) {
		return fmt.Errorf("coordinator: request %s: tokens from position %d arrived with %d delivered", m.cfg.ID, pos, len(c.out))
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
		return m.generateTokens(*after.gen)
	}
	switch {
	case ev.Stopped:
		// Only this choice ends (the worker's later tokens of it are
		// dropped); once every choice has, the request ends, its calls
		// are cancelled and the workers free it.
		c := &m.choices[after.index]
		c.stopped, c.finish, m.stoppedEarly = true, vocab.FinishStop, true
	case ev.Err != nil:
		return ev.Err
	}
	if err := m.finishChoice(after.index, after.finish); err != nil {
		return err
	}
	return m.flushEarly()
}

// waitingFirst reports whether the KV is remote and FirstToken, which
// carries choice 0's position 0, has not come yet: the decode stream's
// messages wait for it.
func (m *Machine) waitingFirst() bool { return m.remote && m.choices[0].pos == 0 && m.first == nil }

// flushEarly takes the Generate stream's messages and clean end that
// waited for position 0, in order, until one is to be delivered (the
// rest follow its Delivered).
func (m *Machine) flushEarly() error {
	for m.phase == phaseRunning && !m.waitingFirst() && len(m.early) > 0 {
		ev := m.early[0]
		m.early = m.early[1:]
		var err error
		switch ev := ev.(type) {
		case Tokens:
			err = m.onGenerate(ev)
		case GenerateEnded:
			err = m.onGenerateEnded(ev.Err)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
