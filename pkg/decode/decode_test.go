package decode

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/wire"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// pushKV prefills p on an engine of its own and sends its KV and first
// token to the worker at addr, as a prefill worker would, in chunks of
// chunk tokens. It returns the first token.
func pushKV(t *testing.T, addr, id string, p []int32, chunk int) int32 {
	t.Helper()
	return pushKVLogprob(t, addr, id, p, chunk, nil)
}

// pushKVLogprob is pushKV committing with the first token's
// log-probability lp.
func pushKVLogprob(t *testing.T, addr, id string, p []int32, chunk int, lp *pdservev1.TokenLogprob) int32 {
	t.Helper()
	e := newEngine(t)
	ctx := testCtx(t)
	out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	defer d.Close()
	spec := e.Spec()
	snd, err := d.Open(ctx, addr, kvtransfer.StreamHeader{RequestID: id, Codec: "none", Layers: spec.Layers, Tokens: len(p), TokenBytes: spec.KVTokenBytes(), DType: spec.KVDType})
	if err != nil {
		t.Fatalf("open transfer: %v", err)
	}
	for start := 0; start < len(p); start += chunk {
		end := min(len(p), start+chunk)
		for l := range spec.Layers {
			raw, err := e.ExportKV(1, l, start, end, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := snd.Send(l, start, end, raw, 0); err != nil {
				t.Fatalf("send: %v", err)
			}
		}
	}
	if _, err := snd.Commit(ctx, kvtransfer.Commit{FirstToken: out[0].Token, FirstLogprob: lp}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return out[0].Token
}

func TestColocatedMatchesEngine(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	tests := []struct {
		name     string
		prompt   []int32
		max      int
		sampling *pdservev1.Sampling
	}{
		{"one chunk greedy", prompt(5, 1), 12, nil},
		{"many chunks greedy", prompt(30, 2), 10, nil},
		{"sampled", prompt(19, 3), 10, &pdservev1.Sampling{Temperature: 0.8, TopP: 0.9, Seed: 42}},
		{"one token", prompt(9, 4), 1, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := engine.Sampling{Temperature: tc.sampling.GetTemperature(), TopP: tc.sampling.GetTopP(), Seed: tc.sampling.GetSeed()}
			want := reference(t, tc.prompt, tc.max, s)
			stream, err := w.client.Generate(testCtx(t), &pdservev1.GenerateRequest{
				RequestId: tc.name, PromptTokens: tc.prompt, MaxTokens: int32(tc.max), LocalPrefill: true, IgnoreEos: true, Sampling: tc.sampling,
			})
			if err != nil {
				t.Fatal(err)
			}
			got, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got.tokens); diff != "" {
				t.Errorf("tokens (-engine alone +worker):\n%s", diff)
			}
			if got.reason != FinishLength {
				t.Errorf("finish reason %q, want %q", got.reason, FinishLength)
			}
			for _, s := range []vocab.Stamp{StampPrefillStart, StampPrefillEnd, StampJoined, StampFirstToken, StampLastToken} {
				if got.stamps[wire.StampKind(s)] == 0 {
					t.Errorf("stamp %v missing (have %v)", wire.StampKind(s), got.stamps)
				}
			}
		})
	}
	poll.WaitFor(t, "blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == st.KVBlocksTotal && st.Requests == 0 })
}

func TestRemoteKVMatchesEngine(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	p := prompt(21, 5)
	want := reference(t, p, 9, engine.Sampling{})
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r1", Tokens: int32(len(p) + 9)}); err != nil {
		t.Fatal(err)
	}
	// The KV arrives before Generate, in chunks of 8 tokens.
	first := pushKV(t, w.addr, "r1", p, 8)
	if first != want[0] {
		t.Fatalf("first token %d, engine alone %d", first, want[0])
	}
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "r1", PromptTokens: p, MaxTokens: 9, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := collect(stream)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want[1:], got.tokens); diff != "" {
		t.Errorf("tokens (-engine alone +worker):\n%s", diff)
	}
	for _, s := range []vocab.Stamp{StampKVFirstByte, StampKVDone, StampJoined, StampFirstToken, StampLastToken} {
		if got.stamps[wire.StampKind(s)] == 0 {
			t.Errorf("stamp %v missing (have %v)", wire.StampKind(s), got.stamps)
		}
	}
	poll.WaitFor(t, "blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == st.KVBlocksTotal })
}

