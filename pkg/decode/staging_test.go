package decode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/wire"
)

// gatedEngine wraps an engine: once armed, Decode blocks (after reporting
// on entered) until open is called, and ImportKV calls are counted. It
// hides the inner engine's Stepper, so steps go through Decode. Safe for
// concurrent use.
type gatedEngine struct {
	engine.Engine
	entered chan struct{} // capacity 1: a Decode is blocked at the gate
	release chan struct{} // closed by open

	mu      sync.Mutex
	armed   bool
	opened  bool
	imports int
}

func newGatedEngine(t *testing.T) *gatedEngine {
	return &gatedEngine{Engine: newEngine(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
}

// arm makes the next Decode calls block until open.
func (g *gatedEngine) arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = true
}

// open lets blocked and later Decode calls run. Idempotent.
func (g *gatedEngine) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.opened {
		g.opened = true
		close(g.release)
	}
}

func (g *gatedEngine) importCalls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.imports
}

// Decode implements engine.Engine.
func (g *gatedEngine) Decode(ctx context.Context, batch []engine.DecodeItem) ([]engine.Output, error) {
	g.mu.Lock()
	armed := g.armed
	g.mu.Unlock()
	if armed {
		select {
		case g.entered <- struct{}{}:
		default:
		}
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Engine.Decode(ctx, batch)
}

// ImportKV implements engine.Engine.
func (g *gatedEngine) ImportKV(seq engine.SeqID, layer, start int, data []byte) error {
	g.mu.Lock()
	g.imports++
	g.mu.Unlock()
	return g.Engine.ImportKV(seq, layer, start, data)
}

// TestKVArrivesDuringStep: a whole transfer is received and acknowledged
// while a decode step is blocked in the engine; the sequence joins after
// the step and decodes as the engine alone does.
func TestKVArrivesDuringStep(t *testing.T) {
	g := newGatedEngine(t)
	w := newWorkerOn(t, g, smallOptions(), true)
	t.Cleanup(g.open) // runs before the worker's cleanup
	ctx := testCtx(t)

	pa, pb := prompt(9, 1), prompt(13, 2)
	wantA, wantB := reference(t, pa, 4, engine.Sampling{}), reference(t, pb, 5, engine.Sampling{})
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "a", Tokens: int32(len(pa) + 4)}); err != nil {
		t.Fatal(err)
	}
	pushKV(t, w.addr, "a", pa, 4)
	g.arm()
	streamA, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "a", PromptTokens: pa, MaxTokens: 4, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.entered:
	case <-ctx.Done():
		t.Fatal("no decode step reached the engine")
	}

	// The scheduler is inside a step now, and stays there until open.
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "b", Tokens: int32(len(pb) + 5)}); err != nil {
		t.Fatal(err)
	}
	imports := g.importCalls()
	pushKV(t, w.addr, "b", pb, 4) // returns once the worker acknowledged the KV
	st := w.s.Stats()
	if st.StagedKVBytes <= 0 {
		t.Errorf("after the ack, %d bytes staged, want the transfer's", st.StagedKVBytes)
	}
	if n := g.importCalls(); n != imports {
		t.Errorf("%d ImportKV calls during the blocked step, want none", n-imports)
	}
	streamB, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "b", PromptTokens: pb, MaxTokens: 5, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	g.open()

	for _, c := range []struct {
		name   string
		stream func() (result, error)
		want   []int32
	}{
		{"a", func() (result, error) { return collect(streamA) }, wantA},
		{"b", func() (result, error) { return collect(streamB) }, wantB},
	} {
		got, err := c.stream()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if diff := cmp.Diff(c.want[1:], got.tokens); diff != "" {
			t.Errorf("%s: tokens (-engine alone +worker):\n%s", c.name, diff)
		}
		fb, done, joined := got.stamps[wire.StampKind(StampKVFirstByte)], got.stamps[wire.StampKind(StampKVDone)], got.stamps[wire.StampKind(StampJoined)]
		if fb == 0 || fb > done || done > joined {
			t.Errorf("%s: stamps kv_first_byte %d, kv_done %d, decode_joined %d: want 0 < first byte <= done <= joined", c.name, fb, done, joined)
		}
	}
	poll.WaitFor(t, "everything freed", func() bool {
		st := w.s.Stats()
		return st.KVBlocksFree == st.KVBlocksTotal && st.Requests == 0 && st.StagedKVBytes == 0
	})
}

