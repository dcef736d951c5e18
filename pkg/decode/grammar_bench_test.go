package decode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/grammar"
)

// worstSchema is the costliest schema for the matcher within
// grammar.DefaultLimits that we know of: an array of an enum of as many
// alternatives as the limits allow, sharing a prefix as long as the
// literal bytes allow, so that every alternative stays a live parse stack
// for about 100 characters of each of at least 64 items (no choice ends
// within its max_tokens).
func worstSchema() string {
	n := grammar.DefaultLimits.Alternatives
	prefix := strings.Repeat("x", grammar.DefaultLimits.LiteralBytes/n-8)
	vals := make([]string, n)
	for i := range vals {
		vals[i] = fmt.Sprintf("%q", fmt.Sprint(prefix, i))
	}
	return `{"type":"array","minItems":64,"items":{"enum":[` + strings.Join(vals, ",") + `]}}`
}

// BenchmarkGrammarNeighbour measures the latency of a 16-token request
// without a grammar on a decode worker: quiet, beside requests of n
// choices at the worker's maximum (MaxBatch less the neighbour's slot)
// without a grammar, and beside the same under worstSchema, sampled, kept
// running back to back (issue 38 §5 asks for the last within 2x the
// first). It reports each latency in ms and the ratios grammar/quiet and
// grammar/plain (the grammar's share, the batch's own cost aside); ns/op
// is one of each.
//
//	go test -run '^$' -bench GrammarNeighbour -benchtime 20x ./pkg/decode/
func BenchmarkGrammarNeighbour(b *testing.B) { grammarNeighbour(b, newEngine(b)) }

// BenchmarkGrammarNeighbourSim is BenchmarkGrammarNeighbour on the
// performance-model engine (h100/llama-3-8b/tp1, real time): its steps
// take the GPU's modeled time, so the neighbour's latency beside a batch
// is a GPU's, and what the grammar adds is this host's CPU work alone (on
// the reference engine the batch's own arithmetic on the CPU already
// slows the neighbour many times).
//
//	go test -run '^$' -bench GrammarNeighbourSim -benchtime 20x ./pkg/decode/
func BenchmarkGrammarNeighbourSim(b *testing.B) {
	e, err := sim.New(sim.Options{Profile: "h100/llama-3-8b/tp1"})
	if err != nil {
		b.Fatal(err)
	}
	grammarNeighbour(b, e)
}

func grammarNeighbour(b *testing.B, eng engine.Engine) {
	gbnf, err := grammar.FromSchema([]byte(worstSchema()))
	if err != nil {
		b.Fatal(err)
	}
	o := smallOptions()
	o.MaxBatch = 17
	o.KVBlocks = 1024
	o.MaxBatchTokens = 64
	w := newWorkerOn(b, eng, o, true)
	p := prompt(24, 5)
	neighbour := func(id string) time.Duration {
		start := time.Now()
		stream, err := w.client.Generate(context.Background(), &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: 16, IgnoreEos: true, LocalPrefill: true})
		if err != nil {
			b.Fatal(err)
		}
		got, err := collect(stream)
		if err != nil || len(got.tokens) != 16 {
			b.Fatalf("neighbour: %d tokens, %v", len(got.tokens), err)
		}
		return time.Since(start)
	}
	var quiet time.Duration
	neighbour("warm")
	for i := range b.N {
		quiet += neighbour(fmt.Sprint("quiet", i))
	}
	// beside runs the neighbour b.N times beside requests of n choices
	// under gbnf ("": none), kept running back to back.
	beside := func(name, gbnf string) (took time.Duration, tokps float64) {
		ctx, cancel := context.WithCancel(context.Background())
		var tokens atomic.Int64 // streamed by the requests of n choices
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: fmt.Sprint(name, i), PromptTokens: prompt(24, int32(i)), MaxTokens: 200, IgnoreEos: gbnf == "",
					N: int32(o.MaxBatch - 1), LocalPrefill: true, Sampling: &pdservev1.Sampling{Grammar: gbnf, Temperature: 1, Seed: uint64(i)}})
				if err != nil {
					return
				}
				for {
					ev, err := stream.Recv()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						if status.Code(err) != codes.Canceled && !errors.Is(err, context.Canceled) {
							b.Errorf("%s request: %v", name, err)
						}
						return
					}
					tokens.Add(int64(len(ev.GetTokens())))
				}
			}
		}()
		// Its choices are in the batch before the neighbour starts.
		for deadline := time.Now().Add(30 * time.Second); ; {
			ld := w.s.b.Load()
			n := ld.Running
			if ld.QueuedPrefillTokens > 0 {
				n = 0
			}
			if n >= o.MaxBatch-1 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d sequences in the batch, want %d", n, o.MaxBatch-1)
			}
			time.Sleep(time.Millisecond)
		}
		tokens0, start := tokens.Load(), time.Now()
		for i := range b.N {
			took += neighbour(fmt.Sprint(name, "-neighbour", i))
		}
		cancel()
		wg.Wait()
		return took, float64(tokens.Load()-tokens0) / time.Since(start).Seconds()
	}
	plain, plainTok := beside("plain", "")
	guided, guidedTok := beside("grammar", gbnf)
	ms := func(d time.Duration) float64 { return float64(d) / float64(b.N) / 1e6 }
	b.ReportMetric(ms(quiet), "quiet-ms")
	b.ReportMetric(ms(plain), "beside-plain-ms")
	b.ReportMetric(ms(guided), "beside-grammar-ms")
	b.ReportMetric(float64(guided)/float64(quiet), "grammar/quiet")
	b.ReportMetric(float64(guided)/float64(plain), "grammar/plain")
	// The batch's own throughput (its tokens streamed while the
	// neighbour ran): a neighbour kept fast by starving the grammar
	// request would show here.
	b.ReportMetric(plainTok, "plain-tok/s")
	b.ReportMetric(guidedTok, "grammar-tok/s")
}
