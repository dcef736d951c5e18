package frontend

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
	"github.com/pdserve/pdserve/pkg/region"
)

// forwardAll is a Regions that forwards every request to one peer with a
// real region.Forwarder, as the coordinator does, and records what it
// was asked.
type forwardAll struct {
	fwd  *region.Forwarder
	url  string
	asks chan Forwardable
}

func (f *forwardAll) Forward(w http.ResponseWriter, r *http.Request, body []byte, fa Forwardable) Forwarded {
	f.asks <- fa
	out := f.fwd.Forward(r.Context(), w, body, region.Request{
		Path: fa.Route, Key: fa.Key, Tenant: fa.Tenant, Header: r.Header, OnUsage: fa.Settle,
		TTFTBudget: fa.Objective.TTFTBudget, Network: fa.ClientRTT, Arrival: fa.Arrival,
	}, []region.Candidate{{Region: "peer", URL: f.url}})
	return Forwarded{Region: out.Region, Origin: "origin", Status: out.Status, Err: out.Err}
}

// startForwardingPair starts a peer frontend behind a mutual-TLS region
// listener that, as the coordinator's, takes the forwarded identity and
// sends the request's usage as the HeaderUsage trailer, and an origin
// frontend forwarding every request there. Both load the same key file
// (each region its own copy of the key), with the fake clock.
func startForwardingPair(t *testing.T, keys string, clock *fakeClock, text string, originEdit ...func(*Options)) (origin, peer *testServer) {
	t.Helper()
	ca := tlstest.NewCA(t, "region test CA")
	leaf := ca.Issue(t, tlstest.Leaf{IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	tl, err := grpcnet.TLSOptions{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile, CAFile: ca.CertFile}.Load(grpcnet.TLSServe|grpcnet.TLSDial, nil)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(o *Options) { o.APIKeys, o.Now = loadKeys(t, keys), clock.Now }
	peer = newTestServer(t, &fakeBackend{complete: echoText(text)}, edit)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: region.ServerTLS(tl), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "peers only", http.StatusForbidden)
			return
		}
		used := -1
		fw := Forwarded{Origin: r.Header.Get(region.HeaderOrigin), Key: r.Header.Get(region.HeaderKey), Tenant: r.Header.Get(region.HeaderTenant),
			Usage: func(n int) { used = n }}
		peer.srv.ServeHTTP(w, r.WithContext(WithForwarded(r.Context(), fw)))
		if used >= 0 {
			w.Header().Set(http.TrailerPrefix+region.HeaderUsage, strconv.Itoa(used))
		}
	})}
	go func() { _ = srv.ServeTLS(lis, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	fwd := region.NewForwarder("origin", tl, nil)
	t.Cleanup(fwd.Close)
	regs := &forwardAll{fwd: fwd, url: "https://" + lis.Addr().String(), asks: make(chan Forwardable, 16)}
	origin = newTestServerConfig(t, &fakeBackend{complete: echoText("never served here")}, func(o *Options) {
		edit(o)
		o.Regions = regs
		for _, e := range originEdit {
			e(o)
		}
	}, func(ts *httptest.Server) { ts.Config.ConnContext = ConnContext })
	return origin, peer
}

// TestForwardedTokensSettleAtOrigin: a request forwarded to another
// region is charged once, at the origin, its whole allowance, then
// settled to what it used there (prompt + output, from the serving
// region's usage), streamed or not, before the client sees its end; the
// serving region charges its own copy of the key nothing. Before, the
// origin kept the whole allowance (15 tokens here where 8 were used).
func TestForwardedTokensSettleAtOrigin(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	keys := keyFile(t, keyTeamA+" name=team-a tpm=100")
	origin, peer := startForwardingPair(t, keys, clock, "xyz")
	auth := []string{"Authorization", "Bearer " + keyTeamA}
	remaining := func(resp *http.Response) int {
		t.Helper()
		n, err := strconv.Atoi(resp.Header.Get("x-ratelimit-remaining-tokens"))
		if err != nil {
			t.Fatalf("x-ratelimit-remaining-tokens %q", resp.Header.Get("x-ratelimit-remaining-tokens"))
		}
		return n
	}
	// Prompt "abcde": 5 tokens; max_tokens 10: 15 asked, 8 used (3 output).
	for i, body := range []string{`{"prompt":"abcde","max_tokens":10}`, `{"prompt":"abcde","max_tokens":10,"stream":true}`} {
		resp := origin.post(t, RouteCompletions, body, auth...)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(region.HeaderServed) != "peer" {
			t.Fatalf("request %d: status %d, served by %q: %s", i, resp.StatusCode, resp.Header.Get(region.HeaderServed), b)
		}
		// The charge of this request is on its own headers: 100 − 8×i − 15.
		if got, want := remaining(resp), 100-8*i-15; got != want {
			t.Errorf("request %d: %d tokens remaining at its start, want %d", i, got, want)
		}
	}
	// The next request sees both settled to 8 each: 100 − 16 − its 15.
	resp := origin.post(t, RouteCompletions, `{"prompt":"abcde","max_tokens":10}`, auth...)
	_, _ = io.ReadAll(resp.Body)
	if got := remaining(resp); got != 100-16-15 {
		t.Errorf("after two forwarded requests: %d tokens remaining, want %d (each settled to its 8 used)", got, 100-16-15)
	}
	// The peer's copy of the key was never charged: a request of the
	// client there takes its first 15 from a full bucket.
	resp = peer.post(t, RouteCompletions, `{"prompt":"abcde","max_tokens":10}`, auth...)
	_, _ = io.ReadAll(resp.Body)
	if got := remaining(resp); resp.StatusCode != http.StatusOK || got != 100-15 {
		t.Errorf("peer: status %d, %d tokens remaining, want 200 and %d (nothing charged there before)", resp.StatusCode, got, 100-15)
	}
}

// TestForwardedWithoutModelChargedUsage: a request forwarded because no
// model serves it at the origin, which could not count its tokens before
// it ran, is charged there the tokens it used in the serving region.
// Before, its tokens were charged nowhere.
func TestForwardedWithoutModelChargedUsage(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	keys := keyFile(t, keyTeamA+" name=team-a tpm=100")
	origin, _ := startForwardingPair(t, keys, clock, "xyz", func(o *Options) {
		o.Models = func() []Model { return nil }
	})
	auth := []string{"Authorization", "Bearer " + keyTeamA}
	// The one token reserved shows at its start: 100 − 1, then 8 each.
	for i, want := range []string{"99", "91", "83"} {
		resp := origin.post(t, RouteCompletions, `{"prompt":"abcde","max_tokens":10}`, auth...)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(region.HeaderServed) != "peer" {
			t.Fatalf("request %d: status %d, served by %q: %s", i, resp.StatusCode, resp.Header.Get(region.HeaderServed), b)
		}
		// 5 prompt + 3 output tokens each, settled once it ended.
		if got := resp.Header.Get("x-ratelimit-remaining-tokens"); got != want {
			t.Errorf("request %d: %s tokens remaining at its start, want %s", i, got, want)
		}
	}
}

// TestForwardableBudget: the origin hands the region placement the
// client's budget, its arrival and its measured RTT, from which the
// budget left for a peer is computed (region.Request.Left).
func TestForwardableBudget(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	keys := keyFile(t, keyTeamA+" name=team-a tpm=1000")
	origin, _ := startForwardingPair(t, keys, clock, "x")
	resp := origin.post(t, RouteCompletions, `{"prompt":"a","max_tokens":1}`, "Authorization", "Bearer "+keyTeamA, HeaderTTFTBudget, "250")
	_, _ = io.ReadAll(resp.Body)
	fa := <-origin.srv.o.Regions.(*forwardAll).asks
	if fa.Objective.TTFTBudget != 250*time.Millisecond || !fa.Arrival.Equal(clock.Now()) || fa.ClientRTT <= 0 {
		t.Errorf("forwarded budget %v, arrival %v, client RTT %v; want 250ms, %v, measured", fa.Objective.TTFTBudget, fa.Arrival, fa.ClientRTT, clock.Now())
	}
}

// TestForwardedByAvailabilityOwesItsTokens: a request forwarded because
// no model serves it at the origin is charged as every other request:
// it reserves (the one token it cannot fail to use, refused when the
// bucket cannot give it) and is settled to what it used, into debt. With
// 10 tokens a minute and 8 used each, the second leaves the key 6 in
// debt, so the third is refused for the 42 s the refill takes to pay 7
// back. Before, the bucket stopped at empty and forwarded requests went
// on for free.
func TestForwardedByAvailabilityOwesItsTokens(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	keys := keyFile(t, keyTeamA+" name=team-a tpm=10")
	origin, _ := startForwardingPair(t, keys, clock, "xyz", func(o *Options) {
		o.Models = func() []Model { return nil }
	})
	auth := []string{"Authorization", "Bearer " + keyTeamA}
	post := func() *http.Response {
		t.Helper()
		resp := origin.post(t, RouteCompletions, `{"prompt":"abcde","max_tokens":10}`, auth...)
		return resp
	}
	for i := range 2 {
		resp := post()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(region.HeaderServed) != "peer" {
			t.Fatalf("request %d: status %d, served by %q: %s", i, resp.StatusCode, resp.Header.Get(region.HeaderServed), b)
		}
	}
	resp := post()
	e := errorBody(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || deref(e.Code) != "rate_limit_exceeded" || resp.Header.Get("Retry-After") != "42" {
		t.Fatalf("third request, 6 tokens in debt: %d %s Retry-After %q; want 429 rate_limit_exceeded, Retry-After 42",
			resp.StatusCode, deref(e.Code), resp.Header.Get("Retry-After"))
	}
	clock.Advance(42 * time.Second)
	resp = post()
	_, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(region.HeaderServed) != "peer" {
		t.Errorf("42 s later: status %d, served by %q; want 200 from the peer", resp.StatusCode, resp.Header.Get(region.HeaderServed))
	}
}

// forwardWatcher is a Backend that records the requests the frontend
// reports as served in another region (ForwardObserver).
type forwardWatcher struct {
	*fakeBackend
	mu        sync.Mutex
	forwarded []string
}

func (f *forwardWatcher) ObserveForwarded(req *Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forwarded = append(f.forwarded, fmt.Sprintf("%s %d+%d", req.Trace.Model, req.Trace.PromptTokens, req.MaxTokens))
}

func (f *forwardWatcher) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.forwarded)
}

