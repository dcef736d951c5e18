package prefill

import (
	"context"
	"fmt"
	"sync"
	"time"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// transfer streams one request's KV to one decode worker. The batch
// pushes frames as the engine computes them and seals it with the first
// token; run, on its own goroutine, opens the stream at the first frame,
// sends frames in order and commits after the last. push, seal and abort
// are safe for concurrent use with run and never block.
type transfer struct {
	addr   string
	hdr    kvtransfer.StreamHeader // TokenBytes is filled in from kv at the first frame; Codec may be CodecAuto(Lossy) until then
	kv     *kvBuf
	raw    int64 // canonical KV bytes the stream stands for (full size), for the codec choice
	auto   *kvtransfer.CodecChooser
	now    func() time.Time
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	pending []frame
	sealed  bool
	first   int32
	firstLP *pdservev1.TokenLogprob // first's log-probability, or nil
	notify  chan struct{}           // capacity 1: something was pushed, sealed or aborted
}

// transferResult is what run reports.
type transferResult struct {
	ack             kvtransfer.Ack
	bytesRaw, bytes int64 // bytes is on the wire
	// codec is the codec the stream was opened with ("" when it never
	// opened); reason why it was chosen, for CodecAuto and CodecAutoLossy.
	codec, reason string
	err           error
}

// peerContext returns ctx naming the decode worker id of a transfer (for
// the dialer's TLS identity check, kvtransfer.WithPeerTLS) and carrying
// the push credential the coordinator signed for it (cred; may be empty).
func peerContext(ctx context.Context, id, cred string) context.Context {
	if id != "" {
		ctx = kvtransfer.WithPeerID(ctx, id)
	}
	return grpcauth.CredentialContext(ctx, cred)
}

// newTransfer returns the transfer of kv, the engine's KV of dtype dt, with
// codec codecName (or CodecAuto, CodecAutoLossy: auto chooses at the first
// frame) to addr, from token skip on (the decode worker holds the KV
// before it; 0: all of it). 0 ≤ skip < kv.tokens. tokenBytes is the
// model's KV bytes of one token in one layer (what the stream stands
// for); now is the clock of the link measurement.
func newTransfer(parent context.Context, id, addr, codecName string, dt engine.DType, kv *kvBuf, skip, tokenBytes int, auto *kvtransfer.CodecChooser, now func() time.Time) *transfer {
	ctx, cancel := context.WithCancelCause(parent)
	return &transfer{
		addr:   addr,
		hdr:    kvtransfer.StreamHeader{RequestID: id, Codec: codecName, Layers: kv.layers, Tokens: kv.tokens, DType: dt, Start: skip},
		kv:     kv,
		raw:    int64(kv.tokens-skip) * int64(kv.layers) * int64(tokenBytes),
		auto:   auto,
		now:    now,
		ctx:    ctx,
		cancel: cancel,
		notify: make(chan struct{}, 1),
	}
}

func (t *transfer) signal() {
	select {
	case t.notify <- struct{}{}:
	default:
	}
}

// push queues f, whose bytes in kv are final.
func (t *transfer) push(f frame) {
	t.mu.Lock()
	t.pending = append(t.pending, f)
	t.mu.Unlock()
	t.signal()
}

// seal says every frame was pushed and the first token to commit with.
func (t *transfer) seal(first int32, lp *pdservev1.TokenLogprob) {
	t.mu.Lock()
	t.sealed, t.first, t.firstLP = true, first, lp
	t.mu.Unlock()
	t.signal()
}

// abort stops the transfer; run returns cause.
func (t *transfer) abort(cause error) { t.cancel(cause) }

// run sends everything and commits. It returns when the decode worker
// acknowledged the KV, the transfer failed, or it was aborted.
//
// It measures the link for auto's choices: a committed transfer's
// network time is from its first Send until the ack, less the time it
// waited for the engine's next frame. Encoding is not taken out: gRPC
// writes to the socket on its own goroutine while the next frame is
// encoded, so the two overlap (subtracting it read a 3 Gb/s link as 9.6).
// A transfer whose encoding took most of that time was encode-bound, and
// its sample is a lower bound (kvtransfer.CodecChooser.Finish).
func (t *transfer) run(d *kvtransfer.Dialer) (res transferResult) {
	defer t.cancel(context.Canceled)
	var (
		snd     *kvtransfer.Sender
		started bool // counted by auto.start
		ch      kvtransfer.CodecChoice
		sent    time.Time     // first Send began
		idle    time.Duration // waiting for frames since
		network time.Duration // set once committed
		encode  time.Duration // the sender's encoding time, set with network
	)
	defer func() {
		if snd != nil {
			res.bytesRaw, res.bytes = snd.BytesRaw(), snd.BytesWire()
			if res.err != nil {
				snd.Abort(res.err)
			}
		}
		// The codec's canonical name (the stream header's), not an alias
		// the caller named; none when the stream never opened.
		res.codec, res.reason = "", ch.Reason
		if snd != nil {
			res.codec = snd.Header().Codec
		}
		if started {
			t.auto.Finish(t.addr, res.codec, res.bytesRaw, res.bytes, network, encode)
		}
	}()
	for {
		t.mu.Lock()
		frames, sealed, first, firstLP := t.pending, t.sealed, t.first, t.firstLP
		t.pending = nil
		t.mu.Unlock()
		for _, f := range frames {
			skip := t.hdr.Start
			if f.end <= skip {
				// The decode worker holds it.
				continue
			}
			data, start, full := t.kv.bytes(f), f.start, f.fullBytes
			if f.start < skip {
				data = tailKV(data, f.end-f.start, skip-f.start)
				full = full * (f.end - skip) / (f.end - f.start)
				start = skip
			}
			if snd == nil {
				var err error
				started = true
				if ch, err = t.auto.Start(t.addr, t.hdr.Codec, t.raw); err != nil {
					return transferResult{err: err}
				}
				h := t.hdr
				h.TokenBytes = t.kv.tokenBytes
				h.Codec = ch.Codec
				s, err := d.Open(t.ctx, t.addr, h)
				if err != nil {
					return transferResult{err: t.cause(err)}
				}
				snd = s
				sent = t.now()
			}
			if err := snd.Send(f.layer, start, f.end, data, full); err != nil {
				return transferResult{err: t.cause(fmt.Errorf("prefill: send kv of layer %d tokens [%d, %d) to %s: %w", f.layer, start, f.end, t.addr, err))}
			}
		}
		if len(frames) > 0 {
			continue
		}
		if sealed {
			if snd == nil {
				return transferResult{err: fmt.Errorf("prefill: transfer of %s sealed without kv", t.hdr.RequestID)}
			}
			ack, err := snd.Commit(t.ctx, kvtransfer.Commit{FirstToken: first, FirstLogprob: firstLP, Provenance: t.kv.prov})
			if err != nil {
				return transferResult{err: t.cause(fmt.Errorf("prefill: commit kv to %s: %w", t.addr, err))}
			}
			network, encode = t.now().Sub(sent)-idle, snd.EncodeTime()
			return transferResult{ack: ack}
		}
		w := t.now()
		select {
		case <-t.notify:
			if snd != nil {
				idle += t.now().Sub(w)
			}
		case <-t.ctx.Done():
			return transferResult{err: context.Cause(t.ctx)}
		}
	}
}

// cause prefers the reason the transfer was aborted over the error an
// aborted stream reports.
func (t *transfer) cause(err error) error {
	if c := context.Cause(t.ctx); c != nil {
		return c
	}
	return err
}

// tailKV returns a new canonical chunk holding tokens [from, n) of data,
// the canonical KV of n tokens (every token's K row, then every token's V
// row, rows of len(data)/2n bytes).
func tailKV(data []byte, n, from int) []byte {
	row := len(data) / (2 * n)
	out := make([]byte, 0, 2*(n-from)*row)
	out = append(out, data[from*row:n*row]...)
	return append(out, data[(n+from)*row:]...)
}
