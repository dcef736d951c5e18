package apikey

import (
	"math"
	"sync"
	"time"
)

// Limited resources, as Quota.Exceeded names them (and OpenAI's error
// "type" of a rate limit).
const (
	Requests = "requests"
	Tokens   = "tokens"
)

// Window is one limit's state, as OpenAI's x-ratelimit-limit-*,
// x-ratelimit-remaining-* and x-ratelimit-reset-* headers report it.
type Window struct {
	// Limit is the limit per minute; 0: the key has no such limit (and the
	// other fields are 0).
	Limit int
	// Remaining is what may be used now, in whole requests or tokens.
	Remaining int
	// Reset is the time until the bucket is full again (Remaining ==
	// Limit), rounded up to the millisecond; 0 when it is.
	Reset time.Duration
}

// Quota is the outcome of a take: both limits after it, and what refused
// it if anything.
type Quota struct {
	Requests, Tokens Window
	// Exceeded is "" when the take succeeded, else Requests or Tokens: the
	// limit that refused it (nothing was taken).
	Exceeded string
	// Requested is what the refused take asked for.
	Requested int
	// RetryAfter is, when refused, the time until the same take would
	// succeed, rounded up to the millisecond; 0 when it never will: it
	// asked for more than the limit.
	RetryAfter time.Duration
}

// OK reports whether the take succeeded.
func (q Quota) OK() bool { return q.Exceeded == "" }

// Limited reports whether the key has a limit at all.
func (q Quota) Limited() bool { return q.Requests.Limit > 0 || q.Tokens.Limit > 0 }

// limiter holds a key's two buckets. Shared by the Keys of one digest
// across reloads.
type limiter struct {
	mu       sync.Mutex
	requests bucket
	tokens   bucket
}

// configure sets the limits (0: none).
func (l *limiter) configure(rpm, tpm int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests.configure(rpm)
	l.tokens.configure(tpm)
}

func (l *limiter) limits() (rpm, tpm int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.requests.limit), int(l.tokens.limit)
}

// take takes n from the bucket of res (Requests or Tokens), all or none.
func (l *limiter) take(now time.Time, res string, n int) Quota {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests.refill(now)
	l.tokens.refill(now)
	b := &l.requests
	if res == Tokens {
		b = &l.tokens
	}
	var q Quota
	if n > 0 && b.limit > 0 {
		if ok, wait := b.take(int64(n)); !ok {
			q.Exceeded, q.Requested, q.RetryAfter = res, n, wait
		}
	}
	q.Requests, q.Tokens = l.requests.window(), l.tokens.window()
	return q
}

// settle charges d more tokens (d > 0, into debt) or gives −d back.
func (l *limiter) settle(now time.Time, d int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tokens.refill(now)
	if d < 0 {
		l.tokens.give(-d)
	} else {
		l.tokens.charge(d)
	}
}

// scale is the number of units of a bucket's level per request or token:
// the nanoseconds of a minute, so that a bucket of limit L refills by
// exactly L units a nanosecond. With L ≤ MaxLimit every level fits in an
// int64 (6·10¹⁸ at most).
const scale = int64(time.Minute)

// bucket is a token bucket of limit per minute. Its level is in units of
// 1/scale of a request or token.
type bucket struct {
	limit int64 // 0: no limit
	level int64 // in [floor(), limit × scale]; below 0: in debt
	last  time.Time
	init  bool // level and last are set (else the bucket is full)
}

func (b *bucket) configure(limit int) {
	switch l := int64(limit); {
	case l == 0:
		*b = bucket{}
	case b.limit == 0:
		*b = bucket{limit: l} // full at first use
	default:
		b.limit = l
		b.level = max(b.floor(), min(b.level, l*scale)) // a debt deeper than the new floor is capped too
	}
}

func (b *bucket) refill(now time.Time) {
	if b.limit == 0 {
		return
	}
	full := b.limit * scale
	if !b.init {
		b.level, b.last, b.init = full, now, true
		return
	}
	if !now.After(b.last) {
		return // a clock that stands still or goes back
	}
	el := now.Sub(b.last)
	b.last = now
	// full − level ≤ MaxInt64 (level ≥ floor), so el × limit below
	// cannot overflow.
	if int64(el) >= (full-b.level)/b.limit+1 {
		b.level = full
		return
	}
	b.level += int64(el) * b.limit
}

// take takes n (≤ the limit) or reports the wait until it could; a wait
// of 0 when n is over the limit.
func (b *bucket) take(n int64) (ok bool, wait time.Duration) {
	if n > b.limit {
		return false, 0
	}
	need := n * scale
	if b.level >= need {
		b.level -= need
		return true, 0
	}
	return false, ceilMs(ceilDiv(need-b.level, b.limit))
}

func (b *bucket) give(n int64) {
	if b.limit == 0 || n <= 0 {
		return
	}
	full := b.limit * scale
	if n >= b.limit {
		b.level = full
		return
	}
	b.level = min(full, b.level+n*scale)
}

// floor is the lowest level, the deepest debt: one limit below zero, or
// less where full − floor would not fit an int64 (limits above 76
// million a minute).
func (b *bucket) floor() int64 {
	full := b.limit * scale
	return max(-full, full-math.MaxInt64)
}

// charge takes n used, never refused, down to floor.
func (b *bucket) charge(n int64) {
	if b.limit == 0 {
		return
	}
	floor := b.floor()
	// By at most a limit a step: level − limit × scale ≥ floor − full
	// fits an int64.
	for n > 0 && b.level > floor {
		step := min(n, b.limit)
		b.level = max(floor, b.level-step*scale)
		n -= step
	}
}

func (b *bucket) window() Window {
	if b.limit == 0 {
		return Window{}
	}
	full := b.limit * scale
	return Window{Limit: int(b.limit), Remaining: int(max(b.level, 0) / scale), Reset: ceilMs(ceilDiv(full-b.level, b.limit))}
}

// ceilDiv returns ⌈a/b⌉ nanoseconds for a ≥ 0, b > 0, without
// overflow for any such a.
func ceilDiv(a, b int64) time.Duration {
	q := a / b
	if a%b != 0 {
		q++
	}
	return time.Duration(q)
}

// ceilMs rounds d up to the millisecond.
func ceilMs(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}
