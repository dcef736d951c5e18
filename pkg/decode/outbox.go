package decode

import (
	"sync"
	"time"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/decode/batch"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/wire"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// outbox collects what the batch produces for one Generate call until
// its handler sends it. The batch never blocks on a slow client: tokens
// that pile up go out together in one event per choice. Safe for
// concurrent use.
type outbox struct {
	mu sync.Mutex
	// bytes estimates what the pending tokens and logprobs hold; max
	// bounds it (Options.MaxOutboxBytes).
	bytes, max int
	choices    []choiceOut // one per choice, by index
	prompt     []*pdservev1.TokenLogprob
	stamps     []*pdservev1.Stamp
	hit        int32 // a local prefill's prefix cache hit, not yet sent
	// host is the part of hit loaded from the host tier (and of it from
	// the disk tier) and the load's time, sent with it.
	host prefixcache.HostLoad
	// peer is the part of hit pulled from a peer worker, sent with it.
	peer batch.PeerLoad
	// batch is the last step's batch size; peak the largest of the
	// steps whose tokens wait here, which their event reports: tokens a
	// slow reader gets together keep the batch they were made in.
	batch, peak int32
	finished    bool
	err         error // a gRPC status error, when finished with one
	notify      chan struct{}
	// skipFirst: choice 0's next token is not sent (omitFirst).
	skipFirst bool
	// migrated: the stream ends with an event saying the sequence moved
	// to another worker (sent: it went out).
	migrated, migratedSent bool
}

// choiceOut is what one choice has pending.
type choiceOut struct {
	tokens []int32
	lps    []*pdservev1.TokenLogprob
	reason string // set once the choice finished
	sent   bool   // its finish reason went out
}

// newOutbox returns the outbox of a call with n ≥ 1 choices holding at
// most max bytes of output (see token).
func newOutbox(n, max int) *outbox {
	return &outbox{choices: make([]choiceOut, n), notify: make(chan struct{}, 1), max: max}
}

// tokenBytes estimates the memory of one output token with lp: the id,
// and the message of its logprob with its alternatives.
func tokenBytes(lp *pdservev1.TokenLogprob) int {
	if lp == nil {
		return 4
	}
	return 4 + 64 + 64*len(lp.GetTop())
}

func (o *outbox) signal() {
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

// Stamp records timestamp s for the next event.
func (o *outbox) Stamp(s vocab.Stamp, t time.Time) { o.stamp(s, t) }

// stamp records timestamp s for the next event.
func (o *outbox) stamp(s vocab.Stamp, t time.Time) {
	o.mu.Lock()
	o.stamps = append(o.stamps, &pdservev1.Stamp{Kind: wire.StampKind(s), UnixNano: t.UnixNano()})
	o.mu.Unlock()
	o.signal()
}

// PrefixHit records the prompt tokens a local prefill took from the prefix
// cache, for the next event: host.Tokens of them loaded from its host tier
// (or the disk tier behind it), peer.Tokens pulled from a peer worker.
func (o *outbox) PrefixHit(tokens int, host prefixcache.HostLoad, peer batch.PeerLoad) {
	o.mu.Lock()
	o.hit, o.host, o.peer = int32(tokens), host, peer
	o.mu.Unlock()
	o.signal()
}

// omitFirst arranges that choice 0's first token is not sent, its caller
// having it from the prefill worker: choice 0's stream starts at output
// position 1 (its finish still comes, also when that token ends it).
func (o *outbox) omitFirst() {
	o.mu.Lock()
	o.skipFirst = true
	o.mu.Unlock()
}

// Token records output token t of choice i, produced in a step of batch
// sequences, with its log-probability (nil when none was asked). It
// reports false, recording nothing, when the output waiting would then
// exceed the outbox's bound: the caller does not read.
func (o *outbox) Token(i int, t int32, elp *engine.TokenLogprob, batch int) bool {
	var lp *pdservev1.TokenLogprob
	if elp != nil {
		lp = wire.TokenLogprob(*elp)
	}
	o.mu.Lock()
	if i == 0 && o.skipFirst {
		o.skipFirst, o.batch = false, int32(batch)
		o.mu.Unlock()
		o.signal()
		return true
	}
	n := tokenBytes(lp)
	if o.bytes+n > o.max {
		o.mu.Unlock()
		return false
	}
	o.bytes += n
	c := &o.choices[i]
	c.tokens = append(c.tokens, t)
	if lp != nil {
		c.lps = append(c.lps, lp)
	}
	o.batch, o.peak = int32(batch), max(o.peak, int32(batch))
	o.mu.Unlock()
	o.signal()
	return true
}

// pending returns the bytes of output waiting.
func (o *outbox) pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bytes
}

// drop throws away the output waiting (the request was cancelled: its
// caller does not read); the stream's end stays.
func (o *outbox) drop() {
	o.mu.Lock()
	for i := range o.choices {
		o.choices[i].tokens, o.choices[i].lps = nil, nil
	}
	o.prompt, o.stamps, o.bytes = nil, nil, 0
	o.mu.Unlock()
	o.signal()
}

// PromptLogprobs records the prompt's log-probabilities, sent before any
// token.
func (o *outbox) PromptLogprobs(lps []engine.TokenLogprob) {
	m := wire.TokenLogprobs(lps)
	if m == nil {
		m = []*pdservev1.TokenLogprob{}
	}
	o.mu.Lock()
	o.prompt = m
	o.mu.Unlock()
	o.signal()
}

// ChoiceDone ends choice i with reason; only the first call counts.
func (o *outbox) ChoiceDone(i int, reason string) {
	o.mu.Lock()
	if o.choices[i].reason == "" {
		o.choices[i].reason = reason
	}
	o.mu.Unlock()
	o.signal()
}

// migrate marks the stream as ending with the sequence moved out (its
// finish comes with no reason and no error).
func (o *outbox) migrate() {
	o.mu.Lock()
	if !o.finished {
		o.migrated = true
	}
	o.mu.Unlock()
}

// finish ends the stream: with err when it is not nil, else with reason
// for every choice that has none yet. Only the first call counts.
func (o *outbox) finish(reason string, err error) {
	o.mu.Lock()
	if !o.finished {
		o.finished, o.err = true, err
		if err == nil {
			for i := range o.choices {
				if o.choices[i].reason == "" {
					o.choices[i].reason = reason
				}
			}
		}
	}
	o.mu.Unlock()
	o.signal()
}

// take returns the events to send, in order (the prompt's logprobs, then
// one per choice with tokens or a finish not yet sent; stamps and the
// prefix hit ride on the first), whether the stream is over, and the error to end it with.
func (o *outbox) take() ([]*pdservev1.GenerateResponse, bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*pdservev1.GenerateResponse
	if o.prompt != nil {
		out = append(out, &pdservev1.GenerateResponse{PromptLogprobs: o.prompt})
		o.prompt = nil
	}
	size := o.batch
	if o.peak > 0 {
		size = o.peak
	}
	o.peak = 0
	for i := range o.choices {
		c := &o.choices[i]
		final := c.reason != "" && !c.sent && (o.finished || len(o.choices) > 1) && o.err == nil
		if len(c.tokens) == 0 && !final {
			continue
		}
		resp := &pdservev1.GenerateResponse{Index: int32(i), Tokens: c.tokens, Logprobs: c.lps, BatchSize: size}
		if final {
			wire.SetFinish(resp, c.reason)
			c.sent = true
		}
		c.tokens, c.lps = nil, nil
		out = append(out, resp)
	}
	o.bytes = 0
	if o.finished && o.migrated && !o.migratedSent && o.err == nil {
		o.migratedSent = true
		out = append(out, &pdservev1.GenerateResponse{Migrated: true, BatchSize: o.batch})
	}
	if len(o.stamps) > 0 || o.hit > 0 {
		if len(out) == 0 {
			out = append(out, &pdservev1.GenerateResponse{BatchSize: o.batch})
		}
		out[0].Stamps = o.stamps
		if o.hit > 0 {
			h := &pdservev1.PrefixHit{Tokens: o.hit, HostTokens: int32(o.host.Tokens), HostLoadNanos: o.host.Took.Nanoseconds(),
				PeerTokens: int32(o.peer.Tokens), PeerLoadNanos: o.peer.Took.Nanoseconds()}
			if o.host.Disk {
				h.DiskTokens = h.HostTokens
			}
			out[0].Hit = h
		}
		o.stamps, o.hit, o.host, o.peer = nil, 0, prefixcache.HostLoad{}, batch.PeerLoad{}
	}
	return out, o.finished, o.err
}

var _ batch.Outbox = (*outbox)(nil)
