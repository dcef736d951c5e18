package batch

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/runner"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// ttftOutbox records when its request's prefill ended (its first token)
// on the benchmark's virtual clock.
type ttftOutbox struct {
	prio    vocab.Priority
	arrival time.Time
	done    time.Time
}

func (o *ttftOutbox) Start() Admit                         { return Go }
func (o *ttftOutbox) Prefix(chunks []engine.KVChunk) error { return nil }
func (o *ttftOutbox) KV(c engine.KVChunk) error            { return nil }
func (o *ttftOutbox) End(e End)                            { o.done = e.Done }

// BenchmarkPriorityTTFT runs the prefill batch on the performance-model
// engine (an H100 serving Llama-3-8B, step times from its profile, on a
// virtual clock) under a Poisson load of 1.25 times what it can prefill:
// 1,000 prompts of 256 to 2,048 tokens, one in four interactive, the rest
// batch, chunks of 512 in steps of 2,048 tokens (the workers' defaults).
// It reports each class's TTFT (arrival to the end of the prompt's last
// chunk: the queue and the prefill) at p50 and p90, and the batch
// requests' longest, in modeled milliseconds, with worker priorities (Overtakes
// batching.DefaultOvertakes) and without (0: FCFS). The figures are a
// function of the seed; the loop's wall time is the simulation's.
//
//	go test -run '^$' -bench BenchmarkPriorityTTFT -benchtime 1x ./pkg/prefill/batch/
func BenchmarkPriorityTTFT(b *testing.B) {
	for _, bc := range []struct {
		name      string
		overtakes int
	}{{"priorities", batching.DefaultOvertakes}, {"fcfs", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				inter, batch := priorityTTFT(b, bc.overtakes)
				for _, c := range []struct {
					name string
					ms   []float64
				}{{"interactive", inter}, {"batch", batch}} {
					b.ReportMetric(percentile(c.ms, 0.5), c.name+"_p50_ms")
					b.ReportMetric(percentile(c.ms, 0.9), c.name+"_p90_ms")
				}
				// The longest wait, which the order bounds.
				b.ReportMetric(percentile(batch, 1), "batch_max_ms")
			}
		})
	}
}

// priorityTTFT runs one load and returns the TTFTs of the interactive and
// batch requests, in modeled milliseconds.
func priorityTTFT(b *testing.B, overtakes int) (inter, batch []float64) {
	const (
		requests    = 1000
		interShare  = 0.25
		minPrompt   = 256
		maxPrompt   = 2048
		chunk       = 512
		stepTokens  = 2048
		overloadMul = 1.25
	)
	now := time.Unix(0, 0)
	eng, err := sim.New(sim.Options{
		Profile: "h100/llama-3-8b/tp1", PayloadScale: 0.01,
		Clock: func() time.Time { return now },
		Sleep: func(_ context.Context, d time.Duration) error {
			now = now.Add(max(d, 0))
			return nil
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	bt := New(Config{Engine: eng, MaxBatchTokens: stepTokens, ChunkTokens: chunk, Overtakes: overtakes, Signals: batching.NewSignals(), Now: func() time.Time { return now }})
	p := policy{bt}

	// The capacity: a full step's modeled time, measured once.
	t0 := now
	if _, err := eng.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1 << 30, Tokens: make([]int32, stepTokens), Last: true}}, nil); err != nil {
		b.Fatal(err)
	}
	eng.Free(1 << 30)
	perToken := now.Sub(t0).Seconds() / stepTokens
	meanPrompt := float64(minPrompt+maxPrompt) / 2
	rate := overloadMul / (meanPrompt * perToken) // requests per second

	rng := rand.New(rand.NewPCG(42, 1))
	type arrival struct {
		at  time.Time
		req *Request
		out *ttftOutbox
	}
	var arrivals []arrival
	at := now
	for i := range requests {
		at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		n := minPrompt + rng.IntN(maxPrompt-minPrompt+1)
		prompt := make([]int32, n)
		for j := range prompt {
			prompt[j] = int32(1 + rng.IntN(200))
		}
		prio := vocab.PriorityBatch
		if rng.Float64() < interShare {
			prio = vocab.PriorityInteractive
		}
		out := &ttftOutbox{prio: prio, arrival: at}
		arrivals = append(arrivals, arrival{at: at, out: out, req: &Request{Key: uint64(i + 1), ID: "r", Prompt: prompt, Priority: prio, Out: out}})
	}
	ctx := context.Background()
	next := 0
	for steps := 0; ; steps++ {
		for next < len(arrivals) && !arrivals[next].at.After(now) {
			bt.Post(Join(arrivals[next].req))
			next++
		}
		rb := p.Plan()
		if rb.Size() == 0 {
			if next == len(arrivals) {
				break
			}
			now = arrivals[next].at
			continue
		}
		res := runner.Result{Start: now}
		res.Prefill, res.Err = eng.Prefill(ctx, rb.Prefill, rb.OnKV)
		res.End = now
		if res.Err != nil {
			b.Fatal(res.Err)
		}
		p.Done(ctx, rb, res)
	}
	for _, a := range arrivals {
		if a.out.done.IsZero() {
			b.Fatal("a request never prefilled")
		}
		ms := float64(a.out.done.Sub(a.out.arrival)) / float64(time.Millisecond)
		if a.out.prio == vocab.PriorityInteractive {
			inter = append(inter, ms)
		} else {
			batch = append(batch, ms)
		}
	}
	return inter, batch
}

// percentile returns the q-quantile of xs (nearest rank; 0 when empty).
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
