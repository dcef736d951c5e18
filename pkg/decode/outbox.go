package decode

import (
	"sync"
	"time"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

// outbox collects what the scheduler produces for one Generate call until
// its handler sends it. The scheduler never blocks on a slow client: tokens
// that pile up go out together in one event. Safe for concurrent use.
type outbox struct {
	mu       sync.Mutex
	tokens   []int32
	stamps   []*pdservev1.Stamp
	batch    int32
	finished bool
	reason   string // finish reason, when finished without err
	err      error  // a gRPC status error, when finished with one
	notify   chan struct{}
}

func newOutbox() *outbox { return &outbox{notify: make(chan struct{}, 1)} }

func (o *outbox) signal() {
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

// stamp records a named timestamp for the next event.
func (o *outbox) stamp(name string, t time.Time) {
	o.mu.Lock()
	o.stamps = append(o.stamps, &pdservev1.Stamp{Name: name, UnixNano: t.UnixNano()})
	o.mu.Unlock()
	o.signal()
}

// token records one output token produced in a step of batch sequences.
func (o *outbox) token(t int32, batch int) {
	o.mu.Lock()
	o.tokens = append(o.tokens, t)
	o.batch = int32(batch)
	o.mu.Unlock()
	o.signal()
}

// finish ends the stream with reason, or with err when err is not nil.
// Only the first call counts.
func (o *outbox) finish(reason string, err error) {
	o.mu.Lock()
	if !o.finished {
		o.finished, o.reason, o.err = true, reason, err
	}
	o.mu.Unlock()
	o.signal()
}

// take returns the next event to send (nil when there is nothing to send),
// whether the stream is over, and the error to end it with.
func (o *outbox) take() (*pdservev1.GenerateResponse, bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var resp *pdservev1.GenerateResponse
	if len(o.tokens) > 0 || len(o.stamps) > 0 || (o.finished && o.err == nil) {
		resp = &pdservev1.GenerateResponse{Tokens: o.tokens, Stamps: o.stamps, BatchSize: o.batch}
		if o.finished && o.err == nil {
			resp.FinishReason = o.reason
		}
		o.tokens, o.stamps = nil, nil
	}
	return resp, o.finished, o.err
}
