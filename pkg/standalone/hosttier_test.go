package standalone_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/standalone"
)

// TestInProcessWorkersShareHostTier: the in-process workers of one
// process split the auto host tier's quarter of the free memory instead
// of each taking a quarter (together three quarters and more with three
// workers): two prefill workers get equal budgets summing to at most a
// quarter of the memory free before the start, and the decode worker
// (role decode) none.
func TestInProcessWorkersShareHostTier(t *testing.T) {
	free, err := prefixcache.FreeMemory()
	if err != nil {
		t.Fatalf("free memory: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.Standalone, o.PrefillWorkers, o.DecodeWorkers = addr, true, 2, 1
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	s, err := standalone.Start(context.Background(), o, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown(context.Background()) }()
	poll.CheckFor(t, 10*time.Second, 10*time.Millisecond, s.Ready)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	budgets := map[string][]int64{}
	for line := range strings.Lines(string(body)) {
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !strings.HasSuffix(name, "_prefix_cache_tier_budget_bytes") || !strings.Contains(rest, `tier="host"`) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest[strings.LastIndex(rest, "}")+1:]), 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		budgets[name] = append(budgets[name], int64(v))
	}
	pre := budgets["pdserve_prefill_prefix_cache_tier_budget_bytes"]
	if len(pre) != 2 || pre[0] != pre[1] || pre[0] <= 0 {
		t.Fatalf("prefill host tier budgets %v (all: %v), want two equal positive ones", pre, budgets)
	}
	if sum, quarter := pre[0]+pre[1], free/prefixcache.HostAutoDivisor; float64(sum) > 1.1*float64(quarter) {
		t.Errorf("the prefill workers' host tiers sum to %d bytes, more than a quarter of the free memory (%d)", sum, quarter)
	}
	if dec := budgets["pdserve_decode_prefix_cache_tier_budget_bytes"]; len(dec) != 0 {
		t.Errorf("decode worker host tier budgets %v, want none", dec)
	}
}
