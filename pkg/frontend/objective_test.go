package frontend

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/config"
)

// rawRequestHeader is rawRequest with extra header lines ("Name: value").
func rawRequestHeader(t *testing.T, ts *testServer, path string, n int, header string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s\r\nContent-Length: %d\r\n\r\n", path, header, n); err != nil {
		t.Fatal(err)
	}
	return conn
}

// Batch requests hold at most objectives.batch_share of the slots: under
// load a batch request gets 429 naming its share while interactive ones
// still get the rest, and are shed only at the whole queue limit.
func TestBatchShare(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: echoText("ok")}, func(o *Options) {
		o.MaxInFlight = 4
		o.Policy.Objectives.BatchShare = 0.5
	})
	body := `{"prompt":"held","max_tokens":1}`
	var held []net.Conn
	hold := func(header string) {
		held = append(held, rawRequestHeader(t, ts, RouteCompletions, len(body), header))
		waitFor(t, func() error {
			if n := ts.inFlight(); n != len(held) {
				return fmt.Errorf("%d requests in flight, want %d", n, len(held))
			}
			return nil
		})
	}
	hold(HeaderPriority + ": batch")
	hold(HeaderPriority + ": Batch")
	resp := ts.post(t, RouteCompletions, body, HeaderPriority, "batch")
	if e := errorBody(t, resp); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(e.Message, "batch requests hold their 2") {
		t.Errorf("third batch request: %d %q, want 429 with Retry-After naming the batch share", resp.StatusCode, e.Message)
	}
	hold(HeaderPriority + ": interactive")
	hold("X-Other: 1") // interactive by default
	resp = ts.post(t, RouteCompletions, body)
	if e := errorBody(t, resp); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(e.Message, "queue limit") {
		t.Errorf("fifth request: %d %q, want 429 at the queue limit", resp.StatusCode, e.Message)
	}
	for _, conn := range held {
		if _, err := conn.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
		if resp := readResponse(t, conn); resp.StatusCode != http.StatusOK {
			t.Errorf("held request: status %d", resp.StatusCode)
		}
	}
	ts.idle(t)
	ts.srv.mu.Lock()
	batch := ts.srv.batchInFlight
	ts.srv.mu.Unlock()
	if batch != 0 {
		t.Errorf("%d batch slots still held after every request ended", batch)
	}
	if resp := ts.post(t, RouteCompletions, body, HeaderPriority, "batch"); resp.StatusCode != http.StatusOK {
		t.Errorf("batch request after the load: status %d", resp.StatusCode)
	}
}

// The objective's headers are checked against the request's policy: a
// budget tighter than its minimum, a priority above its key's, or a value
// that is not one are each a 400 naming the header, before admission.
func TestObjectiveHeaders(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: echoText("ok")}, func(o *Options) {
		o.Policy.Objectives = config.Objectives{
			Default: config.Objective{TTFTBudgetMs: 500, MinTTFTBudgetMs: 100},
			APIKeys: map[string]config.Objective{"nightly-key": {Priority: config.PriorityBatch}},
		}
	})
	body := `{"prompt":"a","max_tokens":1}`
	for _, tc := range []struct {
		hdr   []string
		param string
		code  string
	}{
		{[]string{HeaderTTFTBudget, "50"}, HeaderTTFTBudget, "ttft_budget_below_minimum"},
		{[]string{HeaderTTFTBudget, "soon"}, HeaderTTFTBudget, "invalid_value"},
		{[]string{HeaderTTFTBudget, "-5"}, HeaderTTFTBudget, "invalid_value"},
		{[]string{HeaderTTFTBudget, "NaN"}, HeaderTTFTBudget, "invalid_value"},
		{[]string{HeaderTTFTBudget, "1e300"}, HeaderTTFTBudget, "invalid_value"},
		{[]string{HeaderPriority, "urgent"}, HeaderPriority, "invalid_value"},
		{[]string{"Authorization", "Bearer nightly-key", HeaderPriority, "interactive"}, HeaderPriority, "priority_not_allowed"},
	} {
		resp := ts.post(t, RouteCompletions, body, tc.hdr...)
		e := errorBody(t, resp)
		if resp.StatusCode != http.StatusBadRequest || deref(e.Param) != tc.param || deref(e.Code) != tc.code {
			t.Errorf("%q: %d %s/%s %q, want 400 %s on %s", tc.hdr, resp.StatusCode, deref(e.Param), deref(e.Code), e.Message, tc.code, tc.param)
		}
	}
	// Within bounds: served, the objective in the budget.
	resp := ts.post(t, RouteCompletions, body, HeaderTTFTBudget, "250", HeaderPriority, "batch")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	b := decodeJSON(t, resp.Body)["pdserve"].(map[string]any)
	if b["ttft_budget_ms"] != 250.0 || b["priority"] != "batch" {
		t.Errorf("budget %v / %v, want 250 ms, batch", b["ttft_budget_ms"], b["priority"])
	}
}

// TestForwardedBudgetBelowMinimum: a budget a peer region forwarded is
// what its origin left of one it checked, so the minimum of the key's
// objective does not refuse it here, as it refuses a client's own.
func TestForwardedBudgetBelowMinimum(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: echoText("ok")}, func(o *Options) {
		o.Policy.Objectives.Default = config.Objective{Priority: config.PriorityInteractive, TTFTBudgetMs: 1000, MinTTFTBudgetMs: 100}
	})
	r, _ := http.NewRequest(http.MethodPost, RouteCompletions, nil)
	r.Header.Set(HeaderTTFTBudget, "20.5")
	if _, aerr := ts.srv.objective(r, client{}, RouteCompletions); aerr == nil || deref(aerr.Code) != "ttft_budget_below_minimum" {
		t.Errorf("a client's 20.5 ms: %+v, want ttft_budget_below_minimum", aerr)
	}
	obj, aerr := ts.srv.objective(r, client{fwd: &Forwarded{Origin: "a"}}, RouteCompletions)
	if aerr != nil || obj.TTFTBudget != 20500*time.Microsecond {
		t.Errorf("a forwarded 20.5 ms: %v, %+v; want a budget of 20.5ms", obj.TTFTBudget, aerr)
	}
}
