package decode

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/engine"
)

// TestCancelRacesFinish: a Cancel comes while a request finishes, in the
// window between the batch's part of its end (the last token out, the
// engine sequence kept by the prefix cache, the batch slot freed) and the
// service's (blocks, caller charge, the cache's pool charge, the call's
// end), which the batch reports afterwards. The test holds the service's
// lock (Server.mu) meanwhile: the batch prefills and decodes the request
// to its end without it, and waits for it only at the report. The Cancel
// is issued before the batch ends the request (it waits for Server.mu,
// queued ahead of the report) or after (queued behind it). Either way the
// finish wins, as a Cancel during the step would see it: the call ends
// with "length" and every token, and nothing of the request is left:
// every pool block is free or charged to the prefix cache, whose entries
// are unpinned, and no caller is charged.
func TestCancelRacesFinish(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	ctx := testCtx(t)
	total := w.s.Stats().KVBlocksTotal
	found := 0
	for i := range 12 {
		if raceFinish(ctx, t, w, i) {
			found++
		}
	}
	t.Logf("%d of 12 Cancels found the request still live", found)
	poll.WaitFor(t, "every request ended", func() bool {
		st := w.s.Stats()
		return st.Requests == 0 && st.Running == 0 && st.Waiting == 0
	})
	if st := w.s.Stats(); st.KVBlocksFree != total || st.PrefixCache.Entries == 0 {
		t.Errorf("%d blocks free (unpinned cache entries counted), %d cache entries; want %d, some", st.KVBlocksFree, st.PrefixCache.Entries, total)
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if n := w.s.pool.Free() + len(w.s.cacheBlocks); n != total {
		t.Errorf("%d pool blocks free and %d charged to the prefix cache, want %d in all", w.s.pool.Free(), len(w.s.cacheBlocks), total)
	}
	if want := w.s.pool.BlocksFor(w.s.cache.Tokens()); len(w.s.cacheBlocks) != want {
		t.Errorf("%d blocks charged to the prefix cache, its tokens need %d", len(w.s.cacheBlocks), want)
	}
	if len(w.s.callers) != 0 {
		t.Errorf("callers still charged: %v", w.s.callers)
	}
}

// raceFinish runs TestCancelRacesFinish's round i and reports whether its
// Cancel found the request still live. The locks it holds meanwhile (the
// engine's, then Server.mu) are released by defers, so that a failed wait
// does not leave the worker's cleanup waiting for them.
func raceFinish(ctx context.Context, t *testing.T, w *testWorker, i int) bool {
	t.Helper()
	id := fmt.Sprintf("r%d", i)
	p := prompt(20, int32(i+1)) // a full block, kept by the prefix cache
	want := reference(t, p, 4, engine.Sampling{})
	// The batch starts no step until the test holds mu: the request
	// cannot end before the test sees it handed to the batch.
	w.s.b.LockEngine()
	engineHeld := true
	defer func() {
		if engineHeld {
			w.s.b.UnlockEngine()
		}
	}()
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: 4, IgnoreEos: true, LocalPrefill: true})
	if err != nil {
		t.Fatal(err)
	}
	// Handed, not just attached: the call claims the request under mu
	// (attached) and posts its Join under mu again, after the KV
	// receiver took the claim. Taking mu in between kept the Join from
	// being posted while the test waited for the batch to end the
	// request (under load, the call's goroutine is often preempted
	// there).
	var q *sequence
	poll.WaitFor(t, "generate handed to the batch", func() bool {
		w.s.mu.Lock()
		defer w.s.mu.Unlock()
		q = w.s.seqs[id]
		return q != nil && q.handed
	})
	cancelled := make(chan bool, 1)
	cancel := func() { cancelled <- w.s.CancelRequest(id) }
	func() {
		w.s.mu.Lock()
		defer w.s.mu.Unlock()
		w.s.b.UnlockEngine()
		engineHeld = false
		before := i%2 == 0
		if before {
			go cancel()
		}
		poll.WaitFor(t, "the batch ended the request", func() bool {
			return w.s.b.Load().Ended == uint64(i+1)
		})
		if q.done {
			t.Errorf("%s: the service ended the request while the test held its lock", id)
		}
		if !before {
			go cancel()
		}
	}()
	found := <-cancelled
	got, err := collect(stream)
	if err != nil || got.reason != FinishLength {
		t.Errorf("%s: finish %q, %v; want %q (the finish wins over the Cancel)", id, got.reason, err, FinishLength)
	}
	if diff := cmp.Diff(want, got.tokens); diff != "" {
		t.Errorf("%s: tokens (-engine alone +worker):\n%s", id, diff)
	}
	return found
}
