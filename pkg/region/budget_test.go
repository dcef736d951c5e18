package region

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
)

// testTLS returns the TLS of a region with a fresh CA.
func testTLS(t *testing.T) *grpcnet.TLS {
	t.Helper()
	ca := tlstest.NewCA(t, "region test CA")
	leaf := ca.Issue(t, tlstest.Leaf{IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	tl, err := grpcnet.TLSOptions{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile, CAFile: ca.CertFile}.Load(grpcnet.TLSServe|grpcnet.TLSDial, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// startPeer serves h over mutual TLS on loopback (HTTP/2, as a
// coordinator's region listener) and returns its URL.
func startPeer(t *testing.T, tl *grpcnet.TLS, h http.HandlerFunc) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: ServerTLS(tl), Handler: h}
	go func() { _ = srv.ServeTLS(lis, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + lis.Addr().String()
}

// TestForwardSendsBudgetLeft: a peer is sent what is left of the
// client's TTFT budget (less the client's RTT, the time spent at the
// origin and the round trip to the peer), not the whole budget; a budget
// spent before a peer is tried ends the forwarding with nothing sent,
// unless the origin cannot serve the request (Fallback), which sends
// the least budget. Before, the peer saw the client's whole budget and
// a spent one was forwarded all the same.
func TestForwardSendsBudgetLeft(t *testing.T) {
	tl := testTLS(t)
	var mu sync.Mutex
	var seen []string // the budget header of each request the peer got
	url := startPeer(t, tl, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Get(headerTTFTBudget))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{}`)
	})
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	f := NewForwarder("origin", tl, nil)
	f.now = func() time.Time { return now }
	defer f.Close()
	cand := []Candidate{{Region: "peer", URL: url, RTT: 60 * time.Millisecond}}

	for _, tc := range []struct {
		name    string
		req     Request
		elapsed time.Duration
		want    string // the header the peer saw; "-" when it got nothing
		spent   bool
	}{
		{name: "no budget", req: Request{}, elapsed: time.Second, want: ""},
		// 500 − 40 (client RTT) − 100 (spent here) − 60 (RTT to the peer).
		{name: "budget left", req: Request{TTFTBudget: 500 * time.Millisecond, Network: 40 * time.Millisecond}, elapsed: 100 * time.Millisecond, want: "300.000"},
		{name: "no client RTT measured", req: Request{TTFTBudget: 250 * time.Millisecond}, elapsed: 12500 * time.Microsecond, want: "177.500"},
		{name: "spent: not forwarded", req: Request{TTFTBudget: 200 * time.Millisecond, Network: 40 * time.Millisecond}, elapsed: 100 * time.Millisecond, want: "-", spent: true},
		{name: "spent, fallback: the least budget", req: Request{TTFTBudget: 200 * time.Millisecond, Network: 40 * time.Millisecond, Fallback: true}, elapsed: 100 * time.Millisecond, want: "0.001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			seen = nil
			mu.Unlock()
			req := tc.req
			req.Path, req.Header, req.Arrival = "/v1/completions", http.Header{}, t0
			now = t0.Add(tc.elapsed)
			w := httptest.NewRecorder()
			out := f.Forward(context.Background(), w, []byte(`{}`), req, cand)
			mu.Lock()
			defer mu.Unlock()
			if tc.want == "-" {
				if len(seen) != 0 || out.Region != "" || !out.Spent || w.Body.Len() != 0 {
					t.Fatalf("peer got %q, outcome %+v, body %q; want nothing sent, Spent", seen, out, w.Body.String())
				}
				return
			}
			if out.Region != "peer" || out.Spent || len(seen) != 1 || seen[0] != tc.want {
				t.Fatalf("peer saw budget %q, outcome %+v; want %q", seen, out, tc.want)
			}
		})
	}
}

// TestForwardUsageTrailer: the serving region's usage trailer reaches
// OnUsage once its response ended and before the end reaches the
// client: before a whole response is written, before a stream's [DONE];
// a response without it leaves the charge (Usage -1, OnUsage not
// called).
func TestForwardUsageTrailer(t *testing.T) {
	tl := testTLS(t)
	url := startPeer(t, tl, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		stream := strings.Contains(r.URL.RawQuery, "stream")
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"a\":1}\n\n")
			http.NewResponseController(w).Flush()
			_, _ = io.WriteString(w, "data: {\"a\":2}\n\ndata: [DONE]\n\n")
		} else {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"usage":{}}`)
		}
		if !strings.Contains(r.URL.RawQuery, "none") {
			w.Header().Set(http.TrailerPrefix+HeaderUsage, "42")
		}
	})
	f := NewForwarder("origin", tl, nil)
	defer f.Close()
	for _, tc := range []struct {
		path string
		want int
		body string
	}{
		{"/v1/completions?whole", 42, `{"usage":{}}`},
		{"/v1/completions?stream", 42, "data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n"},
		{"/v1/completions?whole,none", -1, `{"usage":{}}`},
		{"/v1/completions?stream,none", -1, "data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			w := httptest.NewRecorder()
			got, calls := -1, 0
			var bodyAtUsage string
			req := Request{Path: tc.path, Header: http.Header{}, OnUsage: func(n int) {
				got, calls, bodyAtUsage = n, calls+1, w.Body.String()
			}}
			out := f.Forward(context.Background(), w, []byte(`{}`), req, []Candidate{{Region: "peer", URL: url}})
			if out.Region != "peer" || out.Err != nil || out.Usage != tc.want {
				t.Fatalf("outcome %+v, want served by peer with usage %d", out, tc.want)
			}
			if w.Body.String() != tc.body {
				t.Errorf("body %q, want %q", w.Body.String(), tc.body)
			}
			if tc.want < 0 {
				if calls != 0 {
					t.Errorf("OnUsage called %d times without a trailer", calls)
				}
				return
			}
			if calls != 1 || got != tc.want {
				t.Errorf("OnUsage got %d in %d calls, want %d once", got, calls, tc.want)
			}
			if strings.Contains(bodyAtUsage, "[DONE]") || strings.Contains(bodyAtUsage, "usage") {
				t.Errorf("the client had the end (%q) before the usage settled", bodyAtUsage)
			}
		})
	}
}
