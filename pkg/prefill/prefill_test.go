package prefill

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

func TestPrefillStreamsKV(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	tests := []struct {
		name   string
		n      int
		chunk  int
		codec  string
		frames int // frames the receiver gets: layers × chunks
	}{
		{"one chunk", 7, 8, "none", 2},
		{"three chunks", 20, 8, "none", 6},
		{"zstd", 20, 8, "zstd", 6},
		{"default codec", 9, 16, "", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := smallOptions()
			o.ChunkTokens = tc.chunk
			w := newWorker(t, o, true)
			p := prompt(tc.n, int32(tc.n))
			first, kv := referenceKV(t, p)
			stream, err := w.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: tc.name, PromptTokens: p, DecodeAddr: addr, Codec: tc.codec})
			if err != nil {
				t.Fatal(err)
			}
			ev, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}
			if ev.queued == nil || ev.first == nil || ev.done == nil {
				t.Fatalf("events %+v: want queued, first token and kv done", ev)
			}
			if ev.first.GetToken() != first {
				t.Errorf("first token %d, engine alone %d", ev.first.GetToken(), first)
			}
			got, _ := f.get(tc.name)
			if !got.committed || got.first != first {
				t.Errorf("receiver: committed %v with first token %d, want committed with %d", got.committed, got.first, first)
			}
			if diff := cmp.Diff(kv, got.layers); diff != "" {
				t.Errorf("kv received differs from the engine's (-engine +received):\n%s", diff)
			}
			if got.frames != tc.frames {
				t.Errorf("frames %d, want %d", got.frames, tc.frames)
			}
			wantCodec := tc.codec
			if wantCodec == "" {
				wantCodec = o.Codec
			}
			raw := int64(len(kv) * len(kv[0]))
			if ev.done.GetBytesRaw() != raw || ev.done.GetCodec() != wantCodec || ev.done.GetBytesWire() <= 0 {
				t.Errorf("kv done %+v: want %d raw bytes with codec %q", ev.done, raw, wantCodec)
			}
			if ev.first.GetPrefillStartUnixNano() == 0 || ev.first.GetPrefillEndUnixNano() < ev.first.GetPrefillStartUnixNano() {
				t.Errorf("prefill stamps %+v", ev.first)
			}
			if st := w.s.Stats(); st.Live != 0 || st.QueuedRequests != 0 || st.RetainedBytes != raw {
				t.Errorf("stats after the request: %+v, want nothing live and %d bytes retained", st, raw)
			}
		})
	}
}

func TestBatchesQueuedRequests(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	o := smallOptions()
	o.MaxBatchTokens = 64
	w := newWorker(t, o, false)
	const n = 3
	var wg sync.WaitGroup
	evs := make([]events, n)
	errs := make([]error, n)
	for i := range n {
		stream, err := w.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: fmt.Sprint("b", i), PromptTokens: prompt(5+i, int32(i)), DecodeAddr: addr})
		if err != nil {
			t.Fatal(err)
		}
		// The queued event comes before the scheduler runs.
		r, err := stream.Recv()
		if err != nil || r.GetQueued() == nil {
			t.Fatalf("first event %v, %v: want queued", r, err)
		}
		if got := r.GetQueued().GetQueuePosition(); got != int32(i) {
			t.Errorf("queue position %d, want %d", got, i)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs[i], errs[i] = collect(stream)
		}()
	}
	if got := w.s.Stats().QueuedPrefillTokens; got != 5+6+7 {
		t.Errorf("queued prefill tokens %d, want %d", got, 5+6+7)
	}
	w.run()
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if got := evs[i].first.GetBatchSize(); got != n {
			t.Errorf("request %d prefilled in a batch of %d, want %d", i, got, n)
		}
		want, kv := referenceKV(t, prompt(5+i, int32(i)))
		got, _ := f.get(fmt.Sprint("b", i))
		if evs[i].first.GetToken() != want {
			t.Errorf("request %d: first token %d, engine alone %d", i, evs[i].first.GetToken(), want)
		}
		if diff := cmp.Diff(kv, got.layers); diff != "" {
			t.Errorf("request %d: batched kv differs (-engine alone +received):\n%s", i, diff)
		}
	}
}

