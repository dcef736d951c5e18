package batching

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// TestSignalsWake: wake-ups given before the loop reads coalesce into one,
// and Wake never blocks.
func TestSignalsWake(t *testing.T) {
	s := NewSignals()
	for _, n := range []int{1, 3} {
		for range n {
			s.Wake()
		}
		select {
		case <-s.Woken():
		default:
			t.Fatalf("%d wake-ups: Woken yields nothing", n)
		}
		select {
		case <-s.Woken():
			t.Fatalf("%d wake-ups: Woken yields twice", n)
		default:
		}
	}
}

// TestSignalsDraining: the flag reads what was set, false at first.
func TestSignalsDraining(t *testing.T) {
	s := NewSignals()
	for i, want := range []bool{false, true, true, false} {
		if i > 0 {
			s.SetDrainingLocked(want)
		}
		if got := s.DrainingLocked(); got != want {
			t.Errorf("step %d: draining %v, want %v", i, got, want)
		}
	}
}

// TestSignalsWaitIdle: WaitIdle returns at once with nothing live, returns
// once the last request ends (an end that leaves some live does not
// release it), and returns ctx's error when ctx ends first.
func TestSignalsWaitIdle(t *testing.T) {
	var mu sync.Mutex
	s := NewSignals()
	live := 0
	count := func() int { return live }
	if err := s.WaitIdle(context.Background(), &mu, count); err != nil {
		t.Fatalf("idle: %v", err)
	}

	live = 2
	done := make(chan error, 1)
	go func() { done <- s.WaitIdle(context.Background(), &mu, count) }()
	end := func() {
		mu.Lock()
		live--
		s.EndedLocked()
		mu.Unlock()
	}
	end()
	select {
	case err := <-done:
		t.Fatalf("returned (%v) with one request live", err)
	default:
	}
	end()
	if err := <-done; err != nil {
		t.Fatalf("after the last end: %v", err)
	}

	mu.Lock()
	live = 1
	mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.WaitIdle(ctx, &mu, count); !errors.Is(err, context.Canceled) {
		t.Fatalf("ctx ended: %v, want context.Canceled", err)
	}
}
