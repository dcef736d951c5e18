package coordinator_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// TestMetricsPromlint: /metrics of a standalone stack (the coordinator's
// metrics and its workers', after a request) passes client_golang's
// promlint, as `promtool check metrics` runs it. It fails on a gauge
// named _total (pdserve_kv_blocks_total was one) or a counter without it.
func TestMetricsPromlint(t *testing.T) {
	cl := startCluster(t, clusterOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp := post(ctx, t, cl.url+"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 4})
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cl.url+"/metrics", nil)
	mr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Body.Close()
	body, _ := io.ReadAll(mr.Body)
	if mr.StatusCode != 200 || !strings.Contains(string(body), "pdserve_kv_blocks_capacity") {
		t.Fatalf("/metrics: %d, %d bytes, want the workers' metrics too", mr.StatusCode, len(body))
	}
	problems, err := promlint.New(strings.NewReader(string(body))).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}