func TestMaxLivePrefills(t *testing.T) {
	addr := serveReceiver(t, &fakeReceiver{})
	o := smallOptions()
	o.MaxLivePrefills = 2
	w := newWorker(t, o, false)
	ctx := testCtx(t)
	for i := range 2 {
		stream, err := w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: fmt.Sprint(i), PromptTokens: prompt(4, 1), DecodeAddr: addr})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "over", PromptTokens: prompt(4, 1), DecodeAddr: addr})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("third request: %v, want RESOURCE_EXHAUSTED", err)
	}
	stream, err = w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "0", PromptTokens: prompt(4, 1), DecodeAddr: addr})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.AlreadyExists && status.Code(err) != codes.ResourceExhausted {
		t.Errorf("live id again: %v, want ALREADY_EXISTS or RESOURCE_EXHAUSTED", err)
	}
}

func TestBadRequests(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	tests := []struct {
		name string
		req  *pdservev1.PrefillRequest
	}{
		{"no id", &pdservev1.PrefillRequest{PromptTokens: []int32{1}, DecodeAddr: "a:1"}},
		{"long id", &pdservev1.PrefillRequest{RequestId: string(make([]byte, 256)), PromptTokens: []int32{1}, DecodeAddr: "a:1"}},
		{"no prompt", &pdservev1.PrefillRequest{RequestId: "x", DecodeAddr: "a:1"}},
		{"prompt too long", &pdservev1.PrefillRequest{RequestId: "x", PromptTokens: make([]int32, 1024), DecodeAddr: "a:1"}},
		{"token out of vocabulary", &pdservev1.PrefillRequest{RequestId: "x", PromptTokens: []int32{4000}, DecodeAddr: "a:1"}},
		{"no decode address", &pdservev1.PrefillRequest{RequestId: "x", PromptTokens: []int32{1}}},
		{"unknown codec", &pdservev1.PrefillRequest{RequestId: "x", PromptTokens: []int32{1}, DecodeAddr: "a:1", Codec: "gzip"}},
		{"negative temperature", &pdservev1.PrefillRequest{RequestId: "x", PromptTokens: []int32{1}, DecodeAddr: "a:1", Sampling: &pdservev1.Sampling{Temperature: -0.5}}},
		{"unknown priority", &pdservev1.PrefillRequest{RequestId: "x", PromptTokens: []int32{1}, DecodeAddr: "a:1", Priority: 99}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := w.client.Prefill(ctx, tc.req)
			if err == nil {
				_, err = stream.Recv()
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("got %v, want INVALID_ARGUMENT", err)
			}
		})
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"resend without id", func() error {
			_, err := w.client.Resend(ctx, &pdservev1.ResendRequest{DecodeAddr: "a:1"})
			return err
		}},
		{"resend without address", func() error {
			_, err := w.client.Resend(ctx, &pdservev1.ResendRequest{RequestId: "x"})
			return err
		}},
		{"release without id", func() error {
			_, err := w.client.Release(ctx, &pdservev1.ReleaseRequest{})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); status.Code(err) != codes.InvalidArgument {
				t.Errorf("got %v, want INVALID_ARGUMENT", err)
			}
		})
	}
	if st := w.s.Stats(); st.Live != 0 {
		t.Errorf("live requests after bad requests: %d", st.Live)
	}
}

func TestCancelQueued(t *testing.T) {
	addr := serveReceiver(t, &fakeReceiver{})
	w := newWorker(t, smallOptions(), false)
	ctx, cancel := context.WithCancel(testCtx(t))
	stream, err := w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "q", PromptTokens: prompt(6, 1), DecodeAddr: addr})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	poll.WaitFor(t, "queue empty", func() bool { st := w.s.Stats(); return st.Live == 0 && st.QueuedRequests == 0 })
	w.run()
}

