package prefill

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pdserve/pdserve/internal/poll"

	"github.com/google/go-cmp/cmp"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/prefill/batch"
)

func TestRetainStoreLRU(t *testing.T) {
	s := newRetainStore(100)
	done := func(id string, bytes int64) *retained {
		e := s.add(id, nil, bytes)
		e.complete = true
		s.unpin(e, time.Time{})
		return e
	}
	done("a", 30)
	done("b", 30)
	done("c", 30)
	// Using a makes b the least recently used.
	a := s.get("a")
	s.pin(a)
	s.unpin(a, time.Time{})
	if !s.makeRoom(30) {
		t.Fatal("no room for 30 bytes after evicting")
	}
	var ids []string
	for _, id := range []string{"a", "b", "c"} {
		if s.get(id) != nil {
			ids = append(ids, id)
		}
	}
	if diff := cmp.Diff([]string{"a", "c"}, ids); diff != "" {
		t.Errorf("entries after evicting for 30 bytes (-want +got):\n%s", diff)
	}
	if s.total != 60 {
		t.Errorf("total %d, want 60", s.total)
	}
	// Pinned entries stay; a request bigger than what is evictable waits.
	p := s.add("p", nil, 30)
	if s.makeRoom(80) {
		t.Error("room for 80 bytes with 30 pinned and a limit of 100")
	}
	if s.get("p") == nil || s.get("a") != nil || s.get("c") != nil {
		t.Error("want the pinned entry kept and the others evicted")
	}
	// Dropped while pinned: gone at the last unpin.
	s.drop("p")
	if s.total != 30 {
		t.Errorf("total %d after a pinned drop, want 30 (p's bytes until unpinned)", s.total)
	}
	s.unpin(p, time.Time{})
	if s.total != 0 || len(s.m) != 0 {
		t.Errorf("total %d, %d entries after the last unpin; want empty", s.total, len(s.m))
	}
	// Alone, a request bigger than the limit is admitted.
	if !s.makeRoom(500) {
		t.Error("a lone oversize request must be admitted")
	}
}

// TestRetainStoreExpire: unpinned entries idle for the TTL go, oldest
// first; younger and pinned ones stay.
func TestRetainStoreExpire(t *testing.T) {
	t0 := time.Unix(100, 0)
	s := newRetainStore(1000)
	done := func(id string, at time.Duration) {
		e := s.add(id, nil, 10)
		e.complete = true
		s.unpin(e, t0.Add(at))
	}
	done("old", 0)
	done("mid", 5*time.Second)
	done("new", 9*time.Second)
	s.add("pinned", nil, 10)
	if n := s.expire(t0.Add(8*time.Second), 3*time.Second); n != 2 {
		t.Errorf("expire at 8 s, ttl 3 s: %d removed, want 2 (old, mid)", n)
	}
	for id, want := range map[string]bool{"old": false, "mid": false, "new": true, "pinned": true} {
		if got := s.get(id) != nil; got != want {
			t.Errorf("%s kept %v, want %v", id, got, want)
		}
	}
	if s.total != 20 {
		t.Errorf("total %d after expiry, want 20", s.total)
	}
	if n := s.expire(t0.Add(time.Hour), 3*time.Second); n != 1 || s.get("pinned") == nil {
		t.Errorf("expire an hour later: %d removed, pinned kept %v; want 1 and the pinned one kept", n, s.get("pinned") != nil)
	}
}

// TestRetainedKVExpiresWithoutRelease: a finished request's KV that no
// Release reaches (its coordinator died) is dropped after RetainTTL, and a
// Resend then finds nothing.
func TestRetainedKVExpiresWithoutRelease(t *testing.T) {
	recv := &fakeReceiver{}
	addr := serveReceiver(t, recv)
	o := smallOptions()
	o.RetainTTL = 200 * time.Millisecond
	w := newWorker(t, o, true)
	ctx := testCtx(t)
	stream, err := w.client.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "orphan", PromptTokens: prompt(9, 1), DecodeAddr: addr})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(stream); err != nil {
		t.Fatal(err)
	}
	if st := w.s.Stats(); st.RetainedBytes == 0 {
		t.Fatal("no KV retained after the prefill")
	}
	poll.WaitFor(t, "retained KV expired", func() bool { return w.s.Stats().RetainedBytes == 0 })
	if _, err := w.client.Resend(ctx, &pdservev1.ResendRequest{RequestId: "orphan", DecodeAddr: addr}); status.Code(err) != codes.NotFound {
		t.Errorf("resend after expiry: %v, want NOT_FOUND", err)
	}
}

// TestAdmissionWaitsForRetentionRoom: the batch asks the service to start
// a request (Outbox.Start) only once the engine holds it; the service
// then says Wait while the retention bound has no room for its KV. Fails
// if Start ignores the bound (makeRoom).
func TestAdmissionWaitsForRetentionRoom(t *testing.T) {
	o := smallOptions()
	o.MaxBatchTokens = 64
	spec := newEngine(t).Spec()
	one := int64(10 * spec.Layers * spec.KVTokenBytes())
	o.RetainBytes = one + one/2 // room for one 10-token prompt, not two
	w := newWorker(t, o, false)
	var rs []*request
	for _, id := range []string{"a", "b"} {
		p := prompt(10, 1)
		r, _, err := w.s.enqueue(&pdservev1.PrefillRequest{RequestId: id, PromptTokens: p, DecodeAddr: "127.0.0.1:1"}, w.s.cache.Hashes(0, p), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	if a := rs[0].Start(); a != batch.Go {
		t.Fatalf("start a: %v, want Go", a)
	}
	if a := rs[1].Start(); a != batch.Wait {
		t.Errorf("start b beside a: %v, want Wait", a)
	}
	for _, r := range rs {
		w.s.cancel(r, context.Canceled)
	}
	if a := rs[1].Start(); a != batch.Gone {
		t.Errorf("start b once cancelled: %v, want Gone", a)
	}
	w.s.Stop()
	w.s.xfers.Wait()
}
