package batch

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/workertest"
	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/runner"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// newTestBatch returns a Batch on a metered engine with no bound, and its
// policy, to drive step by step.
func newTestBatch(t *testing.T, stop func()) (*Batch, policy, *meteredEngine) {
	eng := &meteredEngine{Engine: workertest.Engine(t), tokens: 1 << 20, seqs: 1 << 10, live: map[engine.SeqID]bool{}}
	b := New(Config{Engine: eng, MaxBatchTokens: 16, ChunkTokens: 8, Signals: batching.NewSignals(), Stop: stop})
	return b, policy{b}, eng
}

// step runs one planned step, as the runner does; it reports whether
// there was one.
func step(t *testing.T, p policy, eng engine.Engine) bool {
	t.Helper()
	rb := p.Plan()
	if rb.Size() == 0 {
		return false
	}
	res := runner.Result{Start: time.Now()}
	res.Prefill, res.Err = eng.Prefill(context.Background(), rb.Prefill, rb.OnKV)
	res.End = time.Now()
	p.Done(context.Background(), rb, res)
	return true
}

func join(b *Batch, key uint64, n int) *sink {
	k := &sink{id: fmt.Sprint("r", key), prompt: n, filled: make([]int, b.spec.Layers)}
	b.Post(Join(&Request{Key: key, ID: k.id, Prompt: workertest.Prompt(n, int32(key)), Out: k}))
	return k
}

// TestCancelFreesWithoutEnd: a Cancel takes a started request out at the
// next boundary, its engine sequence freed and no End reported; one the
// service ended before it started (Start says Gone) is dropped; the
// others run to their first token. Fails if Cancel left the sequence in
// the engine or reported an End.
func TestCancelFreesWithoutEnd(t *testing.T) {
	b, p, eng := newTestBatch(t, nil)
	a, c, d := join(b, 1, 24), join(b, 2, 24), join(b, 3, 5)
	for _, k := range []*sink{a, c, d} {
		k.t = t
	}
	step(t, p, eng) // a and c started: 8 tokens each
	if _, n := eng.held(); n != 2 {
		t.Fatalf("after the first step the engine holds %d sequences, want 2", n)
	}
	a.cancelled = true
	b.Post(Cancel(1))
	d.cancelled = true // ended in the service; its Cancel not yet taken
	for step(t, p, eng) {
	}
	if a.ends != 0 || d.ends != 0 || c.ends != 1 || c.end.Kind != Prefilled {
		t.Errorf("ends: cancelled %d, gone %d, other %d (%+v): want 0, 0 and one Prefilled", a.ends, d.ends, c.ends, c.end)
	}
	if _, n := eng.held(); n != 0 {
		t.Errorf("idle, the engine holds %d sequences, want none (no prefix cache)", n)
	}
	if ld := b.Load(); ld.Queued != 0 || ld.QueuedPrefillTokens != 0 {
		t.Errorf("idle load %+v, want empty", ld)
	}
}

// TestShutdownEndsEveryRequestStopped: at the shutdown, after
// Config.Stop, every request the batch holds, started or not, and every
// Join posted before, ends Stopped once, and the engine holds nothing.
// Fails if the shutdown skips a request (e.g. one still in the mailbox,
// or one it removes while iterating the queue).
func TestShutdownEndsEveryRequestStopped(t *testing.T) {
	stopped := false
	b, p, eng := newTestBatch(t, func() { stopped = true })
	var ks []*sink
	for key := range uint64(4) {
		ks = append(ks, join(b, key+1, 30))
	}
	step(t, p, eng)                 // two started
	ks = append(ks, join(b, 5, 10)) // still in the mailbox
	p.Shutdown()
	if !stopped {
		t.Error("Config.Stop not called")
	}
	for _, k := range ks {
		if k.ends != 1 || k.end.Kind != Stopped {
			t.Errorf("%s: %d ends (%+v), want one Stopped", k.id, k.ends, k.end)
		}
	}
	if tok, n := eng.held(); n != 0 {
		t.Errorf("after the shutdown the engine holds %d tokens in %d sequences", tok, n)
	}
	if ld := b.Load(); ld.Queued != 0 {
		t.Errorf("after the shutdown: load %+v, want none queued", ld)
	}
}

// joinAs posts a request of n prompt tokens with priority prio, named
// id, whose start is appended to starts.
func joinAs(b *Batch, key uint64, id string, n int, prio vocab.Priority, starts *[]string) *sink {
	k := &sink{id: id, prompt: n, filled: make([]int, b.spec.Layers), starts: starts}
	b.Post(Join(&Request{Key: key, ID: id, Prompt: workertest.Prompt(n, int32(key)), Out: k, Priority: prio}))
	return k
}

// TestPriorityStartOrder: with the step budget saturated (two requests of
// 24 tokens fill a step of 16 in chunks of 8), waiting interactive
// requests start before batch ones that joined earlier, at most
// Overtakes in a row, then the oldest starts; every request is
// prefilled. Fails on FCFS (Overtakes 0: b3 and b4 start
// before i5) and on strict priority (b3 would start after i6..i8).
func TestPriorityStartOrder(t *testing.T) {
	I, B := vocab.PriorityInteractive, vocab.PriorityBatch
	for _, tc := range []struct {
		name      string
		overtakes int
		early     []vocab.Priority // joined before the first step
		late      []vocab.Priority // joined after it
		want      []string
	}{
		{"interactive first", 8, []vocab.Priority{B, B, B, B}, []vocab.Priority{I}, []string{"b1", "b2", "i5", "b3", "b4"}},
		{"fcfs without overtakes", 0, []vocab.Priority{B, B, B, B}, []vocab.Priority{I}, []string{"b1", "b2", "b3", "b4", "i5"}},
		{"batch within the bound", 2, []vocab.Priority{B, B, B}, []vocab.Priority{I, I, I, I, I}, []string{"b1", "b2", "i4", "i5", "b3", "i6", "i7", "i8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, p, eng := newTestBatch(t, nil)
			b.order.Overtakes = tc.overtakes
			var starts []string
			var ks []*sink
			post := func(prios []vocab.Priority) {
				for _, pr := range prios {
					key := uint64(len(ks) + 1)
					name := map[vocab.Priority]string{I: "i", B: "b"}[pr] + fmt.Sprint(key)
					ks = append(ks, joinAs(b, key, name, 24, pr, &starts))
				}
			}
			post(tc.early)
			step(t, p, eng)
			post(tc.late)
			for step(t, p, eng) {
			}
			if !slices.Equal(starts, tc.want) {
				t.Errorf("start order %v, want %v", starts, tc.want)
			}
			for _, k := range ks {
				if k.ends != 1 || k.end.Kind != Prefilled {
					t.Errorf("%s: %d ends (%+v), want one Prefilled", k.id, k.ends, k.end)
				}
			}
			if _, n := eng.held(); n != 0 {
				t.Errorf("idle, the engine holds %d sequences", n)
			}
		})
	}
}