func TestGenerateBeforeKV(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	p := prompt(11, 6)
	want := reference(t, p, 6, engine.Sampling{})
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: 17}); err != nil {
		t.Fatal(err)
	}
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "r", PromptTokens: p, MaxTokens: 6, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	poll.WaitFor(t, "generate attached", func() bool {
		w.s.mu.Lock()
		defer w.s.mu.Unlock()
		q := w.s.seqs["r"]
		return q != nil && q.attached
	})
	pushKV(t, w.addr, "r", p, 4)
	got, err := collect(stream)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want[1:], got.tokens); diff != "" {
		t.Errorf("tokens (-engine alone +worker):\n%s", diff)
	}
}

func TestRecoveryStreamsOnlyNewTokens(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	p := prompt(13, 7)
	want := reference(t, p, 10, engine.Sampling{})
	for _, k := range []int{1, 2, 6} {
		t.Run(fmt.Sprintf("remote after %d", k), func(t *testing.T) {
			id := fmt.Sprintf("remote-%d", k)
			if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: 23}); err != nil {
				t.Fatal(err)
			}
			pushKV(t, w.addr, id, p, 5)
			stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: 10, IgnoreEos: true, GeneratedTokens: want[:k]})
			if err != nil {
				t.Fatal(err)
			}
			got, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want[k:], got.tokens); diff != "" {
				t.Errorf("tokens after %d generated (-engine alone +worker):\n%s", k, diff)
			}
		})
		t.Run(fmt.Sprintf("local after %d", k), func(t *testing.T) {
			stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: fmt.Sprintf("local-%d", k), PromptTokens: p, MaxTokens: 10, IgnoreEos: true, LocalPrefill: true, GeneratedTokens: want[:k]})
			if err != nil {
				t.Fatal(err)
			}
			got, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want[k:], got.tokens); diff != "" {
				t.Errorf("tokens after %d generated (-engine alone +worker):\n%s", k, diff)
			}
		})
	}
}

