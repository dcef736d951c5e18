package coordinator_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/standalone"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// BenchmarkIdleTTFT measures the time to first token of one request at a
// time (an idle system) with a 1024-token prompt on the reference engine's
// small preset, disaggregated (per codec) and colocated. Besides the
// client-side TTFT it reports the server's own budget terms from the
// pdserve object, so the difference between the modes can be split into
// prefill, queueing and KV transfer:
//
//	go test -run '^$' -bench IdleTTFT -benchtime 5x ./pkg/coordinator/
func BenchmarkIdleTTFT(b *testing.B) {
	prompt := make([]int32, 1024)
	for i := range prompt {
		prompt[i] = int32('a' + i%26)
	}
	cases := []struct {
		mode, codec, policy string
	}{
		{coordinator.ModeColocated, "", coordinator.PolicyPrefill},
		{coordinator.ModeDisaggregated, "none", coordinator.PolicyPrefill},
		{coordinator.ModeDisaggregated, "none", coordinator.PolicyDecode},
		{coordinator.ModeDisaggregated, "bf16", coordinator.PolicyDecode},
	}
	for _, c := range cases {
		name := c.mode
		if c.mode == coordinator.ModeDisaggregated {
			name += "/" + c.codec + "/first-token-" + c.policy
		}
		b.Run(name, func(b *testing.B) {
			url := startBenchCluster(b, c.mode, c.codec, c.policy)
			// One warm-up request: connection set-up and first allocations.
			benchRequest(b, url, prompt)
			var ttft, queue, prefill, kv, kvStream float64
			b.ResetTimer()
			for range b.N {
				r := benchRequest(b, url, prompt)
				ttft += r.ttft.Seconds() * 1e3
				queue += r.budget["queue_ms"]
				prefill += r.budget["prefill_ms"]
				kv += r.budget["kv_transfer_ms"]
				kvStream += r.budget["kv_stream_ms"]
			}
			n := float64(b.N)
			b.ReportMetric(ttft/n, "ttft-ms")
			b.ReportMetric(queue/n, "queue-ms")
			b.ReportMetric(prefill/n, "prefill-ms")
			b.ReportMetric(kv/n, "kv_transfer-ms")
			b.ReportMetric(kvStream/n, "kv_stream-ms")
		})
	}
}

type benchResult struct {
	ttft   time.Duration
	budget map[string]float64
}

// benchRequest streams one completion of two tokens and returns the time
// to the first token and the numeric terms of the pdserve object.
func benchRequest(b *testing.B, url string, prompt []int32) benchResult {
	b.Helper()
	body, _ := json.Marshal(map[string]any{
		"model": "small", "prompt": prompt, "max_tokens": 2, "ignore_eos": true, "stream": true,
	})
	start := time.Now()
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
	r := benchResult{budget: map[string]float64{}}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			PDServe map[string]any `json:"pdserve"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			b.Fatal(err)
		}
		if r.ttft == 0 && len(ch.Choices) > 0 {
			r.ttft = time.Since(start)
		}
		for k, v := range ch.PDServe {
			if f, ok := v.(float64); ok {
				r.budget[k] = f
			}
		}
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	return r
}

// startBenchCluster starts a standalone deployment of the small preset
// with one worker per role and waits until it is ready.
func startBenchCluster(b *testing.B, mode, codec, policy string) string {
	b.Helper()
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.NATSListen = "127.0.0.1:0", "127.0.0.1:-1"
	o.Standalone, o.Mode, o.Codec, o.FirstTokenPolicy = true, mode, codec, policy
	o.PrefillWorkers, o.DecodeWorkers = 1, 1
	if mode == coordinator.ModeColocated {
		o.PrefillWorkers = 0
	}
	o.Engine.Preset = "small"
	if err := o.Complete(); err != nil {
		b.Fatal(err)
	}
	c, err := standalone.Start(context.Background(), o, zap.NewNop(),
		standalone.WithWorkerOptions(func(wo *workerrun.Options) { wo.HeartbeatInterval = 50 * time.Millisecond }))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			b.Errorf("shutdown: %v", err)
		}
	})
	roles := []control.Role{control.RolePrefill, control.RoleDecode}
	if mode == coordinator.ModeColocated {
		roles = []control.Role{control.RoleColocated}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.Ready()
		for _, r := range roles {
			if len(c.Membership().Members(r)) == 0 {
				err = fmt.Errorf("no %s worker yet", r)
			}
		}
		if err == nil {
			return "http://" + c.HTTPAddr()
		}
		if time.Now().After(deadline) {
			b.Fatalf("deployment not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
