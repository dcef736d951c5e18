package standalone_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/standalone"
	"github.com/pdserve/pdserve/pkg/tracing/tracingtest"
)

// BenchmarkTracingOverhead measures what tracing costs a request: two
// standalone deployments (one prefill and one decode worker, the tiny ref
// model, random weights), one with tracing off (the default) and one
// sampling every trace (--otel-sample-ratio 1) and exporting over OTLP
// gRPC to an in-process receiver, each sent the same completion (a
// 64-token prompt, 8 output tokens) in turn, so that both see the same
// machine. It reports the mean latency of each and their ratio:
//
//	go test -run '^$' -bench TracingOverhead -benchtime 200x ./pkg/standalone/
func BenchmarkTracingOverhead(b *testing.B) {
	rcv := tracingtest.Start(b)
	off := startBench(b, nil)
	on := startBench(b, rcv)
	body, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": strings.Repeat("benchmark", 8)[:64], "max_tokens": 8, "ignore_eos": true})
	send := func(addr string) time.Duration {
		start := time.Now()
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d, %v", resp.StatusCode, err)
		}
		return time.Since(start)
	}
	for range 3 { // warm-up: connections, first allocations
		send(off)
		send(on)
	}
	var tOff, tOn time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			tOff += send(off)
			tOn += send(on)
		} else {
			tOn += send(on)
			tOff += send(off)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(tOff.Microseconds())/n, "off-us/req")
	b.ReportMetric(float64(tOn.Microseconds())/n, "on-us/req")
	b.ReportMetric(float64(tOn)/float64(tOff), "on/off")
}

// startBench starts a deployment traced to rcv (sampling every trace),
// or untraced for nil, and returns its HTTP address.
func startBench(b *testing.B, rcv *tracingtest.Receiver) string {
	b.Helper()
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.Standalone, o.LogLevel = "127.0.0.1:0", true, "error"
	o.Tracing.Getenv = noEnv
	if rcv != nil {
		o.Tracing.Endpoint, o.Tracing.Protocol, o.Tracing.SampleRatio = rcv.GRPCEndpoint(), "grpc", 1
	}
	if err := o.Complete(); err != nil {
		b.Fatal(err)
	}
	s, err := standalone.Start(context.Background(), o, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	poll.CheckFor(b, 10*time.Second, 10*time.Millisecond, s.Ready)
	return s.HTTPAddr()
}