func TestStopTokens(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	p := prompt(8, 8)
	want := reference(t, p, 12, engine.Sampling{})
	stop := want[4]
	n := 1 + slicesIndex(want, stop) // the first occurrence ends it
	stream, err := w.client.Generate(testCtx(t), &pdservev1.GenerateRequest{
		RequestId: "s", PromptTokens: p, MaxTokens: 12, LocalPrefill: true, IgnoreEos: true, StopTokens: []int32{stop},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := collect(stream)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want[:n], got.tokens); diff != "" {
		t.Errorf("tokens (-want +got):\n%s", diff)
	}
	if got.reason != FinishStop {
		t.Errorf("finish reason %q, want %q", got.reason, FinishStop)
	}
}

func slicesIndex(s []int32, v int32) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestContinuousBatching(t *testing.T) {
	// The scheduler starts only once every request waits, so the first
	// step holds all of them whatever the timing.
	o := smallOptions()
	o.MaxBatchTokens = 64
	w := newWorker(t, o, false)
	const n = 4
	var wg sync.WaitGroup
	results := make([]result, n)
	errs := make([]error, n)
	wants := make([][]int32, n)
	for i := range n {
		p := prompt(6+i, int32(10+i))
		wants[i] = reference(t, p, 8, engine.Sampling{})
		stream, err := w.client.Generate(testCtx(t), &pdservev1.GenerateRequest{
			RequestId: fmt.Sprint("b", i), PromptTokens: p, MaxTokens: 8, LocalPrefill: true, IgnoreEos: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = collect(stream)
		}()
	}
	poll.WaitFor(t, "all requests waiting", func() bool { return w.s.Stats().Waiting == n })
	w.run()
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if diff := cmp.Diff(wants[i], results[i].tokens); diff != "" {
			t.Errorf("request %d tokens (-engine alone +batched):\n%s", i, diff)
		}
		if results[i].batches[0] != n {
			t.Errorf("request %d: first token's batch size %d, want %d (batches %v)", i, results[i].batches[0], n, results[i].batches)
		}
	}
}

func TestCancelFreesEverything(t *testing.T) {
	o := smallOptions()
	w := newWorker(t, o, true)
	ctx := testCtx(t)
	total := w.s.Stats().KVBlocksTotal

	t.Run("cancel rpc", func(t *testing.T) {
		stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "c1", PromptTokens: prompt(10, 1), MaxTokens: 500, LocalPrefill: true, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
		if _, err := w.client.Cancel(ctx, &pdservev1.CancelRequest{RequestId: "c1"}); err != nil {
			t.Fatal(err)
		}
		_, err = collect(stream)
		if status.Code(err) != codes.Canceled {
			t.Errorf("stream ended with %v, want CANCELED", err)
		}
	})
	t.Run("cancel stream", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		stream, err := w.client.Generate(cctx, &pdservev1.GenerateRequest{RequestId: "c2", PromptTokens: prompt(10, 2), MaxTokens: 500, LocalPrefill: true, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
		cancel()
		poll.WaitFor(t, "request gone", func() bool { return w.s.Stats().Requests == 0 })
	})
	t.Run("cancel reservation", func(t *testing.T) {
		if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "c3", Tokens: 100}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.client.Cancel(ctx, &pdservev1.CancelRequest{RequestId: "c3"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("cancel unknown", func(t *testing.T) {
		if _, err := w.client.Cancel(ctx, &pdservev1.CancelRequest{RequestId: "nobody"}); err != nil {
			t.Errorf("cancel of an unknown id: %v", err)
		}
	})
	poll.WaitFor(t, "all blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == total && st.Requests == 0 && st.Running == 0 })
}

func TestReserve(t *testing.T) {
	o := smallOptions()
	o.KVBlocks = 4
	var ft fakeTimers // the TTL passes when the test says, not when a loaded machine lets it
	w := newWorker(t, o, true, ft.install)
	ctx := testCtx(t)
	resp, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "a", Tokens: 40})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int32{3, 1}, []int32{resp.GetBlocks(), resp.GetBlocksFree()}); diff != "" {
		t.Errorf("blocks, free (-want +got):\n%s", diff)
	}
	_, err = w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "b", Tokens: 20})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("reserve over capacity: %v, want RESOURCE_EXHAUSTED", err)
	}
	_, err = w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "a", Tokens: 1})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("second reservation of an id: %v, want ALREADY_EXISTS", err)
	}
	// Generate without reservation while the pool is full.
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "c", PromptTokens: prompt(30, 1), MaxTokens: 10, LocalPrefill: true})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("generate over capacity: %v, want RESOURCE_EXHAUSTED", err)
	}
	// Nobody claims "a": its TTL gives the blocks back.
	if n := ft.fire(); n != 1 {
		t.Fatalf("%d reservation timers fired, want 1", n)
	}
	poll.WaitFor(t, "reservation expiry", func() bool { return w.s.Stats().KVBlocksFree == 4 })

	// A Generate call waiting for KV that never comes waits until its
	// caller gives up (TestKVWaitOutlivesReserveTTL: the TTL does not
	// end it), and then frees everything.
	gctx, cancel := context.WithCancel(ctx)
	stream, err = w.client.Generate(gctx, &pdservev1.GenerateRequest{RequestId: "w", PromptTokens: prompt(5, 1), MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	poll.WaitFor(t, "generate attached", func() bool {
		w.s.mu.Lock()
		defer w.s.mu.Unlock()
		return w.s.seqs["w"] != nil && w.s.seqs["w"].attached
	})
	cancel()
	if _, err := collect(stream); status.Code(err) != codes.Canceled {
		t.Errorf("generate without kv, cancelled: %v, want CANCELED", err)
	}
	poll.WaitFor(t, "blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == 4 && st.Requests == 0 })
}

// A Generate call waiting for remote KV has no timeout of its own. Under
// overload a prompt queues at the prefill worker for longer than
// ReserveTTL while both workers are healthy; a KV wait bounded by the TTL
// ended such calls with "no kv arrived within 30s", dropped their
// reservations, and the prefill worker's transfer then failed with "no
// reservation". The TTL passing any number of times must not end the call;
// the KV arriving later is served.
func TestKVWaitOutlivesReserveTTL(t *testing.T) {
	var ft fakeTimers
	w := newWorker(t, smallOptions(), true, ft.install)
	ctx := testCtx(t)
	p := prompt(11, 3)
	want := reference(t, p, 5, engine.Sampling{})
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "queued", Tokens: int32(len(p) + 5)}); err != nil {
		t.Fatal(err)
	}
	if n := ft.armed(); n != 1 {
		t.Fatalf("%d reservation timers armed, want 1", n)
	}
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "queued", PromptTokens: p, MaxTokens: 5, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	poll.WaitFor(t, "generate attached", func() bool {
		w.s.mu.Lock()
		defer w.s.mu.Unlock()
		q := w.s.seqs["queued"]
		return q != nil && q.attached
	})
	for range 3 {
		ft.fire() // the TTL passes while the prompt waits in a prefill queue
	}
	if n := ft.armed(); n != 0 {
		t.Errorf("%d timers armed for a claimed reservation, want none", n)
	}
	pushKV(t, w.addr, "queued", p, 4)
	got, err := collect(stream)
	if err != nil {
		t.Fatalf("generate whose kv came after the reservation ttl: %v", err)
	}
	if diff := cmp.Diff(want[1:], got.tokens); diff != "" {
		t.Errorf("tokens (-engine alone +worker):\n%s", diff)
	}
	poll.WaitFor(t, "blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == st.KVBlocksTotal && st.Requests == 0 })
}

// KV that arrives slowly (a big payload, or a transfer paced to a link's
// bandwidth) for a reservation no Generate call has claimed yet keeps the
// reservation past its TTL: the TTL detects a coordinator that went away,
// not a slow transfer. Without a transfer, the TTL still releases an
// unclaimed reservation.
func TestSlowTransferKeepsReservation(t *testing.T) {
	var ft fakeTimers
	w := newWorker(t, smallOptions(), true, ft.install)
	ctx := testCtx(t)
	p := prompt(12, 4)
	want := reference(t, p, 5, engine.Sampling{})
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "slow", Tokens: int32(len(p) + 5)}); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t)
	out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := e.Spec()
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	defer d.Close()
	snd, err := d.Open(ctx, w.addr, kvtransfer.StreamHeader{RequestID: "slow", Codec: "none", Layers: spec.Layers, Tokens: len(p), TokenBytes: spec.KVTokenBytes(), DType: spec.KVDType})
	if err != nil {
		t.Fatal(err)
	}
	send := func(start, end int) {
		t.Helper()
		for l := range spec.Layers {
			raw, err := e.ExportKV(1, l, start, end, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := snd.Send(l, start, end, raw, 0); err != nil {
				t.Fatalf("send layer %d [%d, %d): %v", l, start, end, err)
			}
		}
	}
	send(0, 6)
	poll.WaitFor(t, "first kv imported", func() bool {
		w.s.mu.Lock()
		q := w.s.seqs["slow"]
		w.s.mu.Unlock()
		if q == nil {
			return false
		}
		w.s.rx.mu.Lock()
		defer w.s.rx.mu.Unlock()
		return !q.firstByte.IsZero()
	})
	if n := w.s.Stats().KVTransfers; n != 1 {
		t.Errorf("Stats().KVTransfers mid-transfer = %d, want 1", n)
	}
	for i := range 3 {
		if n := ft.fire(); n != 1 {
			t.Fatalf("ttl %d: %d timers fired, want the reservation's", i, n)
		}
	}
	send(6, len(p))
	if _, err := snd.Commit(ctx, kvtransfer.Commit{FirstToken: out[0].Token}); err != nil {
		t.Fatalf("commit after the reservation's ttl passed during the transfer: %v", err)
	}
	if n := w.s.Stats().KVTransfers; n != 0 {
		t.Errorf("Stats().KVTransfers after the commit = %d, want 0", n)
	}
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "slow", PromptTokens: p, MaxTokens: 5, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := collect(stream)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want[1:], got.tokens); diff != "" {
		t.Errorf("tokens (-engine alone +worker):\n%s", diff)
	}

	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "idle", Tokens: 8}); err != nil {
		t.Fatal(err)
	}
	if n := ft.fire(); n != 1 {
		t.Fatalf("%d timers fired, want the idle reservation's", n)
	}
	poll.WaitFor(t, "blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == st.KVBlocksTotal && st.Requests == 0 })
	if ft.armed() != 0 {
		t.Errorf("%d timers still armed", ft.armed())
	}
}

