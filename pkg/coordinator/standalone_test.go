package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/standalone"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// TestTwoStandaloneSideBySide: with no --nats-listen, each standalone
// coordinator's embedded NATS takes a free port, so a second one starts
// next to the first.
func TestTwoStandaloneSideBySide(t *testing.T) {
	defaultListen := func(o *coordinator.Options) { o.NATSListen = "" }
	a := startCluster(t, clusterOpts{edit: defaultListen})
	b := startCluster(t, clusterOpts{edit: defaultListen})
	if a.c.NATSURL() == b.c.NATSURL() {
		t.Fatalf("both on %s", a.c.NATSURL())
	}
	for _, cl := range []*cluster{a, b} {
		if !strings.HasPrefix(cl.c.NATSURL(), "nats://127.0.0.1:") {
			t.Errorf("embedded NATS at %s, want loopback", cl.c.NATSURL())
		}
		if r := complete(context.Background(), t, cl.url, request{Prompt: "hello", MaxTokens: 2, IgnoreEOS: true}); len(r.Tokens) != 2 {
			t.Errorf("%s: %d tokens, want 2", cl.url, len(r.Tokens))
		}
	}
}

// TestNATSListenInUse: an embedded NATS address that is taken fails the
// start at once, saying so.
func TestNATSListenInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.NATSListen, o.Standalone = "127.0.0.1:0", l.Addr().String(), true
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	c, err := standalone.Start(context.Background(), o, testLogger(t))
	if err == nil {
		_ = c.Shutdown(context.Background())
		t.Fatal("Start on a taken NATS address succeeded")
	}
	if !errors.Is(err, control.ErrAddrInUse) || !strings.Contains(err.Error(), "address in use") {
		t.Errorf("Start error = %v, want address in use", err)
	}
}

// TestNATSListenDefaults: the effective embedded NATS address is logged;
// a free port in standalone mode, the NATS default otherwise, the flag's
// value when given.
func TestNATSListenDefaults(t *testing.T) {
	tests := []struct {
		name       string
		standalone bool
		listen     string
		want       string
	}{
		{name: "standalone", standalone: true, want: "127.0.0.1:-1"},
		{name: "coordinator alone", want: "127.0.0.1:4222"},
		{name: "given", standalone: true, listen: "127.0.0.1:4333", want: "127.0.0.1:4333"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := coordinator.DefaultOptions()
			o.Standalone, o.NATSListen = tc.standalone, tc.listen
			if err := o.Complete(); err != nil {
				t.Fatal(err)
			}
			if err := o.Validate(); err != nil {
				t.Fatal(err)
			}
			for _, f := range o.LogFields() {
				if f.Key == "nats_listen" && f.String != tc.want {
					t.Errorf("nats_listen = %q, want %q", f.String, tc.want)
				}
			}
		})
	}
}

// TestCostInBudget: with pricing in the policy every request's `pdserve`
// object carries its cost; without it, none.
func TestCostInBudget(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("pricing: {prompt_usd_per_1k_tokens: 1, output_usd_per_1k_tokens: 2}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	priced := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) { o.PolicyFile = policy }})
	free := startCluster(t, clusterOpts{})
	// 4 prompt tokens × $1/1k + 3 output tokens × $2/1k = $0.01 for 7
	// tokens.
	for _, stream := range []bool{false, true} {
		r := complete(context.Background(), t, priced.url, request{Prompt: []int32{1, 2, 3, 4}, MaxTokens: 3, IgnoreEOS: true, Stream: stream})
		if got, want := r.Budget["cost_usd"], 0.01; got != want {
			t.Errorf("stream %v: cost_usd = %v, want %v (budget %v)", stream, got, want, r.Budget)
		}
		if got, want := r.Budget["cost_usd_per_1k_tokens"], 0.01/7*1000; !approx(got, want) {
			t.Errorf("stream %v: cost_usd_per_1k_tokens = %v, want %v", stream, got, want)
		}
		if _, ok := r.Budget["gpu_seconds"]; ok {
			t.Errorf("stream %v: gpu_seconds under token pricing", stream)
		}
		r = complete(context.Background(), t, free.url, request{Prompt: []int32{1, 2, 3, 4}, MaxTokens: 3, IgnoreEOS: true, Stream: stream})
		for _, k := range []string{"cost_usd", "cost_usd_per_1k_tokens", "gpu_seconds"} {
			if _, ok := r.Budget[k]; ok {
				t.Errorf("stream %v: unpriced request has %s", stream, k)
			}
		}
	}
}

func approx(got any, want float64) bool {
	g, ok := got.(float64)
	return ok && g > want*(1-1e-5) && g < want*(1+1e-5)
}

// jumpyClock moves 50 ms at every reading: a sim engine on it sees each
// step take far longer than its model. Safe for concurrent use.
type jumpyClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *jumpyClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(50 * time.Millisecond)
	return c.t
}

// TestEngineOverrunWarning: when a standalone sim engine falls behind its
// model during a request, the request's `pdserve` object says so.
func TestEngineOverrunWarning(t *testing.T) {
	behind := func(wo *workerrun.Options) {
		clk := &jumpyClock{t: time.Now()}
		e, err := sim.New(sim.Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 0.001, PayloadScale: 0.01, Seed: 3,
			Clock: clk.Now, Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
		if err != nil {
			t.Fatal(err)
		}
		wo.EngineOverride = e
	}
	cl := startCluster(t, clusterOpts{worker: behind})
	r := complete(context.Background(), t, cl.url, request{Prompt: "hello", MaxTokens: 3, IgnoreEOS: true})
	ws, _ := r.Budget["warnings"].([]any)
	var got []string
	for _, w := range ws {
		got = append(got, fmt.Sprint(w))
	}
	for _, worker := range []string{"prefill-0", "decode-0"} {
		found := false
		for _, w := range got {
			found = found || strings.Contains(w, "sim engine of "+worker+" fell behind its performance model")
		}
		if !found {
			t.Errorf("no warning about %s in %q", worker, got)
		}
	}

	// An engine on time: no warning.
	cl = startCluster(t, clusterOpts{})
	if r := complete(context.Background(), t, cl.url, request{Prompt: "hello", MaxTokens: 3, IgnoreEOS: true}); r.Budget["warnings"] != nil {
		t.Errorf("warnings %v from the ref engine", r.Budget["warnings"])
	}
}
