package kvtransfer

import (
	"math"
	"sync"
	"time"
)

// Defaults of LinkStats.
const (
	// DefaultLinkAlpha is the weight of a new sample in the moving average.
	DefaultLinkAlpha = 0.3
	// MinLinkSampleBytes is the fewest wire bytes a transfer must carry
	// for its throughput to count: below it, latency, not bandwidth, sets
	// the time.
	MinLinkSampleBytes = 256 << 10
	// maxLinkAddrs bounds the addresses a LinkStats remembers; the one
	// updated least recently goes first.
	maxLinkAddrs = 1024
)

// LinkStats keeps, per destination address, an exponentially weighted
// moving average of the wire throughput that transfers to it achieved:
// wire bytes over the time a transfer spent waiting for the network (see
// Observe). It is a deterministic core: it reads no clock. Safe for
// concurrent use.
type LinkStats struct {
	alpha float64

	mu   sync.Mutex
	seq  uint64
	addr map[string]*linkEstimate
}

type linkEstimate struct {
	bytesPerSec float64
	samples     int
	seq         uint64 // when last updated, for eviction
}

// NewLinkStats returns an empty LinkStats whose average gives a new
// sample weight alpha (in (0, 1]; otherwise DefaultLinkAlpha).
func NewLinkStats(alpha float64) *LinkStats {
	if !(alpha > 0 && alpha <= 1) {
		alpha = DefaultLinkAlpha
	}
	return &LinkStats{alpha: alpha, addr: make(map[string]*linkEstimate)}
}

// Observe records a transfer to addr that moved wireBytes in network
// time d: the time from its first frame to the receiver's ack, less the
// time the sender waited for the engine to hand out KV (encoding is not
// taken out: it overlaps the socket writes). A transfer of fewer than
// MinLinkSampleBytes, or d ≤ 0, is ignored.
//
// lowerBound says the transfer was limited by something other than the
// link (the sender's encoding or the receiver's decoding), so that the
// link is at least as fast as the sample: such a sample only raises the average, never lowers it.
// Without it, a codec slow to decode would make the link look slow and
// be chosen again.
func (l *LinkStats) Observe(addr string, wireBytes int64, d time.Duration, lowerBound bool) {
	if wireBytes < MinLinkSampleBytes || d <= 0 {
		return
	}
	x := float64(wireBytes) / d.Seconds()
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	e := l.addr[addr]
	if e == nil {
		if len(l.addr) >= maxLinkAddrs {
			l.evictLocked()
		}
		e = &linkEstimate{bytesPerSec: x}
		l.addr[addr] = e
	} else if !lowerBound || x > e.bytesPerSec {
		e.bytesPerSec += l.alpha * (x - e.bytesPerSec)
	}
	e.samples++
	e.seq = l.seq
}

func (l *LinkStats) evictLocked() {
	var oldest string
	var seq uint64 = math.MaxUint64
	for a, e := range l.addr {
		if e.seq < seq {
			oldest, seq = a, e.seq
		}
	}
	delete(l.addr, oldest)
}

// Throughput returns the average wire bytes/s to addr and how many
// transfers it rests on; (0, 0) when none was observed.
func (l *LinkStats) Throughput(addr string) (bytesPerSec float64, samples int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.addr[addr]; e != nil {
		return e.bytesPerSec, e.samples
	}
	return 0, 0
}

// MeanThroughput returns the mean of the averages of every address
// observed (wire bytes/s); 0 when none was.
func (l *LinkStats) MeanThroughput() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	sum, n := 0.0, 0
	for _, e := range l.addr {
		if e.samples > 0 {
			sum += e.bytesPerSec
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}
