package kvtransfer

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
)

// decodeBoundShare: a transfer whose raw rate reached this share of the
// rate the receiver was predicted to decode at was limited by decoding,
// not by the link; its link sample is a lower bound.
const decodeBoundShare = 0.8

// encodeBoundShare: a transfer whose encoding took this share of its
// network time was limited by encoding, not by the link; its link sample
// is a lower bound.
const encodeBoundShare = 0.8

// ReceiverSpeeds is what a decode worker says of its decoding, in its
// heartbeat (control.Heartbeat.CodecSpeeds and CodecCores).
type ReceiverSpeeds struct {
	// DecodeBytesPerSec is the raw bytes/s one of its cores decodes, by
	// codec name; a codec missing is unknown.
	DecodeBytesPerSec map[string]float64
	// Cores is how many transfers it decodes at once at full speed; 0
	// when unknown (taken as enough for every transfer).
	Cores int
}

// CodecChooser chooses a KV codec per transfer for a sender (a prefill
// worker) with codecpick, from the sender's codec self-benchmark, the link
// throughput its transfers achieved per destination (LinkStats) and the
// receivers' decode speeds (their heartbeats). Safe for concurrent use.
type CodecChooser struct {
	speeds func() (codec.Speeds, error) // the self-benchmark, run once
	links  *LinkStats
	cores  int // this worker's GOMAXPROCS at start

	mu        sync.Mutex
	receivers func(addr string) (ReceiverSpeeds, bool) // nil: none known
	inflight  map[string]int                           // transfers being sent, by decode address
	total     int                                      // Σ inflight
}

// NewCodecChooser returns a chooser for KV of dtype dt; its
// self-benchmark runs at the first Start of an automatic name (or
// Speeds).
func NewCodecChooser(dt engine.DType) *CodecChooser {
	return &CodecChooser{
		speeds: sync.OnceValues(func() (codec.Speeds, error) {
			return codec.SelfBench(context.Background(), dt, codec.DefaultBenchBudget)
		}),
		links:    NewLinkStats(DefaultLinkAlpha),
		cores:    runtime.GOMAXPROCS(0),
		inflight: make(map[string]int),
	}
}

// SetReceivers sets how the chooser learns what a destination address
// said of its decoding (nil: nothing).
func (a *CodecChooser) SetReceivers(f func(addr string) (ReceiverSpeeds, bool)) {
	a.mu.Lock()
	a.receivers = f
	a.mu.Unlock()
}

// receiver returns what addr said of its decoding (zero when nothing).
func (a *CodecChooser) receiver(addr string) ReceiverSpeeds {
	a.mu.Lock()
	f := a.receivers
	a.mu.Unlock()
	if f == nil {
		return ReceiverSpeeds{}
	}
	r, _ := f(addr)
	return r
}

// CodecChoice is a codec chosen for one transfer, and why (empty for a
// codec the caller named).
type CodecChoice struct {
	Codec  string
	Reason string
}

// begin counts a transfer to addr as being sent until end. It returns the
// cores one transfer gets at each end: a transfer codes on its own
// goroutine, so one core at most, shared when more transfers than cores
// are sent (here) or received (there, of those this worker sends).
func (a *CodecChooser) begin(addr string, rcvCores int) (enc, dec float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight[addr]++
	a.total++
	enc = min(1, float64(a.cores)/float64(a.total))
	dec = 1
	if rcvCores > 0 {
		dec = min(1, float64(rcvCores)/float64(a.inflight[addr]))
	}
	return enc, dec
}

func (a *CodecChooser) end(addr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inflight[addr]--; a.inflight[addr] <= 0 {
		delete(a.inflight, addr)
	}
	a.total--
}

// Start counts a transfer of rawBytes of KV to addr as being sent until
// Finish, and returns its codec: name, or for codecpick.Auto and
// codecpick.AutoLossy the codec that delivers soonest, with the reason. The
// caller calls Finish once the transfer is over, also after an error.
// Errors: the self-benchmark's, or codecpick's (no usable codec),
// wrapped.
func (a *CodecChooser) Start(addr, name string, rawBytes int64) (CodecChoice, error) {
	auto, lossy := codecpick.AutoName(name)
	if !auto {
		a.begin(addr, 0)
		return CodecChoice{Codec: name}, nil
	}
	rcv := a.receiver(addr)
	enc, dec := a.begin(addr, rcv.Cores)
	sp, err := a.speeds()
	if err != nil {
		return CodecChoice{}, fmt.Errorf("kvtransfer: codec self-benchmark: %w", err)
	}
	link, _ := a.links.Throughput(addr)
	ch, err := codecpick.Pick(codecpick.Input{
		RawBytes:        rawBytes,
		LinkBytesPerSec: link,
		EncodeCores:     enc,
		DecodeCores:     dec,
		AllowLossy:      lossy,
		Candidates:      codecpick.Candidates(sp, rcv.DecodeBytesPerSec),
	})
	if err != nil {
		return CodecChoice{}, fmt.Errorf("kvtransfer: choose a codec for %s: %w", addr, err)
	}
	return CodecChoice{Codec: ch.Codec, Reason: ch.Reason}, nil
}

// Finish ends the count of a transfer Start began and records the link
// throughput it achieved with codecName (the canonical name, as the
// stream header has it; empty when it never opened): wire bytes over its
// network time. When its raw rate came near what the receiver decodes
// codecName at, or encoding took most of that time, the link may not have
// set the pace: the sample is then a lower bound.
func (a *CodecChooser) Finish(addr, codecName string, raw, wire int64, network, encode time.Duration) {
	a.end(addr)
	if network <= 0 || codecName == "" {
		return
	}
	// Encode-bound: the link waited for the encoder, so it is at least as
	// fast as the sample.
	lower := encode.Seconds() >= encodeBoundShare*network.Seconds()
	if d := a.receiver(addr).DecodeBytesPerSec[codecName]; d > 0 && !lower {
		lower = float64(raw)/network.Seconds() >= decodeBoundShare*d
	}
	a.links.Observe(addr, wire, network, lower)
}

// Speeds returns the sender's codec self-benchmark (run once).
func (a *CodecChooser) Speeds() (codec.Speeds, error) { return a.speeds() }

// Links returns the per-destination link throughput the chooser measured.
func (a *CodecChooser) Links() *LinkStats { return a.links }
