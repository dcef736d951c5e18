package prefill

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/wire"
)

// admit sends Prefill calls for ids with prompts of n tokens to a worker
// whose scheduler does not run, and returns each call's status code: OK
// once it was queued, or the code it was refused with.
func admit(t *testing.T, w *testWorker, addr string, n int, ids ...string) []codes.Code {
	t.Helper()
	var got []codes.Code
	for _, id := range ids {
		stream, err := w.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: id, PromptTokens: prompt(n, 1), DecodeAddr: addr})
		if err == nil {
			_, err = stream.Recv() // PrefillQueued, or the refusal
		}
		got = append(got, status.Code(err))
	}
	return got
}

// Under overload the queue must refuse early rather than grow: requests
// beyond what the retention bound lets run at once wait in the queue, and
// once their KV reaches MaxLiveKVBytes more requests are refused at once
// with RESOURCE_EXHAUSTED (the coordinator's 429). Before this bound every
// request up to MaxLivePrefills was queued, and at full KV size (hundreds of MB
// a prompt) they waited tens of seconds, until the decode worker gave up
// on them.
func TestQueueBoundedByLiveKV(t *testing.T) {
	spec := newEngine(t).Spec()
	one := int64(10 * spec.Layers * spec.KVTokenBytes()) // KV of a 10-token prompt
	ok, full := codes.OK, codes.ResourceExhausted
	tests := []struct {
		name    string
		retain  int64
		maxLive int64
		tokens  int
		want    []codes.Code
	}{
		// Default: as much waiting as may run (2 × RetainBytes).
		{"default bound", 2 * one, 0, 10, []codes.Code{ok, ok, ok, ok, full, full}},
		{"explicit bound", 2 * one, 3 * one, 10, []codes.Code{ok, ok, ok, full}},
		// One request alone is admitted whatever its size.
		{"lone oversize request", one, 0, 30, []codes.Code{ok, full}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveReceiver(t, &fakeReceiver{})
			o := smallOptions()
			o.RetainBytes, o.MaxLiveKVBytes = tc.retain, tc.maxLive
			w := newWorker(t, o, false)
			var ids []string
			for i := range tc.want {
				ids = append(ids, fmt.Sprint("r", i))
			}
			if diff := cmp.Diff(tc.want, admit(t, w, addr, tc.tokens, ids...)); diff != "" {
				t.Errorf("admission (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("room again once a request ends", func(t *testing.T) {
		addr := serveReceiver(t, &fakeReceiver{})
		o := smallOptions()
		o.RetainBytes = one
		w := newWorker(t, o, false)
		if diff := cmp.Diff([]codes.Code{ok, ok, full}, admit(t, w, addr, 10, "a", "b", "c")); diff != "" {
			t.Fatalf("admission (-want +got):\n%s", diff)
		}
		if !w.s.Cancel("a") {
			t.Fatal("request a is not live")
		}
		if diff := cmp.Diff([]codes.Code{ok}, admit(t, w, addr, 10, "c")); diff != "" {
			t.Errorf("admission after a cancel (-want +got):\n%s", diff)
		}
	})
}

// scaledEngine is an engine that hands out a scaled-down KV payload and
// says so, as the performance-model engine does.
type scaledEngine struct {
	engine.Engine
	tokenBytes int
}

func (e scaledEngine) KVTokenBytes() int { return e.tokenBytes }

// The queue's KV bound counts the bytes the engine really hands out, from
// the first request on: an engine that ships a quarter of the model's KV
// gets four times as many requests queued as the model's size would allow.
func TestQueueBoundCountsEnginePayload(t *testing.T) {
	e := newEngine(t)
	spec := e.Spec()
	scaled := scaledEngine{Engine: e, tokenBytes: spec.KVTokenBytes() / 4}
	addr := serveReceiver(t, &fakeReceiver{})
	o := smallOptions()
	o.MaxLivePrefills = 16
	o.RetainBytes = int64(10 * spec.Layers * spec.KVTokenBytes()) // one 10-token prompt at the model's size
	w := newWorkerOn(t, scaled, o, false)
	var ids []string
	want := make([]codes.Code, 9)
	for i := range want {
		ids = append(ids, fmt.Sprint("r", i))
	}
	want[8] = codes.ResourceExhausted // 2 × RetainBytes = 8 scaled prompts
	if diff := cmp.Diff(want, admit(t, w, addr, 10, ids...)); diff != "" {
		t.Errorf("admission (-want +got):\n%s", diff)
	}
}

// A failed KV transfer is marked as such, so the coordinator recovers on
// another decode worker; the prefill worker's own refusals are not.
func TestTransferErrorsAreMarked(t *testing.T) {
	refuse := &fakeReceiver{begin: func(h kvtransfer.StreamHeader) error {
		return status.Errorf(codes.FailedPrecondition, "no reservation for %s", h.RequestID)
	}}
	bad, good := serveReceiver(t, refuse), serveReceiver(t, &fakeReceiver{})
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)

	stream, err := w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "refused", PromptTokens: prompt(20, 1), DecodeAddr: bad})
	if err != nil {
		t.Fatal(err)
	}
	_, err = collect(stream)
	if status.Code(err) != codes.FailedPrecondition || !wire.IsKVTransferFailed(err) {
		t.Errorf("prefill to a worker that refuses the kv: %v (marked %v), want a marked FAILED_PRECONDITION", err, wire.IsKVTransferFailed(err))
	}

	stream, err = w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "ok", PromptTokens: prompt(20, 1), DecodeAddr: good})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(stream); err != nil {
		t.Fatal(err)
	}
	_, err = w.client.Resend(ctx, &pdservev1.ResendRequest{RequestId: "ok", DecodeAddr: bad})
	if status.Code(err) != codes.FailedPrecondition || !wire.IsKVTransferFailed(err) {
		t.Errorf("resend to a worker that refuses the kv: %v (marked %v), want a marked FAILED_PRECONDITION", err, wire.IsKVTransferFailed(err))
	}
	_, err = w.client.Resend(ctx, &pdservev1.ResendRequest{RequestId: "never", DecodeAddr: good})
	if status.Code(err) != codes.NotFound || wire.IsKVTransferFailed(err) {
		t.Errorf("resend of unknown kv: %v (marked %v), want an unmarked NOT_FOUND", err, wire.IsKVTransferFailed(err))
	}
	if wire.IsKVTransferFailed(fmt.Errorf("wrapped: %w", status.Error(codes.Unavailable, "prefill: worker stopping"))) {
		t.Error("a plain status is marked")
	}
}
