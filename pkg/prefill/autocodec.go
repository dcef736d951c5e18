package prefill

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
)

// Codec names that make the worker choose the codec per transfer (see the
// package doc): CodecAuto among the lossless codecs, CodecAutoLossy among
// every codec, fp8 and int8 included (a policy that accepts their error).
const (
	CodecAuto      = codecpick.Auto
	CodecAutoLossy = codecpick.AutoLossy
)

// decodeBoundShare: a transfer whose raw rate reached this share of the
// rate the receiver was predicted to decode at was limited by decoding,
// not by the link; its link sample is a lower bound.
const decodeBoundShare = 0.8

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

// autoCodec chooses a codec per transfer with codecpick from the
// worker's self-benchmark, the link throughput measured per decode
// address and the receivers' decode speeds. Safe for concurrent use.
type autoCodec struct {
	speeds func() (codec.Speeds, error) // the self-benchmark, run once
	links  *kvtransfer.LinkStats
	cores  int // this worker's GOMAXPROCS at start

	mu        sync.Mutex
	receivers func(addr string) (ReceiverSpeeds, bool) // nil: none known
	inflight  map[string]int                           // transfers being sent, by decode address
	total     int                                      // Σ inflight
}

func newAutoCodec(dt engine.DType) *autoCodec {
	return &autoCodec{
		speeds: sync.OnceValues(func() (codec.Speeds, error) {
			return codec.SelfBench(context.Background(), dt, codec.DefaultBenchBudget)
		}),
		links:    kvtransfer.NewLinkStats(kvtransfer.DefaultLinkAlpha),
		cores:    runtime.GOMAXPROCS(0),
		inflight: make(map[string]int),
	}
}

func (a *autoCodec) setReceivers(f func(addr string) (ReceiverSpeeds, bool)) {
	a.mu.Lock()
	a.receivers = f
	a.mu.Unlock()
}

// receiver returns what addr said of its decoding (zero when nothing).
func (a *autoCodec) receiver(addr string) ReceiverSpeeds {
	a.mu.Lock()
	f := a.receivers
	a.mu.Unlock()
	if f == nil {
		return ReceiverSpeeds{}
	}
	r, _ := f(addr)
	return r
}

// choice is a codec chosen for one transfer.
type choice struct {
	codec  string
	reason string
}

// begin counts a transfer to addr as being sent until end. It returns the
// cores one transfer gets at each end: a transfer codes on its own
// goroutine, so one core at most, shared when more transfers than cores
// are sent (here) or received (there, of those this worker sends).
func (a *autoCodec) begin(addr string, rcvCores int) (enc, dec float64) {
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

func (a *autoCodec) end(addr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inflight[addr]--; a.inflight[addr] <= 0 {
		delete(a.inflight, addr)
	}
	a.total--
}

// start counts a transfer of rawBytes of KV to addr as being sent until
// finish, and returns its codec: name, or for CodecAuto and
// CodecAutoLossy the codec that delivers soonest, with the reason. The
// caller calls finish once the transfer is over, also after an error.
// Errors: the self-benchmark's, or codecpick's (no usable codec),
// wrapped.
func (a *autoCodec) start(addr, name string, rawBytes int64) (choice, error) {
	auto, lossy := codecpick.AutoName(name)
	if !auto {
		a.begin(addr, 0)
		return choice{codec: name}, nil
	}
	rcv := a.receiver(addr)
	enc, dec := a.begin(addr, rcv.Cores)
	sp, err := a.speeds()
	if err != nil {
		return choice{}, fmt.Errorf("prefill: codec self-benchmark: %w", err)
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
		return choice{}, fmt.Errorf("prefill: choose a codec for %s: %w", addr, err)
	}
	return choice{codec: ch.Codec, reason: ch.Reason}, nil
}

// finish ends the count of a transfer start began and records the link
// throughput it achieved with codecName (empty when it never opened):
// wire bytes over its network time (see transferResult). When its raw
// rate came near what the receiver decodes codecName at, the receiver,
// not the link, may have set the pace: the sample is then a lower bound.
func (a *autoCodec) finish(addr, codecName string, raw, wire int64, network time.Duration) {
	a.end(addr)
	if network <= 0 || codecName == "" {
		return
	}
	lower := false
	if c, err := codec.ByName(codecName); err == nil {
		if d := a.receiver(addr).DecodeBytesPerSec[c.Name()]; d > 0 {
			lower = float64(raw)/network.Seconds() >= decodeBoundShare*d
		}
	}
	a.links.Observe(addr, wire, network, lower)
}
