package sim

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Pacer spaces a byte stream so that it takes the time a link of a given
// bandwidth needs, scaled like the engine's steps. A KV sender that moves
// scaled-down payloads calls Wait with each chunk's KVChunk.Bytes() (the
// true size) before sending it: the transfer then takes the true size's
// time over the link even though fewer bytes move. Callers sharing one
// Pacer share its link: reservations queue one after another. Safe for
// concurrent use.
type Pacer struct {
	secPerByte float64 // scaled seconds per byte
	clock      func() time.Time
	sleep      func(context.Context, time.Duration) error

	mu   sync.Mutex
	busy time.Time // when the link finishes the reservations made so far
}

// NewPacer returns a pacer for a link of bytesPerSec bytes/s (> 0, finite)
// that shares the engine's TimeScale, Clock and Sleep.
func (e *Engine) NewPacer(bytesPerSec float64) (*Pacer, error) {
	if !(bytesPerSec > 0) || math.IsInf(bytesPerSec, 0) {
		return nil, fmt.Errorf("%w: link bandwidth %v bytes/s must be finite and > 0", ErrOptions, bytesPerSec)
	}
	return &Pacer{secPerByte: e.timeScale / bytesPerSec, clock: e.clock, sleep: e.sleep}, nil
}

// Wait reserves the link for n bytes (n ≤ 0 reserves nothing) and blocks
// until the link would have carried them: until max(now, end of earlier
// reservations) + n / bandwidth × TimeScale. It returns ctx's error if ctx
// ends first; the reservation is kept then (the bytes were in flight).
func (p *Pacer) Wait(ctx context.Context, n int) error {
	p.mu.Lock()
	now := p.clock()
	if p.busy.Before(now) {
		p.busy = now
	}
	if n > 0 {
		p.busy = p.busy.Add(time.Duration(math.Round(float64(n) * p.secPerByte * 1e9)))
	}
	until := p.busy
	p.mu.Unlock()
	if err := p.sleep(ctx, until.Sub(now)); err != nil {
		return fmt.Errorf("sim: pace %d bytes: %w", n, err)
	}
	return nil
}