// TestCancelDuringStagingFreesEverything: ending a request whose KV is
// staged (arriving, or received and not yet imported) frees the staging
// and the reservation, and nothing reaches the engine.
func TestCancelDuringStagingFreesEverything(t *testing.T) {
	var ft fakeTimers
	g := newGatedEngine(t)
	w := newWorkerOn(t, g, smallOptions(), true, ft.install)
	ctx := testCtx(t)
	total := w.s.Stats().KVBlocksTotal
	p := prompt(12, 3)

	e := newEngine(t)
	out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := e.Spec()
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	defer d.Close()

	for _, c := range []struct {
		name   string
		commit bool            // the whole transfer is acknowledged first
		end    func(id string) // ends the request
	}{
		{
			name: "cancel mid-transfer",
			end:  func(id string) { w.s.CancelRequest(id) },
		},
		{
			name:   "cancel after the ack",
			commit: true,
			end:    func(id string) { w.s.CancelRequest(id) },
		},
		{
			name:   "ttl after the ack",
			commit: true,
			end: func(string) {
				if n := ft.fire(); n != 1 {
					t.Errorf("%d timers fired, want the reservation's", n)
				}
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := c.name
			if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + 4)}); err != nil {
				t.Fatal(err)
			}
			snd, err := d.Open(ctx, w.addr, kvtransfer.StreamHeader{RequestID: id, Codec: "none", Layers: spec.Layers, Tokens: len(p), TokenBytes: spec.KVTokenBytes(), DType: spec.KVDType})
			if err != nil {
				t.Fatal(err)
			}
			send := func(start, end int) error {
				for l := range spec.Layers {
					raw, err := e.ExportKV(1, l, start, end, nil)
					if err != nil {
						t.Fatal(err)
					}
					if err := snd.Send(l, start, end, raw, 0); err != nil {
						return err
					}
				}
				return nil
			}
			if err := send(0, 6); err != nil {
				t.Fatal(err)
			}
			if c.commit {
				if err := send(6, len(p)); err != nil {
					t.Fatal(err)
				}
				if _, err := snd.Commit(ctx, kvtransfer.Commit{FirstToken: out[0].Token}); err != nil {
					t.Fatal(err)
				}
			}
			poll.WaitFor(t, "kv staged", func() bool { return w.s.Stats().StagedKVBytes > 0 })
			c.end(id)
			st := w.s.Stats()
			if st.StagedKVBytes != 0 || st.KVBlocksFree != total || st.Requests != 0 {
				t.Errorf("after the end: %d bytes staged, %d of %d blocks free, %d requests; want 0, all, 0", st.StagedKVBytes, st.KVBlocksFree, total, st.Requests)
			}
			if !c.commit {
				err := send(6, len(p))
				if err == nil {
					_, err = snd.Commit(ctx, kvtransfer.Commit{FirstToken: out[0].Token})
				}
				if status.Code(err) != codes.Aborted {
					t.Errorf("transfer after the cancel ended with %v, want ABORTED", err)
				}
				snd.Abort(nil)
			}
			if st := w.s.Stats(); st.StagedKVBytes != 0 {
				t.Errorf("%d bytes staged after the transfer ended", st.StagedKVBytes)
			}
		})
	}
	if n := g.importCalls(); n != 0 {
		t.Errorf("%d ImportKV calls, want none", n)
	}
}

