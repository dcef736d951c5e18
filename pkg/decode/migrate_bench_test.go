package decode

import (
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// BenchmarkMigratePause measures a live migration's pause in a moved
// stream over loopback gRPC: the gap, as the client sees it, between the
// last token the source streamed and the first the target streamed (the
// export at a step boundary, the end of the source's stream, the
// target's Generate, its PullSequence of the KV of the prompt (24
// tokens) and 15 output tokens, zstd, the import and one decode step),
// beside the gaps between two events of one worker's stream (a step, or
// less when the client reads several tokens at once). On the tiny ref
// engine, and on the sim engine as an H100 running Llama-3-8B in real
// time (TimeScale 1; its KV payload scaled to 1/1024, the pull paced at
// 100 Gb/s for the true size). Run:
//
//	go test -run '^$' -bench BenchmarkMigratePause -benchtime 20x ./pkg/decode/
func BenchmarkMigratePause(b *testing.B) {
	b.Run("ref-tiny", func(b *testing.B) {
		migratePause(b, func(p *pause) engine.Engine { return &pausingEngine{Engine: newEngine(b), pause: p} },
			func() engine.Engine { return newEngine(b) })
	})
	newSim := func() *sim.Engine {
		eng, err := sim.New(sim.Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 1, PayloadScale: 1.0 / 1024, Seed: 3})
		if err != nil {
			b.Fatal(err)
		}
		return eng
	}
	b.Run("sim-h100-llama-3-8b", func(b *testing.B) {
		migratePause(b, func(p *pause) engine.Engine { return &pausingSim{Engine: newSim(), pause: p} },
			func() engine.Engine { return newSim() })
	})
}

// pausingSim is the sim engine with a pause.
type pausingSim struct {
	*sim.Engine
	*pause
}

func (e *pausingSim) Step(ctx context.Context, prefill []engine.PrefillItem, decode []engine.DecodeItem, onKV engine.KVFunc) ([]engine.Output, []engine.Output, error) {
	e.pause.step(len(decode) > 0)
	return e.Engine.Step(ctx, prefill, decode, onKV)
}

func migratePause(b *testing.B, newSrc func(*pause) engine.Engine, newDst func() engine.Engine) {
	var pauses, gaps []time.Duration
	for range b.N {
		e := newPause(15)
		src := newWorkerOn(b, newSrc(e), smallOptions(), true)
		d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1), kvtransfer.WithLinkGbps(100))
		b.Cleanup(func() { _ = d.Close() }) // after the Server stopped
		dst := newWorkerOn(b, newDst(), smallOptions(), true, func(s *Server) { WithDialer(d)(s) })
		req := migRequest("m", nil)
		req.MaxTokens = 40
		ctx := testCtx(b)
		stream, err := src.client.Generate(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		<-e.paused
		done := make(chan error, 1)
		go func() {
			n, err := src.s.MigrateAll(ctx)
			if err == nil && n != 1 {
				err = errors.New("nothing migrated")
			}
			done <- err
		}()
		for !src.s.Stats().Draining {
			runtime.Gosched()
		}
		close(e.release) // the engine's pause ends before the last source token
		toks, at, ns := recvTimed(b, stream)
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		stream2 := resume(ctx, b, dst, src, req, toks)
		_, at2, _ := recvTimed(b, stream2)
		pauses = append(pauses, at2[0].Sub(at[len(at)-1]))
		// The source's events after the engine's pause (the test's),
		// then the target's.
		k := 0
		for n := 0; k < len(at) && n <= int(e.at); k++ {
			n += int(ns[k])
		}
		for _, ts := range [][]time.Time{at[k:], at2} {
			for j := 1; j < len(ts); j++ {
				gaps = append(gaps, ts[j].Sub(ts[j-1]))
			}
		}
	}
	slices.Sort(pauses)
	slices.Sort(gaps)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(pauses[len(pauses)/2]), "pause-p50-ms")
	b.ReportMetric(ms(pauses[len(pauses)-1]), "pause-max-ms")
	if len(gaps) > 0 {
		b.ReportMetric(ms(gaps[len(gaps)/2]), "itl-p50-ms")
		b.ReportMetric(ms(gaps[len(gaps)-1]), "itl-max-ms")
	}
}

// recvTimed reads a Generate stream to its end: its tokens, and the
// time each event with tokens arrived and its tokens.
func recvTimed(b *testing.B, s grpc.ServerStreamingClient[pdservev1.GenerateResponse]) ([]int32, []time.Time, []int32) {
	var toks, ns []int32
	var at []time.Time
	for {
		ev, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return toks, at, ns
		}
		if err != nil {
			b.Fatal(err)
		}
		if len(ev.GetTokens()) > 0 {
			toks = append(toks, ev.GetTokens()...)
			at = append(at, time.Now())
			ns = append(ns, int32(len(ev.GetTokens())))
		}
	}
}
