package prefill

import (
	"context"

	"testing"

	"github.com/google/go-cmp/cmp"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

func TestRetainStoreLRU(t *testing.T) {
	s := newRetainStore(100)
	done := func(id string, bytes int64) *retained {
		e := s.add(id, nil, bytes)
		e.complete = true
		s.unpin(e)
		return e
	}
	done("a", 30)
	done("b", 30)
	done("c", 30)
	// Using a makes b the least recently used.
	a := s.get("a")
	s.pin(a)
	s.unpin(a)
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
	s.unpin(p)
	if s.total != 0 || len(s.m) != 0 {
		t.Errorf("total %d, %d entries after the last unpin; want empty", s.total, len(s.m))
	}
	// Alone, a request bigger than the limit is admitted.
	if !s.makeRoom(500) {
		t.Error("a lone oversize request must be admitted")
	}
}

func TestAdmissionWaitsForRetentionRoom(t *testing.T) {
	o := smallOptions()
	o.MaxBatchTokens = 64
	spec := newEngine(t).Spec()
	one := int64(10 * spec.Layers * spec.KVTokenBytes())
	o.RetainBytes = one + one/2 // room for one 10-token prompt, not two
	w := newWorker(t, o, false)
	for _, id := range []string{"a", "b"} {
		if _, _, err := w.s.enqueue(&pdservev1.PrefillRequest{RequestId: id, PromptTokens: prompt(10, 1), DecodeAddr: "127.0.0.1:1"}); err != nil {
			t.Fatal(err)
		}
	}
	b := w.s.plan()
	if len(b.reqs) != 1 || b.reqs[0].id != "a" {
		t.Fatalf("planned %d requests, want only the first (a)", len(b.reqs))
	}
	for _, id := range []string{"a", "b"} {
		w.s.mu.Lock()
		r := w.s.live[id]
		w.s.mu.Unlock()
		w.s.cancel(r, context.Canceled)
	}
}
