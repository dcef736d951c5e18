package flow

import (
	"time"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/router"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Event is an input of Machine.Step: one of the types below.
type Event interface{ event() }

// Start begins the request: the first routing.
type Start struct{}

// Routed is the router's answer to a Route action.
type Routed struct {
	Decision router.Decision
	Err      error
}

// Reserved is the answer of DecodeService.Reserve to a Reserve action.
type Reserved struct {
	// Hit is the prompt tokens the worker holds in its prefix cache
	// (ReserveResponse.prefix_hit_tokens); only read for a Fresh Reserve.
	Hit int
	Err error
	// Local: the router, asked on the real hit (Reserve.Ask), moves the
	// prefill onto the decode worker (router.Router.Reserved).
	Local bool
	// At is when the answer came: the budget's routed boundary on the
	// first placement.
	At time.Time
	// PromptHeld: the worker keeps the prompt a Fresh Reserve showed it
	// (ReserveResponse.prompt_held), so its Generate may omit it.
	PromptHeld bool
}

// PrefillMsg is a message of the Prefill stream of attempt Attempt.
type PrefillMsg struct {
	Attempt int
	Resp    *pdservev1.PrefillResponse
}

// PrefillEnded says the Prefill stream of attempt Attempt ended; Err is
// nil when it ended cleanly.
type PrefillEnded struct {
	Attempt int
	Err     error
}

// GenerateMsg is a message of the Generate stream of decode attempt
// Attempt.
type GenerateMsg struct {
	Attempt int
	Resp    *pdservev1.GenerateResponse
}

// GenerateEnded says the Generate stream of decode attempt Attempt ended;
// Err is nil when it ended cleanly.
type GenerateEnded struct {
	Attempt int
	Err     error
}

// ResendDone is the result of the Resend call of decode attempt Attempt.
type ResendDone struct {
	Attempt int
	Resp    *pdservev1.ResendResponse
	Err     error
}

// Delivered is the result of a Deliver or DeliverPrompt action: nil,
// frontend.ErrStopped (a stop string ended the choice), or the error that
// ends the request.
type Delivered struct{ Err error }

// ClientGone says the client's context ended with Err.
type ClientGone struct{ Err error }

// Abort ends the request with Err: the caller could not perform an
// action (no connection to the worker, a Resend target that is not a
// member).
type Abort struct{ Err error }

func (Start) event()         {}
func (Routed) event()        {}
func (Reserved) event()      {}
func (PrefillMsg) event()    {}
func (PrefillEnded) event()  {}
func (GenerateMsg) event()   {}
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
	// Ask: on success, ask the router whether the real hit makes the
	// prefill local (Reserved.Local).
	Ask   bool
	Queue bool // traced under the queue span
}

// Prefill opens PrefillService.Prefill; its messages and end come back
// as PrefillMsg and PrefillEnded of Attempt.
type Prefill struct {
	Worker, Decode router.Worker
	SkipTokens     int // prompt tokens the decode worker holds already
	Attempt        int
}

// Generate opens DecodeService.Generate; its messages and end come back
// as GenerateMsg and GenerateEnded of Attempt.
type Generate struct {
	Worker       router.Worker
	Attempt      int
	LocalPrefill bool
	// Generated is each choice's tokens the client has (a recovery's
	// generated_tokens and generated_choices); nil before any.
	Generated      [][]int32
	PromptLogprobs bool
	// OmitPrompt: the decode worker holds the prompt from its Reserve
	// (Reserved.PromptHeld); the call does not send it again.
	OmitPrompt bool
	// FirstFromPrefill: the prefill worker's FirstToken is the source of
	// choice 0's first token, so the decode worker need not stream it
	// (GenerateRequest.first_token_from_prefill).
	FirstFromPrefill bool
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

// Unreachable reports a call to Worker (of the decode side, or the
// prefill side when Prefill) that failed with Err: the caller takes it
// out of routing when Err says it could not be reached.
type Unreachable struct {
	Worker  router.Worker
	Prefill bool
	Err     error
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

// Fail ends the request with Err.
type Fail struct{ Err error }

func (Route) action()          {}
func (Reserve) action()        {}
func (Prefill) action()        {}
func (Generate) action()       {}
func (Resend) action()         {}
func (CancelGenerate) action() {}
func (PrefillDone) action()    {}
func (Unreachable) action()    {}
func (Deliver) action()        {}
func (DeliverPrompt) action()  {}
func (Log) action()            {}
func (Stop) action()           {}
func (Cancel) action()         {}
func (Release) action()        {}
func (Finish) action()         {}
func (Fail) action()           {}
