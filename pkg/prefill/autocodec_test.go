package prefill

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// With --codec auto, each transfer goes with a codec the worker chose,
// and KVDone says which and why; with no link measured yet the reason
// says so.
func TestAutoCodecDefault(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	o := smallOptions()
	o.Codec = CodecAuto
	w := newWorker(t, o, true)
	p := prompt(20, 3)
	first, kv := referenceKV(t, p)
	stream, err := w.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: "a", PromptTokens: p, DecodeAddr: addr})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := collect(stream)
	if err != nil {
		t.Fatal(err)
	}
	c, err := codec.ByName(ev.done.GetCodec())
	if err != nil || !c.Lossless() {
		t.Fatalf("kv done with codec %q (%v): want a lossless codec's name", ev.done.GetCodec(), err)
	}
	if r := ev.done.GetCodecReason(); !strings.HasPrefix(r, c.Name()+" ") || !strings.Contains(r, "assumed") {
		t.Errorf("codec reason %q: want it to name %s and the assumed link", r, c.Name())
	}
	got, _ := f.get("a")
	if got.h.Codec != c.Name() || !got.committed || got.first != first {
		t.Errorf("receiver saw codec %q, committed %v, first %d", got.h.Codec, got.committed, got.first)
	}
	if diff := cmp.Diff(kv, got.layers); diff != "" {
		t.Errorf("kv received differs from the engine's (-engine +received):\n%s", diff)
	}
	// A named codec is used as named, with no reason.
	stream, err = w.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: "b", PromptTokens: p, DecodeAddr: addr, Codec: "zstd"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err = collect(stream); err != nil {
		t.Fatal(err)
	}
	if ev.done.GetCodec() != "zstd" || ev.done.GetCodecReason() != "" {
		t.Errorf("named codec: kv done %+v", ev.done)
	}
}

// The receiver's decode speeds (from its heartbeat) reach the choice, and
// a lossy codec is chosen only under auto-lossy: a receiver that decodes
// every lossless codec at a few bytes a second but the lossy ones fast
// gets bf16 (its decode is the least slow) under auto, a lossy codec
// under auto-lossy.
func TestAutoCodecReceiverAndLossyPolicy(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	w := newWorker(t, smallOptions(), true)
	w.s.SetReceivers(func(a string) (ReceiverSpeeds, bool) {
		if a != addr {
			return ReceiverSpeeds{}, false
		}
		return ReceiverSpeeds{Cores: 4, DecodeBytesPerSec: map[string]float64{
			"none": 1, "s2": 1, "zstd": 1, "bf16": 2, "fp8": 1e15, "int8": 1e15,
		}}, true
	})
	p := prompt(12, 5)
	for _, tc := range []struct {
		codec string
		want  func(codec.Codec) bool
		what  string
	}{
		{CodecAuto, func(c codec.Codec) bool { return c.Name() == "bf16" }, "bf16"},
		{CodecAutoLossy, func(c codec.Codec) bool { return !c.Lossless() }, "a lossy codec"},
	} {
		t.Run(tc.codec, func(t *testing.T) {
			stream, err := w.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: tc.codec, PromptTokens: p, DecodeAddr: addr, Codec: tc.codec})
			if err != nil {
				t.Fatal(err)
			}
			ev, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}
			c, err := codec.ByName(ev.done.GetCodec())
			if err != nil || !tc.want(c) {
				t.Fatalf("chose %q (%v; %s), want %s", ev.done.GetCodec(), err, ev.done.GetCodecReason(), tc.what)
			}
			if got, _ := f.get(tc.codec); got.h.Codec != c.Name() || !got.committed {
				t.Errorf("receiver saw codec %q, committed %v", got.h.Codec, got.committed)
			}
		})
	}
}

// The link measured per address feeds the next choice: after a transfer
// that moved its bytes at 1 MB/s, the best-ratio lossless codec wins (it
// encodes far faster than that), and the reason says the link was
// measured; another address is still unmeasured. A transfer limited by
// the receiver's decoding only raises the estimate.
func TestAutoCodecMeasuresLink(t *testing.T) {
	a := newAutoCodec(engine.BF16)
	const slow = "10.0.0.1:1"
	ch, err := a.start(slow, "none", 0)
	if err != nil || ch != (choice{codec: "none"}) {
		t.Fatalf("start of a named codec: %+v, %v", ch, err)
	}
	a.finish(slow, "none", 8<<20, 8<<20, 8<<20*time.Second/1e6) // 1 MB/s
	if got, n := a.links.Throughput(slow); n != 1 || got < 0.99e6 || got > 1.01e6 {
		t.Fatalf("throughput %v over %d samples, want 1e6 over 1", got, n)
	}
	ch, err = a.start(slow, CodecAuto, 100<<20)
	if err != nil {
		t.Fatal(err)
	}
	a.finish(slow, "", 0, 0, 0) // never opened: not a sample
	sp, _ := a.speeds()
	best := ""
	ratio := 0.0
	for _, c := range sp.Codecs {
		if c.Lossless && c.Ratio > ratio {
			best, ratio = c.Codec, c.Ratio
		}
	}
	if ch.codec != best || !strings.Contains(ch.reason, "measured") || strings.Contains(ch.reason, "assumed") {
		t.Errorf("on a 1 MB/s link: %+v, want %s (ratio %.3g) for a measured link", ch, best, ratio)
	}
	if _, n := a.links.Throughput(slow); n != 1 {
		t.Errorf("a transfer that never opened counted: %d samples", n)
	}
	ch, err = a.start("10.0.0.2:1", CodecAuto, 100<<20)
	if err != nil || !strings.Contains(ch.reason, "assumed") {
		t.Errorf("unmeasured address: %+v, %v", ch, err)
	}
	a.finish("10.0.0.2:1", ch.codec, 0, 0, 0)

	// A receiver that decodes bf16 at 2 MB/s: a bf16 transfer at 1.9 MB/s
	// raw was decode-bound, so its lower wire rate does not lower the link.
	a.setReceivers(func(string) (ReceiverSpeeds, bool) {
		return ReceiverSpeeds{DecodeBytesPerSec: map[string]float64{"bf16": 2e6}}, true
	})
	if _, err := a.start(slow, "bf16", 0); err != nil {
		t.Fatal(err)
	}
	a.finish(slow, "bf16", 1.9e6*8, 1.3e6*8, 8*time.Second)
	if got, n := a.links.Throughput(slow); n != 2 || got < 0.99e6 {
		t.Errorf("after a decode-bound transfer: %v over %d samples, want ≥ 1e6 over 2", got, n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.total != 0 || len(a.inflight) != 0 {
		t.Errorf("transfers still counted: %d, %v", a.total, a.inflight)
	}
}
