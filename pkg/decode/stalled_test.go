package decode

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/wire"
)

// heapInUse returns the bytes of live heap objects after a collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestStalledCaller: a caller that stops reading a stream of 16 choices ×
// 1000 tokens with 20 logprobs each (about 21 MB of output) has its
// request cancelled, by the outbox bound or by the write timeout, with
// everything freed: its KV blocks, its engine sequences, its pending
// output; the heap stays within a few outbox bounds meanwhile and the
// cancellation is counted.
func TestStalledCaller(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		outbox       int
		timeout      time.Duration
	}{
		{"outbox bound", reasonOutbox, 256 << 10, 0},
		{"write timeout", reasonWriteTimeout, 1 << 30, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := smallOptions()
			o.KVBlocks, o.MaxBatch, o.MaxBatchTokens = 1100, 16, 64
			o.MaxOutboxBytes, o.StreamWriteTimeout = tc.outbox, tc.timeout
			reg := prometheus.NewRegistry()
			w := newWorker(t, o, true, func(s *Server) {
				var err error
				if s.m, err = newMetrics(reg, s); err != nil {
					t.Fatal(err)
				}
			})
			// A client whose stream window stays at 64 KiB: the worker's
			// sends block once that much is unread.
			cc, err := grpc.NewClient(w.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			base := heapInUse()
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			_, err = pdservev1.NewDecodeServiceClient(cc).Generate(ctx, &pdservev1.GenerateRequest{
				RequestId: "stalled", PromptTokens: prompt(8, 1), MaxTokens: 1000, LocalPrefill: true, IgnoreEos: true, N: 16,
				Sampling: wire.Sampling(engine.Sampling{Temperature: 1, Seed: 7}), Logprobs: wire.Logprobs(engine.MaxTopLogprobs),
			})
			if err != nil {
				t.Fatal(err)
			}
			// Never read: wait for the cancellation.
			counter := func() float64 { return testutil.ToFloat64(w.s.m.stalledCancel.WithLabelValues(tc.reason)) }
			var peak int64
			deadline := time.Now().Add(25 * time.Second)
			for counter() == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("not cancelled; stats %+v", w.s.Stats())
				}
				if h := heapInUse() - base; h > peak {
					peak = h
				}
				time.Sleep(20 * time.Millisecond)
			}
			checkFor(t, 5*time.Second, func() error {
				st := w.s.Stats()
				if st.Requests != 0 || st.Running != 0 || st.KVBlocksFree != st.KVBlocksTotal {
					return fmt.Errorf("after the cancellation: %d requests, %d running, %d of %d blocks free", st.Requests, st.Running, st.KVBlocksFree, st.KVBlocksTotal)
				}
				return nil
			})
			if h := heapInUse() - base; h > peak {
				peak = h
			}
			// Unbounded, the outbox would reach about 21 MB.
			if bound := int64(8 << 20); peak > bound {
				t.Errorf("heap grew by %d bytes with a stalled caller, want under %d", peak, bound)
			}
			t.Logf("heap growth peak %d KiB", peak>>10)
		})
	}
}

// checkFor polls f every 10 ms until it returns nil or total passes.
func checkFor(t *testing.T, total time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