func TestTransferChecksReservation(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	defer d.Close()
	spec := w.s.spec
	hdr := func(id string, tokens int) kvtransfer.StreamHeader {
		return kvtransfer.StreamHeader{RequestID: id, Codec: "none", Layers: spec.Layers, Tokens: tokens, TokenBytes: spec.KVTokenBytes(), DType: spec.KVDType}
	}
	if _, err := d.Open(ctx, w.addr, hdr("none", 4)); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("open without reservation: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "small", Tokens: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Open(ctx, w.addr, hdr("small", 17)); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("open beyond reservation: %v, want RESOURCE_EXHAUSTED", err)
	}
	// An aborted transfer frees the engine sequence; a Generate waiting
	// for it, or coming after it, ends with ABORTED and gives the blocks
	// back.
	for _, generateFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("generate first %v", generateFirst), func(t *testing.T) {
			id := fmt.Sprint("abort-", generateFirst)
			if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: 10}); err != nil {
				t.Fatal(err)
			}
			generate := func() grpc.ServerStreamingClient[pdservev1.GenerateResponse] {
				stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: prompt(6, 1), MaxTokens: 4})
				if err != nil {
					t.Fatal(err)
				}
				return stream
			}
			var stream grpc.ServerStreamingClient[pdservev1.GenerateResponse]
			if generateFirst {
				stream = generate()
				poll.WaitFor(t, "generate attached", func() bool {
					w.s.mu.Lock()
					defer w.s.mu.Unlock()
					return w.s.seqs[id] != nil && w.s.seqs[id].attached
				})
			}
			snd, err := d.Open(ctx, w.addr, hdr(id, 6))
			if err != nil {
				t.Fatal(err)
			}
			snd.Abort(fmt.Errorf("prefill gave up"))
			if !generateFirst {
				poll.WaitFor(t, "transfer aborted", func() bool {
					w.s.mu.Lock()
					q := w.s.seqs[id]
					w.s.mu.Unlock()
					if q == nil {
						return false
					}
					w.s.rx.mu.Lock()
					defer w.s.rx.mu.Unlock()
					return q.xferErr != nil
				})
				stream = generate()
			}
			if _, err := collect(stream); status.Code(err) != codes.Aborted {
				t.Errorf("generate with an aborted transfer: %v, want ABORTED", err)
			}
		})
	}
	if _, err := w.client.Cancel(ctx, &pdservev1.CancelRequest{RequestId: "small"}); err != nil {
		t.Fatal(err)
	}
	poll.WaitFor(t, "blocks free", func() bool { st := w.s.Stats(); return st.KVBlocksFree == st.KVBlocksTotal })
}

