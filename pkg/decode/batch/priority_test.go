package batch

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/runner"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// joinOrder is a request's Outbox that appends its id to joins when the
// request joins the batch, and takes every token.
type joinOrder struct {
	nopOutbox
	id    string
	joins *[]string
}

func (o joinOrder) Stamp(s vocab.Stamp, _ time.Time) {
	if s == StampJoined {
		*o.joins = append(*o.joins, o.id)
	}
}

// TestPriorityJoinOrder: with the batch full (two sequences of six
// tokens each), waiting interactive requests join before batch ones that
// became ready earlier, at most Overtakes in a row, then the oldest
// joins; each request ends Finished once and the
// engine ends empty. Remote KV and local prompts alike. Fails on the
// order of readiness (Overtakes 0: b3 and b4 join before i5) and on
// strict priority (b3 would join after i6..i8).
func TestPriorityJoinOrder(t *testing.T) {
	I, B := vocab.PriorityInteractive, vocab.PriorityBatch
	for _, tc := range []struct {
		name      string
		overtakes int
		early     []vocab.Priority // ready before the first step
		late      []vocab.Priority // ready after it
		want      []string
	}{
		{"interactive first", 8, []vocab.Priority{B, B, B, B}, []vocab.Priority{I}, []string{"b1", "b2", "i5", "b3", "b4"}},
		{"readiness order without overtakes", 0, []vocab.Priority{B, B, B, B}, []vocab.Priority{I}, []string{"b1", "b2", "b3", "b4", "i5"}},
		{"batch within the bound", 2, []vocab.Priority{B, B, B}, []vocab.Priority{I, I, I, I, I}, []string{"b1", "b2", "i4", "i5", "b3", "i6", "i7", "i8"}},
	} {
		for _, local := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/local=%v", tc.name, local), func(t *testing.T) {
				eng, src := newBoundedEngine(t), newBoundedEngine(t)
				ended := map[uint64]int{}
				b := New(Config{
					Engine: eng, EOG: map[int32]bool{}, MaxBatch: 2, MaxBatchTokens: 32, ChunkTokens: 8,
					TokenBytes: eng.Spec().KVTokenBytes(), Overtakes: tc.overtakes, Signals: batching.NewSignals(),
					Report: func(es []End, _ bool) {
						for _, e := range es {
							ended[e.Key]++
							if e.Kind != Finished {
								t.Errorf("%s ended %v (%v), want finished", e.ID, e.Kind, e.Err)
							}
						}
					},
				})
				p := policy{b}
				var joins []string
				var key uint64
				post := func(prios []vocab.Priority) {
					for _, pr := range prios {
						key++
						id := map[vocab.Priority]string{I: "i", B: "b"}[pr] + fmt.Sprint(key)
						prompt := []int32{int32(key), 7, 8, 9}
						r := &Request{
							Key: key, ID: id, Local: local, Prompt: prompt, MaxTokens: 6, N: 1, IgnoreEOS: true,
							Top: -1, PromptTop: -1, Out: joinOrder{id: id, joins: &joins}, Priority: pr,
						}
						if !local {
							r.KV = remoteKV(t, src, prompt, 0)
						}
						b.Post(Join(r))
					}
				}
				ctx := context.Background()
				step := func() bool {
					rb := p.Plan()
					if rb.Size() == 0 {
						return false
					}
					res := runner.Result{Start: time.Now()}
					res.Prefill, res.Decode, res.Err = engine.RunStep(ctx, eng, rb.Prefill, rb.Decode, rb.OnKV)
					res.End = time.Now()
					p.Done(ctx, rb, res)
					return true
				}
				post(tc.early)
				step()
				post(tc.late)
				for n := 0; step(); n++ {
					if n > 1000 {
						t.Fatal("the batch never idles")
					}
				}
				if !slices.Equal(joins, tc.want) {
					t.Errorf("join order %v, want %v", joins, tc.want)
				}
				if len(ended) != int(key) {
					t.Errorf("%d of %d requests ended", len(ended), key)
				}
				for k, n := range ended {
					if n != 1 {
						t.Errorf("request %d ended %d times", k, n)
					}
				}
				if _, n := eng.held(); n != 0 {
					t.Errorf("idle, the engine holds %d sequences", n)
				}
			})
		}
	}
}
