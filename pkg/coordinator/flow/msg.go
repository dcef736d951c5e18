package flow

import (
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/router"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Event is an input of Machine.Step: one of the types below. Events are
// the flow's own Go types: the shell converts the workers' messages and
// statuses to them.
type Event interface{ event() }

// Start begins the request: the first routing.
type Start struct{}

// Routed is the router's answer to a Route action.
type Routed struct {
	Decision router.Decision
	Err      error // one of router's errors (ErrNoDecodeWorkers, ...), wrapped
}

// Reserved is the answer of DecodeService.Reserve to a Reserve action.
type Reserved struct {
	// Hit is the prompt tokens the worker holds in its prefix cache
	// (ReserveResponse.prefix_hit_tokens); only read for a Fresh Reserve.
	Hit int
	Err *CallError
	// At is when the answer came: the budget's routed boundary on the
	// first placement.
	At time.Time
	// PromptHeld: the worker keeps the prompt a Fresh Reserve showed it
	// (ReserveResponse.prompt_held), so its Generate may omit it.
	PromptHeld bool
}

// Hits is a prefix hit of the worker that prefilled, by tier: Prefix
// tokens in all, Host, Disk and Peer tokens of them loaded from its host
// tier, read from its disk tier and pulled from a peer.
type Hits struct {
	Prefix, Host, Disk, Peer int
	HostLoad, PeerLoad       time.Duration
}

// KV is a KV transfer's report (KVDone): its stamps (zero: not said),
// sizes and codec.
type KV struct {
	FirstByte, Done     time.Time
	BytesRaw, BytesWire int64
	Codec, CodecReason  string // Codec "": not said
}

// PrefillQueued says the prefill worker queued the prompt (attempt
// Attempt) at At.
type PrefillQueued struct {
	Attempt int
	At      time.Time
}

// FirstToken is the prefill worker's first token (attempt Attempt): its
// value, its log-probability (read when Config.Logprobs), the prefill's
// stamps, batch size and prefix hit.
type FirstToken struct {
	Attempt    int
	Token      int32
	Logprob    engine.TokenLogprob
	Start, End time.Time
	Batch      int
	Hits       Hits
}

// KVDone relays the decode worker's acknowledgement of the KV of the
// Prefill stream of attempt Attempt.
type KVDone struct {
	Attempt int
	KV      KV
}

// PrefillEnded says the Prefill stream of attempt Attempt ended; Err is
// nil when it ended cleanly.
type PrefillEnded struct {
	Attempt int
	Err     *CallError
}

// Stamps are the decode worker's budget stamps of a GenerateResponse
// (zero: not in this message). The KV's arrival is not among them: the
// flow takes it from one report only, KVDone (and ResendDone), which
// the prefill worker relays from the decode worker's acknowledgement.
type Stamps struct {
	PrefillStart, PrefillEnd, DecodeJoined time.Time
}

// Tokens is a message of the Generate stream of decode attempt Attempt:
// choice Index's positional tokens (see the package coordinator doc:
// with remote KV and nothing generated yet, choice 0's start at position
// 1, position 0 being FirstToken's),
// their log-probabilities (one a token when Config.Logprobs), the
// choice's finish ("" while it runs), and what the worker reports.
type Tokens struct {
	Attempt  int
	Index    int
	Tokens   []int32
	Logprobs []engine.TokenLogprob
	Finish   string
	Stamps   Stamps
	Batch    int  // the worker's running batch
	Hits     Hits // a local prefill's prefix hit (Prefix 0: none)
	// PromptLogprobs are the prompt's log-probabilities (a local prefill
	// asked for them); nil: none in this message.
	PromptLogprobs []engine.TokenLogprob
	// Migrated: the worker moved the sequence out (a live migration, as
	// it drains) after every token it sent; its stream ends next, and the
	// request goes on on another decode worker that pulls the KV from
	// this one (Generate.MigrateFrom).
	Migrated bool
}

// GenerateEnded says the Generate stream of decode attempt Attempt ended;
// Err is nil when it ended cleanly.
type GenerateEnded struct {
	Attempt int
	Err     *CallError
}

// ResendDone is the result of the Resend call of decode attempt Attempt:
// the re-sent KV's report (nil: none), or Err.
type ResendDone struct {
	Attempt int
	KV      *KV
	Err     *CallError
}

// Delivered is the result of a Deliver or DeliverPrompt action. Stopped:
// a stop string ended the choice (the client has what it asked for);
// otherwise Err, when not nil, ends the request (the shell's error,
// passed through unchanged).
type Delivered struct {
	Stopped bool
	Err     error
}

// ClientGone says the client's context ended with Err.
type ClientGone struct{ Err error }

// Abort ends the request with Err: the caller could not perform an
// action (no connection to the worker, a Resend target that is not a
// member).
type Abort struct{ Err error }

func (Start) event()         {}
func (Routed) event()        {}
func (Reserved) event()      {}
func (PrefillQueued) event() {}
func (FirstToken) event()    {}
func (KVDone) event()        {}
func (PrefillEnded) event()  {}
func (Tokens) event()        {}
func (GenerateEnded) event() {}
func (ResendDone) event()    {}
func (Delivered) event()     {}
func (ClientGone) event()    {}
func (Abort) event()         {}

// Action is an output of Machine.Step: one of the types below.
type Action interface{ action() }

// Route asks the router for a placement (synchronous: answer Routed).
type Route struct {
	Req     router.Request
	Exclude map[string]bool // the caller's to keep
	// Prefill: offer the live prefill workers too.
	Prefill bool
	// Decode, when set, is the only decode worker offered (a prefill
	// retry for the decode worker waiting for the KV); otherwise every
	// live decode worker is.
	Decode *router.Worker
	// Trace: trace the routing (a placement; a prefill retry's is not),
	// under the request's queue span when Queue (the first placement and
	// a recovery that prefills again; a recovery's decode-only one is
	// not part of the queue term).
	Trace, Queue bool
}

// Reserve reserves the request's KV on a decode worker (synchronous:
// answer Reserved).
type Reserve struct {
	Worker router.Worker
	// Fresh: the KV comes from a new Prefill; the worker is shown the
	// prompt and answers the prefix it holds.
	Fresh bool
	Queue bool // traced under the queue span
}

// Revised tells the router that the decision it made for the request
// was revised on the decode worker's real prefix hit: the prefill moved
// onto the decode worker (router.Router.Revised drops the prefill
// worker's assignment and counts the placement).
type Revised struct{}

// Prefill opens PrefillService.Prefill; its messages and end come back
// as PrefillQueued, FirstToken, KVDone and PrefillEnded of Attempt.
type Prefill struct {
	Worker, Decode router.Worker
	SkipTokens     int // prompt tokens the decode worker holds already
	Attempt        int
	// Peer is the worker Worker may pull the prompt's prefix from (the
	// router's Decision.Peer); zero: none.
	Peer router.Pull
}

// Generate opens DecodeService.Generate; its messages and end come back
// as Tokens and GenerateEnded of Attempt.
type Generate struct {
	Worker       router.Worker
	Attempt      int
	LocalPrefill bool
	// Peer is the worker a local prefill may pull the prompt's prefix
	// from (the router's decision); zero: none, and always without
	// LocalPrefill.
	Peer router.Pull
	// Generated is each choice's tokens the client has (a recovery's
	// generated_tokens and generated_choices); nil before any.
	Generated      [][]int32
	PromptLogprobs bool
	// OmitPrompt: the decode worker holds the prompt from its Reserve
	// (Reserved.PromptHeld); the call does not send it again.
	OmitPrompt bool
	// MigrateFrom is the decode worker that moved the request out and
	// holds its KV (GenerateRequest.migrate_from): Worker pulls it, with
	// LocalPrefill (it computes the KV when the pull fails); nil: none.
	MigrateFrom *router.Worker
}

// Resend asks Prefill to re-send its retained KV to Decode; the result
// comes back as ResendDone of Attempt.
type Resend struct {
	Prefill, Decode router.Worker
	Attempt         int
}

// CancelGenerate ends the Generate call of Attempt (its context); its
// end event is that of an old attempt then.
type CancelGenerate struct{ Attempt int }

// PrefillDone tells the router the request's prefill is over
// (router.Router.PrefillDone).
type PrefillDone struct{}

// Unreachable reports that Worker (of the decode side, or the prefill
// side when Prefill) could not be reached (Err's Code is
// CodeUnavailable): the caller takes it out of routing until its next
// heartbeat.
type Unreachable struct {
	Worker  router.Worker
	Prefill bool
	Err     *CallError
}

// Deliver hands choice Index's Tokens (with Logprobs when asked) to the
// client (synchronous: answer Delivered).
type Deliver struct {
	Index    int
	Tokens   []int32
	Logprobs []engine.TokenLogprob
}

// DeliverPrompt hands the prompt's log-probabilities to the client
// (synchronous: answer Delivered).
type DeliverPrompt struct{ Logprobs []engine.TokenLogprob }

// Record is the flow's part of the request's budget as it stands: the
// caller applies it (Budget.Apply) to the request's trace. The Machine
// emits one whenever its part changed, before the next action that is
// not a Log and at the end of a Step, so the trace is current whenever
// the caller performs an action.
type Record struct{ Budget Budget }

// Log is a line for the request's log (its fields name the request).
type Log struct {
	Level  zapcore.Level
	Msg    string
	Fields []zap.Field
}

// Stop cancels every call still open and waits for each to end; their
// events are dropped.
type Stop struct{}

// Cancel sends DecodeService.Cancel to Worker (best effort).
type Cancel struct{ Worker router.Worker }

// Release sends PrefillService.Release to Worker (best effort).
type Release struct{ Worker router.Worker }

// Finish ends the request successfully: Machine.Finish has the reasons.
type Finish struct{}

// Fail ends the request with Err: a *Failure (errors.As) for the
// failures the flow tells the client of, the error of a ClientGone,
// Abort or Delivered event unchanged, or another error (an internal
// one: a worker that broke the protocol).
type Fail struct{ Err error }

func (Route) action()          {}
func (Reserve) action()        {}
func (Revised) action()        {}
func (Prefill) action()        {}
func (Generate) action()       {}
func (Resend) action()         {}
func (CancelGenerate) action() {}
func (PrefillDone) action()    {}
func (Unreachable) action()    {}
func (Deliver) action()        {}
func (DeliverPrompt) action()  {}
func (Record) action()         {}
func (Log) action()            {}
func (Stop) action()           {}
func (Cancel) action()         {}
func (Release) action()        {}
func (Finish) action()         {}
func (Fail) action()           {}