// placedHere is a Regions that places every request here (Forward with
// a model served here declines) and forwards only what the pools here
// could not serve (Served "": unavailable before the first token).
type placedHere struct{ *forwardAll }

func (p placedHere) Forward(w http.ResponseWriter, r *http.Request, body []byte, fa Forwardable) Forwarded {
	if fa.Served != "" {
		return Forwarded{}
	}
	return p.forwardAll.Forward(w, r, body, fa)
}

// TestForwardedIsDemandHere: each prompt of a request of a model served
// here that another region served is reported to the Backend (a
// ForwardObserver: the coordinator's planner counts it as demand), with
// its model, prompt tokens and max_tokens, once that region's response
// ended: placed there, or sent there when the pools here were unavailable
// before its first token. A request of no model served here is not (no
// planner here plans for it). Before, the origin's planner never saw the
// users it passed on.
func TestForwardedIsDemandHere(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	keys := keyFile(t, keyTeamA+" name=team-a tpm=1000")
	auth := []string{"Authorization", "Bearer " + keyTeamA}
	for _, tc := range []struct {
		name, body  string
		models      bool
		unavailable bool // placed here, the pools unavailable: sent elsewhere
		want        []string
	}{
		{"one prompt", `{"model":"tiny","prompt":"abcde","max_tokens":10}`, true, false, []string{"tiny 5+10"}},
		{"streamed", `{"model":"tiny","prompt":"abc","max_tokens":4,"stream":true}`, true, false, []string{"tiny 3+4"}},
		{"two prompts", `{"model":"tiny","prompt":["ab","abcd"],"max_tokens":6}`, true, false, []string{"tiny 2+6", "tiny 4+6"}},
		{"unavailable here", `{"model":"tiny","prompt":"abcdef","max_tokens":3}`, true, true, []string{"tiny 6+3"}},
		{"no model here", `{"model":"tiny","prompt":"abcde","max_tokens":10}`, false, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &forwardWatcher{fakeBackend: &fakeBackend{complete: echoText("never served here")}}
			if tc.unavailable {
				w.fakeBackend.complete = func(context.Context, *Request, EmitFunc) ([]string, error) {
					return nil, fmt.Errorf("no decode worker: %w", ErrUnavailable)
				}
			}
			origin, _ := startForwardingPair(t, keys, clock, "xyz", func(o *Options) {
				o.Backend = w
				if !tc.models {
					o.Models = func() []Model { return nil }
				}
				if tc.unavailable {
					o.Regions = placedHere{o.Regions.(*forwardAll)}
				}
			})
			resp := origin.post(t, RouteCompletions, tc.body, auth...)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || resp.Header.Get(region.HeaderServed) != "peer" {
				t.Fatalf("status %d, served by %q: %s", resp.StatusCode, resp.Header.Get(region.HeaderServed), b)
			}
			got := w.took()
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("forwarded demand %q, want %q", got, tc.want)
			}
		})
	}
}
