package kvtransfer

import (
	"context"
	"math"
	"sync"
	"time"
)

// link models one network link of a fixed bandwidth shared by every transfer
// of a Dialer (a worker's NIC): transfers queue on it first come, first
// served. It is a deterministic core: the caller passes the time. Safe for
// concurrent use.
type link struct {
	bitsPerSec float64 // > 0

	mu   sync.Mutex
	free time.Time // when the link finishes what it was charged so far
}

func newLink(gbps float64) *link { return &link{bitsPerSec: gbps * 1e9} }

// duration is how long bytes take on the link.
func (l *link) duration(bytes float64) time.Duration {
	if bytes <= 0 {
		return 0
	}
	s := bytes * 8 / l.bitsPerSec
	if s >= math.MaxInt64/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}

// charge books bytes on the link at time now and returns when they will have
// crossed it: the later of now and the end of what was booked before, plus
// their duration on the link.
func (l *link) charge(now time.Time, bytes float64) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	start := l.free
	if now.After(start) {
		start = now
	}
	l.free = start.Add(l.duration(bytes))
	return l.free
}

// chargeBytes is the wire size a chunk stands for on a real deployment: its
// full size (fullBytes, the raw size of the model's true KV) scaled by the
// codec's ratio on the bytes actually sent (wire/raw).
func chargeBytes(fullBytes, raw, wire int) float64 {
	if raw <= 0 {
		return 0
	}
	return float64(fullBytes) * float64(wire) / float64(raw)
}

// sleepCtx waits for d or until ctx ends, whichever comes first, and returns
// ctx's error in the second case. It is the Dialer's default sleeper.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
