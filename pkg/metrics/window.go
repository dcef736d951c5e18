package metrics

import (
	"math"
	"sync"
	"time"
)

// windowBuckets is the resolution of the attainment window: it slides in
// steps of span / windowBuckets.
const windowBuckets = 60

// window counts requests, and those that met the SLO, over a sliding span
// of time. Time is an input (add and value take now), so that it is
// tested without waiting. Safe for concurrent use.
type window struct {
	width time.Duration // of one bucket, > 0

	mu      sync.Mutex
	buckets [windowBuckets]bucket
}

// bucket holds the counts of the width-long interval number idx (time
// since the Unix epoch / width).
type bucket struct {
	idx        int64
	met, total int
}

func newWindow(span time.Duration) *window {
	return &window{width: max(span/windowBuckets, time.Nanosecond)}
}

func (w *window) index(now time.Time) int64 { return now.UnixNano() / int64(w.width) }

// add counts one request that ended at now.
func (w *window) add(now time.Time, met bool) {
	idx := w.index(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	b := &w.buckets[(idx%windowBuckets+windowBuckets)%windowBuckets]
	if b.idx != idx {
		*b = bucket{idx: idx}
	}
	b.total++
	if met {
		b.met++
	}
}

// value returns met / total over the buckets of the span ending at now
// (the current one and the windowBuckets−1 before it), NaN when it holds
// no request.
func (w *window) value(now time.Time) float64 {
	idx := w.index(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	var met, total int
	for _, b := range w.buckets {
		if b.idx > idx-windowBuckets && b.idx <= idx {
			met += b.met
			total += b.total
		}
	}
	if total == 0 {
		return math.NaN()
	}
	return float64(met) / float64(total)
}
