package batching

import (
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMailbox: messages come out in the order posted, each once, and a
// Post wakes the loop.
func TestMailbox(t *testing.T) {
	sig := NewSignals()
	b := NewMailbox[int](sig)
	if got := b.Take(); got != nil {
		t.Fatalf("empty mailbox took %v", got)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 100 {
				b.Post(g*1000 + i)
			}
		})
	}
	wg.Wait()
	select {
	case <-sig.Woken():
	default:
		t.Fatal("Post did not wake the loop")
	}
	got := b.Take()
	if len(got) != 400 {
		t.Fatalf("took %d messages, want 400", len(got))
	}
	last := map[int]int{0: -1, 1: -1, 2: -1, 3: -1}
	for _, m := range got {
		g, i := m/1000, m%1000
		if i != last[g]+1 {
			t.Fatalf("poster %d: message %d after %d", g, i, last[g])
		}
		last[g] = i
	}
	b.Post(7)
	if diff := cmp.Diff([]int{7}, b.Take()); diff != "" {
		t.Errorf("second take (-want +got):\n%s", diff)
	}
}