// TestEndRacesTransferAndJoin: requests end (Cancel, the Generate call
// going away, or the transfer aborting) at every point of their KV's way
// from the receiver to the batch: before the transfer begins, between its
// frames, at its commit, while the runner imports it and admits the
// sequence, and while it decodes. The service, the receiver and the runner
// hand the request over to each other meanwhile, each under its own lock;
// under -race, nothing of any request is left once all ended: every pool
// block is free (cached prompts aside, which are reclaimable), nothing is
// staged, no transfer is open, and the receiver knows no request.
func TestEndRacesTransferAndJoin(t *testing.T) {
	o := smallOptions()
	w := newWorker(t, o, true)
	ctx := testCtx(t)
	total := w.s.Stats().KVBlocksTotal
	p := prompt(12, 5)
	e := newEngine(t)
	out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := e.Spec()
	type frame struct {
		layer, start, end int
		raw               []byte
	}
	var frames []frame
	for _, r := range [][2]int{{0, 4}, {4, 8}, {8, len(p)}} {
		for l := range spec.Layers {
			raw, err := e.ExportKV(1, l, r[0], r[1], nil)
			if err != nil {
				t.Fatal(err)
			}
			frames = append(frames, frame{l, r[0], r[1], raw})
		}
	}
	rcv := receiver{w.s}
	const (
		byCancel = iota
		byCall
		byAbort
		ways
	)
	// at: the end comes after this many frames were written (len(frames):
	// after them all, before the commit; len(frames)+1: after the commit).
	var wg sync.WaitGroup
	for i := range 3 * ways * (len(frames) + 2) {
		how, at := i%ways, (i/ways)%(len(frames)+2)
		id := fmt.Sprintf("r%d", i)
		if i%o.MaxBatch == 0 {
			wg.Wait() // a batch at a time: the pool holds them all
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := w.s.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + 6)}); err != nil {
				t.Errorf("%s: reserve: %v", id, err)
				return
			}
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stream, err := w.client.Generate(cctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: 6, IgnoreEos: true})
			if err != nil {
				t.Errorf("%s: generate: %v", id, err)
				return
			}
			called := make(chan error, 1)
			go func() { _, err := collect(stream); called <- err }()
			end := func() {
				switch how {
				case byCancel:
					w.s.CancelRequest(id)
				case byCall:
					cancel()
				}
			}
			k, err := rcv.Begin(ctx, kvtransfer.StreamHeader{RequestID: id, Codec: "none", Layers: spec.Layers, Tokens: len(p), TokenBytes: spec.KVTokenBytes(), DType: spec.KVDType})
			if err != nil {
				t.Errorf("%s: begin: %v", id, err)
				return
			}
			var ended sync.WaitGroup
			failed := false
			for j, f := range frames {
				if j == at && how != byAbort {
					ended.Add(1)
					go func() { defer ended.Done(); end() }() // races the frames
				}
				if err := k.Write(f.layer, f.start, f.end, f.raw); err != nil {
					if status.Code(err) != codes.Aborted {
						t.Errorf("%s: write: %v, want ABORTED after the end", id, err)
					}
					k.Abort(err)
					failed = true
					break
				}
			}
			commit := func() {
				if err := k.Commit(kvtransfer.Commit{FirstToken: out[0].Token}); err != nil {
					if status.Code(err) != codes.Aborted {
						t.Errorf("%s: commit: %v, want nil or ABORTED", id, err)
					}
					k.Abort(err)
				}
			}
			switch {
			case failed:
			case how == byAbort:
				k.Abort(errors.New("prefill gave up"))
			case at == len(frames):
				ended.Add(1)
				go func() { defer ended.Done(); end() }() // races the commit
				commit()
			default:
				// The end raced the frames, or comes after the commit,
				// racing the import, the admission and the steps.
				commit()
			}
			ended.Wait()
			// The request ends now at the latest: its caller leaves, and
			// it is cancelled (a call the worker saw too late to claim
			// the reservation left it unclaimed; one that came after a
			// Cancel made a reservation of its own, ended as it sees
			// its caller gone).
			end()
			cancel()
			<-called
			w.s.CancelRequest(id)
		}()
	}
	wg.Wait()
	poll.WaitFor(t, "every request ended and freed", func() bool {
		st := w.s.Stats()
		return st.Requests == 0 && st.KVBlocksFree == total && st.StagedKVBytes == 0 && st.KVTransfers == 0 && st.Waiting == 0 && st.Running == 0
	})
	w.s.mu.Lock()
	if n := w.s.pool.Free() + len(w.s.cacheBlocks); n != total {
		t.Errorf("%d pool blocks free and %d charged to the prefix cache, want %d in all", w.s.pool.Free(), len(w.s.cacheBlocks), total)
	}
	if len(w.s.callers) != 0 {
		t.Errorf("callers still charged: %v", w.s.callers)
	}
	w.s.mu.Unlock()
	w.s.rx.mu.Lock()
	if len(w.s.rx.reqs) != 0 {
		t.Errorf("the receiver still knows %d requests", len(w.s.rx.reqs))
	}
	w.s.rx.mu.Unlock()
}
