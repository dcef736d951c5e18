package prefill

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
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
	w.s.SetReceivers(func(a string) (kvtransfer.ReceiverSpeeds, bool) {
		if a != addr {
			return kvtransfer.ReceiverSpeeds{}, false
		}
		return kvtransfer.ReceiverSpeeds{Cores: 4, DecodeBytesPerSec: map[string]float64{
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