func TestBadRequests(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	long := make([]int32, 1000)
	tests := []struct {
		name string
		req  *pdservev1.GenerateRequest
	}{
		{"no id", &pdservev1.GenerateRequest{PromptTokens: []int32{1}, MaxTokens: 1}},
		{"no prompt", &pdservev1.GenerateRequest{RequestId: "x", MaxTokens: 1}},
		{"zero max tokens", &pdservev1.GenerateRequest{RequestId: "x", PromptTokens: []int32{1}}},
		{"token out of vocabulary", &pdservev1.GenerateRequest{RequestId: "x", PromptTokens: []int32{1, 99999}, MaxTokens: 1}},
		{"negative token", &pdservev1.GenerateRequest{RequestId: "x", PromptTokens: []int32{-1}, MaxTokens: 1}},
		{"too long", &pdservev1.GenerateRequest{RequestId: "x", PromptTokens: long, MaxTokens: 100}},
		{"negative temperature", &pdservev1.GenerateRequest{RequestId: "x", PromptTokens: []int32{1}, MaxTokens: 1, Sampling: &pdservev1.Sampling{Temperature: -1}}},
		{"top p above 1", &pdservev1.GenerateRequest{RequestId: "x", PromptTokens: []int32{1}, MaxTokens: 1, Sampling: &pdservev1.Sampling{TopP: 1.5}}},
		{"all generated", &pdservev1.GenerateRequest{RequestId: "x", PromptTokens: []int32{1}, MaxTokens: 2, GeneratedTokens: []int32{3, 4}}},
		{"bad stop token", &pdservev1.GenerateRequest{RequestId: "x", PromptTokens: []int32{1}, MaxTokens: 2, StopTokens: []int32{-5}}},
		{"unknown priority", &pdservev1.GenerateRequest{RequestId: "x", PromptTokens: []int32{1}, MaxTokens: 2, LocalPrefill: true, Priority: 99}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := w.client.Generate(ctx, tc.req)
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
		req  *pdservev1.ReserveRequest
	}{
		{"reserve no id", &pdservev1.ReserveRequest{Tokens: 4}},
		{"reserve zero tokens", &pdservev1.ReserveRequest{RequestId: "x"}},
		{"reserve beyond max seq len", &pdservev1.ReserveRequest{RequestId: "x", Tokens: 5000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := w.client.Reserve(ctx, tc.req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("got %v, want INVALID_ARGUMENT", err)
			}
		})
	}
	if _, err := w.client.Cancel(ctx, &pdservev1.CancelRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("cancel without id: %v, want INVALID_ARGUMENT", err)
	}
	if st := w.s.Stats(); st.KVBlocksFree != st.KVBlocksTotal || st.Requests != 0 {
		t.Errorf("after bad requests: %+v, want every block free and no request", st)
	}
}

func TestDrainingRejectsNewWork(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "kept", Tokens: 20}); err != nil {
		t.Fatal(err)
	}
	w.s.SetDraining(true)
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "new", Tokens: 20}); status.Code(err) != codes.Unavailable {
		t.Errorf("reserve while draining: %v, want UNAVAILABLE", err)
	}
	// A reserved request still runs.
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "kept", PromptTokens: prompt(5, 1), MaxTokens: 3, LocalPrefill: true, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := collect(stream)
	if err != nil || len(got.tokens) != 3 {
		t.Errorf("reserved request while draining: %d tokens, %v; want 3 tokens", len(got.tokens), err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.s.WaitIdle(wctx); err != nil {
		t.Errorf("WaitIdle: %v", err)
	}
}

// A Reserve the worker takes after its caller gave up (the worker was
// stopped, or slow to take the call) reserves nothing: the reservation
// would hold its blocks until the TTL for a Generate that never comes.
func TestReserveAfterCallerGaveUp(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	for _, tc := range []struct {
		name string
		ctx  func() context.Context
		want codes.Code
	}{
		{"deadline passed", func() context.Context {
			ctx, cancel := context.WithDeadline(testCtx(t), time.Now().Add(-time.Second))
			t.Cleanup(cancel)
			return ctx
		}, codes.DeadlineExceeded},
		{"cancelled", func() context.Context {
			ctx, cancel := context.WithCancel(testCtx(t))
			cancel()
			return ctx
		}, codes.Canceled},
	} {
		_, err := w.s.Reserve(tc.ctx(), &pdservev1.ReserveRequest{RequestId: tc.name, Tokens: 40})
		if status.Code(err) != tc.want {
			t.Errorf("%s: Reserve = %v, want %v", tc.name, err, tc.want)
		}
	}
	if st := w.s.Stats(); st.Requests != 0 || st.KVBlocksFree != st.KVBlocksTotal {
		t.Errorf("after the late reserves: %d requests, %d of %d blocks free; want none held", st.Requests, st.KVBlocksFree, st.KVBlocksTotal)
	}
}