func TestCancelDuringTransfer(t *testing.T) {
	f := &fakeReceiver{gate: make(chan struct{})}
	addr := serveReceiver(t, f)
	w := newWorker(t, smallOptions(), true)
	ctx, cancel := context.WithCancel(testCtx(t))
	stream, err := w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "c", PromptTokens: prompt(20, 1), DecodeAddr: addr})
	if err != nil {
		t.Fatal(err)
	}
	// The engine is not held up by the stuck transfer: the first token
	// arrives while the receiver holds the first frame.
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.GetFirstToken() != nil {
			break
		}
	}
	// The transfer opened and its first frame is held by the receiver.
	poll.WaitFor(t, "transfer begun", func() bool { _, ok := f.get("c"); return ok })
	cancel()
	poll.WaitFor(t, "transfer aborted", func() bool { r, _ := f.get("c"); return r.aborted })
	poll.WaitFor(t, "request gone", func() bool { st := w.s.Stats(); return st.Live == 0 && st.RetainedBytes == 0 })
	if _, err := w.client.Resend(testCtx(t), &pdservev1.ResendRequest{RequestId: "c", DecodeAddr: addr}); status.Code(err) != codes.NotFound {
		t.Errorf("resend of a cancelled request: %v, want NOT_FOUND", err)
	}
}

func TestTransferErrorReachesCaller(t *testing.T) {
	f := &fakeReceiver{begin: func(h kvtransfer.StreamHeader) error {
		return status.Errorf(codes.FailedPrecondition, "no reservation for %s", h.RequestID)
	}}
	addr := serveReceiver(t, f)
	w := newWorker(t, smallOptions(), true)
	stream, err := w.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: "r", PromptTokens: prompt(20, 1), DecodeAddr: addr})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(stream); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("prefill to a worker without reservation: %v, want FAILED_PRECONDITION", err)
	}
	poll.WaitFor(t, "request gone", func() bool { st := w.s.Stats(); return st.Live == 0 && st.QueuedRequests == 0 })
}

func TestResendAndRelease(t *testing.T) {
	first, second := &fakeReceiver{}, &fakeReceiver{}
	addr1, addr2 := serveReceiver(t, first), serveReceiver(t, second)
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	p := prompt(19, 3)
	stream, err := w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "r", PromptTokens: p, DecodeAddr: addr1})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := collect(stream)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := w.client.Resend(ctx, &pdservev1.ResendRequest{RequestId: "r", DecodeAddr: addr2, Codec: "s2"})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := first.get("r")
	b, _ := second.get("r")
	if diff := cmp.Diff(a.layers, b.layers); diff != "" {
		t.Errorf("re-sent kv differs (-first +second):\n%s", diff)
	}
	if !b.committed || b.first != ev.first.GetToken() {
		t.Errorf("second receiver: committed %v, first token %d; want committed with %d", b.committed, b.first, ev.first.GetToken())
	}
	if resp.GetKvDone().GetBytesRaw() != ev.done.GetBytesRaw() || resp.GetKvDone().GetCodec() != "s2" {
		t.Errorf("resend kv done %+v, want %d raw bytes with codec s2", resp.GetKvDone(), ev.done.GetBytesRaw())
	}
	if _, err := w.client.Release(ctx, &pdservev1.ReleaseRequest{RequestId: "r"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.client.Release(ctx, &pdservev1.ReleaseRequest{RequestId: "unknown"}); err != nil {
		t.Errorf("release of an unknown id: %v", err)
	}
	if _, err := w.client.Resend(ctx, &pdservev1.ResendRequest{RequestId: "r", DecodeAddr: addr2}); status.Code(err) != codes.NotFound {
		t.Errorf("resend after release: %v, want NOT_FOUND", err)
	}
	if st := w.s.Stats(); st.RetainedBytes != 0 {
		t.Errorf("retained bytes after release: %d", st.RetainedBytes)
	}
}
