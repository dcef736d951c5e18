package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/pkg/config"
)

// countingBackend runs modelBackend, counting its calls (one per prompt),
// and fills worker fields of the trace as a real Backend does.
type countingBackend struct {
	calls atomic.Int32
	fail  atomic.Bool // fail the next call (then clear)
}

func (b *countingBackend) Complete(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
	b.calls.Add(1)
	if b.fail.CompareAndSwap(true, false) {
		return nil, errors.New("worker exploded")
	}
	req.Trace.DecodeWorker, req.Trace.Mode = "d0", "colocated"
	return modelBackend().Complete(ctx, req, emit)
}

// cacheServer is a test server with a response cache of entries and ttl
// on a fake clock.
func cacheServer(t *testing.T, b Backend, entries int, ttl time.Duration, edit func(*Options)) (*testServer, *fakeClock) {
	t.Helper()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	ts := newTestServer(t, b, func(o *Options) {
		o.Now = clock.Now
		o.Policy.ResponseCache = config.ResponseCache{Entries: entries, TTL: ttl}
		if edit != nil {
			edit(o)
		}
	})
	return ts, clock
}

// response is a response reduced to what a hit must reproduce: its
// status, content type and body, every JSON object (a stream's chunks,
// or the body) re-encoded without id, created and pdserve; and the
// pdserve objects apart. A stream's chunks are sorted by choice index,
// stably: the prompts of a batch run concurrently, so the interleaving of
// their chunks varies between any two requests, misses too.
type response struct {
	status int
	ctype  string
	body   []string
	pd     []map[string]any
}

func read(t *testing.T, resp *http.Response) response {
	t.Helper()
	r := response{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type")}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var objects []string
	if strings.HasPrefix(r.ctype, "text/event-stream") {
		objects = sseData(t, strings.NewReader(string(b)))
	} else {
		objects = []string{string(b)}
	}
	for _, o := range objects {
		if o == "[DONE]" {
			r.body = append(r.body, o)
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(o), &m); err != nil {
			t.Fatalf("%q: %v", o, err)
		}
		if pd, ok := m["pdserve"].(map[string]any); ok {
			r.pd = append(r.pd, pd)
		}
		delete(m, "id")
		delete(m, "created")
		delete(m, "pdserve")
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		r.body = append(r.body, string(out))
	}
	slices.SortStableFunc(r.body, func(a, b string) int { return compareInts(chunkIndex(a), chunkIndex(b)) })
	return r
}

// chunkIndex returns the choice index of a stream chunk, MaxInt for one
// without a choice (the usage chunk, [DONE]).
func chunkIndex(chunk string) int {
	var c struct {
		Choices []struct {
			Index int `json:"index"`
		} `json:"choices"`
	}
	if json.Unmarshal([]byte(chunk), &c) != nil || len(c.Choices) != 1 {
		return math.MaxInt
	}
	return c.Choices[0].Index
}

// cacheOf returns pdserve.cache of r's last pdserve object, and of each
// prompt of a batch.
func cacheOf(t *testing.T, r response) (string, []string) {
	t.Helper()
	if len(r.pd) == 0 {
		t.Fatalf("no pdserve object in %q", r.body)
	}
	pd := r.pd[len(r.pd)-1]
	top, _ := pd["cache"].(string)
	var prompts []string
	if ps, ok := pd["prompts"].([]any); ok {
		for _, p := range ps {
			c, _ := p.(map[string]any)["cache"].(string)
			prompts = append(prompts, c)
		}
	}
	return top, prompts
}

// TestResponseCacheHit: a second identical request is served from the
// cache with the same bytes as the first (but for id, created and
// pdserve), in every shape of response, without a Backend call.
func TestResponseCacheHit(t *testing.T) {
	tests := []struct {
		name, path, body string
		prompts          int // Backend calls of a miss
	}{
		{"completions stream", RouteCompletions, `{"prompt":"hello","max_tokens":4,"temperature":0,"stream":true}`, 1},
		{"completions whole", RouteCompletions, `{"prompt":"hello","max_tokens":4,"temperature":0}`, 1},
		{"chat stream with usage", RouteChat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`, 1},
		{"chat whole with logprobs", RouteChat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"temperature":0,"logprobs":true,"top_logprobs":2}`, 1},
		{"seeded sampling", RouteCompletions, `{"prompt":"hello","max_tokens":4,"temperature":0.8,"top_p":0.9,"seed":7,"stream":true}`, 1},
		{"n choices", RouteCompletions, `{"prompt":"hello","max_tokens":4,"temperature":0,"n":3,"stream":true}`, 1},
		{"batched prompts", RouteCompletions, `{"prompt":["abc","xyz","qq"],"max_tokens":3,"temperature":0,"stream":true}`, 3},
		{"batched whole n=2", RouteCompletions, `{"prompt":["abc","xyz"],"max_tokens":3,"temperature":0,"n":2}`, 2},
		{"echo with logprobs", RouteCompletions, `{"prompt":"hello","max_tokens":3,"temperature":0,"echo":true,"logprobs":2,"stream":true}`, 1},
		{"stop string", RouteCompletions, `{"prompt":"hello","max_tokens":8,"temperature":0,"n":2,"stop":["h1"],"stream":true}`, 1},
		{"stop string whole", RouteCompletions, `{"prompt":"hello","max_tokens":8,"temperature":0,"n":2,"stop":["h0"]}`, 1},
		{"token ids", RouteCompletions, `{"prompt":"hello","max_tokens":3,"temperature":0,"return_token_ids":true,"stream":true}`, 1},
		{"presence penalty", RouteCompletions, `{"prompt":"hello","max_tokens":3,"temperature":0,"presence_penalty":1,"ignore_eos":true}`, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &countingBackend{}
			ts, _ := cacheServer(t, b, 16, time.Minute, nil)
			miss := read(t, ts.post(t, tc.path, tc.body))
			hit := read(t, ts.post(t, tc.path, tc.body))
			if got := int(b.calls.Load()); got != tc.prompts {
				t.Errorf("%d Backend calls, want %d (the miss only)", got, tc.prompts)
			}
			if miss.status != http.StatusOK {
				t.Fatalf("status %d: %q", miss.status, miss.body)
			}
			if diff := cmp.Diff(miss, hit, cmp.AllowUnexported(response{}), cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".pd" }, cmp.Ignore())); diff != "" {
				t.Errorf("hit differs from miss (-miss +hit):\n%s", diff)
			}
			want := func(c string) []string {
				if tc.prompts == 1 {
					return nil
				}
				return []string{c, c, c}[:tc.prompts]
			}
			for _, r := range []struct {
				resp response
				want string
			}{{miss, "miss"}, {hit, "hit"}} {
				top, prompts := cacheOf(t, r.resp)
				if top != r.want || !cmp.Equal(prompts, want(r.want)) {
					t.Errorf("pdserve.cache %q, prompts %q; want %q", top, prompts, r.want)
				}
			}
			pd := hit.pd[len(hit.pd)-1]
			if pd["decode_worker"] != "" || pd["mode"] != "" {
				t.Errorf("a hit's budget names a worker: %v", pd)
			}
			if m := miss.pd[len(miss.pd)-1]; m["decode_worker"] != "d0" || m["output_tokens"] != pd["output_tokens"] {
				t.Errorf("miss budget %v, hit budget %v", m, pd)
			}
		})
	}
}

// TestResponseCacheKey: requests that differ in anything shaping the
// output miss; those that differ only in rendering hit; unseeded sampled
// requests are never looked up.
func TestResponseCacheKey(t *testing.T) {
	const base = `{"prompt":"hello","max_tokens":4,"temperature":0`
	tests := []struct {
		name, path, body string
		cache            string // of the second request after base
	}{
		{"same", RouteCompletions, base + `}`, "hit"},
		{"stream only differs", RouteCompletions, base + `,"stream":true}`, "hit"},
		{"echo without logprobs renders only", RouteCompletions, base + `,"echo":true}`, "hit"},
		{"seed ignored at temperature 0", RouteCompletions, base + `,"seed":5}`, "hit"},
		{"max_tokens", RouteCompletions, `{"prompt":"hello","max_tokens":5,"temperature":0}`, "miss"},
		{"prompt", RouteCompletions, `{"prompt":"hellp","max_tokens":4,"temperature":0}`, "miss"},
		{"model", RouteCompletions, base + `,"model":"alias"}`, "miss"},
		{"n", RouteCompletions, base + `,"n":2}`, "miss"},
		{"stop", RouteCompletions, base + `,"stop":["x"]}`, "miss"},
		{"logprobs", RouteCompletions, base + `,"logprobs":1}`, "miss"},
		{"echo with logprobs", RouteCompletions, base + `,"echo":true,"logprobs":0}`, "miss"},
		{"ignore_eos", RouteCompletions, base + `,"ignore_eos":true}`, "miss"},
		{"frequency_penalty", RouteCompletions, base + `,"frequency_penalty":0.5}`, "miss"},
		{"temperature", RouteCompletions, `{"prompt":"hello","max_tokens":4,"temperature":0.5,"seed":1}`, "miss"},
		{"unseeded sampled", RouteCompletions, `{"prompt":"hello","max_tokens":4,"temperature":0.5}`, ""},
		{"default temperature unseeded", RouteCompletions, `{"prompt":"hello","max_tokens":4}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &countingBackend{}
			ts, _ := cacheServer(t, b, 16, time.Minute, nil)
			read(t, ts.post(t, RouteCompletions, base+`}`))
			r := read(t, ts.post(t, tc.path, tc.body))
			if got, _ := cacheOf(t, r); got != tc.cache {
				t.Errorf("pdserve.cache %q, want %q", got, tc.cache)
			}
			if tc.cache == "" {
				read(t, ts.post(t, tc.path, tc.body)) // still not cached
				if got := b.calls.Load(); got != 3 {
					t.Errorf("%d Backend calls, want 3", got)
				}
			}
		})
	}
}

// TestResponseCacheTTLAndEviction: on the fake clock an entry lives TTL
// after its put; the least recently used goes when the cache is full;
// the metrics count lookups, entries and both kinds of removal.
func TestResponseCacheTTLAndEviction(t *testing.T) {
	b := &countingBackend{}
	ts, clock := cacheServer(t, b, 2, 10*time.Minute, nil)
	req := func(prompt string) string {
		r := read(t, ts.post(t, RouteCompletions, `{"prompt":"`+prompt+`","max_tokens":2,"temperature":0}`))
		c, _ := cacheOf(t, r)
		return c
	}
	steps := []struct {
		advance time.Duration
		prompt  string
		want    string
	}{
		{0, "a", "miss"},
		{time.Minute, "a", "hit"},
		{0, "b", "miss"},
		{0, "a", "hit"},  // a is now more recent than b
		{0, "c", "miss"}, // evicts b
		{0, "b", "miss"}, // evicts a
		{0, "c", "hit"},  // c put at 1 min
		{10*time.Minute - time.Second, "c", "hit"}, // 9:59 after its put
		{time.Second, "c", "miss"},                 // expired: 10 min after
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		if got := req(s.prompt); got != s.want {
			t.Errorf("step %d (%s): %q, want %q", i, s.prompt, got, s.want)
		}
	}
	// At 11:00 both b and c (put at 1:00) expired; c was put again.
	const want = `
# HELP pdserve_response_cache_requests_total Response cache lookups by result: hit (replayed without a worker) or miss, one per prompt; none while the cache is off.
# TYPE pdserve_response_cache_requests_total counter
pdserve_response_cache_requests_total{result="hit"} 4
pdserve_response_cache_requests_total{result="miss"} 5
# HELP pdserve_response_cache_entries Responses held by the response cache.
# TYPE pdserve_response_cache_entries gauge
pdserve_response_cache_entries 1
# HELP pdserve_response_cache_evictions_total Responses removed from the response cache, by reason: capacity (the entries or bytes bound) or ttl (expired).
# TYPE pdserve_response_cache_evictions_total counter
pdserve_response_cache_evictions_total{reason="capacity"} 2
pdserve_response_cache_evictions_total{reason="ttl"} 2
`
	if err := testutil.GatherAndCompare(ts.reg, strings.NewReader(want),
		"pdserve_response_cache_requests_total", "pdserve_response_cache_entries", "pdserve_response_cache_evictions_total"); err != nil {
		t.Error(err)
	}
	if got := b.calls.Load(); got != 5 {
		t.Errorf("%d Backend calls, want 5 (the misses)", got)
	}
}

// TestResponseCacheNotStored: a request that failed, or whose client went
// away, is not stored; the next identical request runs the Backend.
func TestResponseCacheNotStored(t *testing.T) {
	const body = `{"prompt":"hello","max_tokens":4,"temperature":0,"stream":true}`
	t.Run("error", func(t *testing.T) {
		b := &countingBackend{}
		b.fail.Store(true)
		ts, _ := cacheServer(t, b, 16, time.Minute, nil)
		if r := ts.post(t, RouteCompletions, body); r.StatusCode != http.StatusInternalServerError {
			t.Fatalf("status %d, want 500", r.StatusCode)
		}
		if c, _ := cacheOf(t, read(t, ts.post(t, RouteCompletions, body))); c != "miss" {
			t.Errorf("after an error: %q, want miss", c)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		release := make(chan struct{})
		var calls atomic.Int32
		b := &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
			if calls.Add(1) == 1 {
				if err := emit(Output{Tokens: []int32{'a'}}); err != nil {
					return nil, err
				}
				close(release)
				<-ctx.Done() // the client went away
				return nil, ctx.Err()
			}
			return modelBackend().Complete(ctx, req, emit)
		}}
		ts, _ := cacheServer(t, b, 16, time.Minute, nil)
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+RouteCompletions, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		<-release
		cancel()
		resp.Body.Close()
		if c, _ := cacheOf(t, read(t, ts.post(t, RouteCompletions, body))); c != "miss" {
			t.Errorf("after a cancelled request: %q, want miss", c)
		}
		if got := calls.Load(); got != 2 {
			t.Errorf("%d Backend calls, want 2", got)
		}
	})
}

// TestResponseCacheConcurrent: identical requests at once (-race) all get
// the same response; there is no single-flight, so each that missed ran
// the Backend; the next one hits.
func TestResponseCacheConcurrent(t *testing.T) {
	const body = `{"prompt":["abc","def"],"max_tokens":4,"temperature":0,"n":2,"stream":true}`
	b := &countingBackend{}
	ts, _ := cacheServer(t, b, 16, time.Minute, nil)
	const k = 16
	got := make([]response, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, ts.URL+RouteCompletions, strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			got[i] = read(t, resp)
		})
	}
	wg.Wait()
	last := read(t, ts.post(t, RouteCompletions, body))
	if c, _ := cacheOf(t, last); c != "hit" {
		t.Errorf("after %d identical requests: %q, want hit", k, c)
	}
	misses := 0 // prompts: a request may hit one and miss the other
	for i, r := range got {
		if diff := cmp.Diff(last.body, r.body); diff != "" {
			t.Errorf("request %d differs (-last +got):\n%s", i, diff)
		}
		_, prompts := cacheOf(t, r)
		misses += strings.Count(strings.Join(prompts, ","), "miss")
	}
	if calls := int(b.calls.Load()); calls != misses {
		t.Errorf("%d Backend calls for %d prompt misses", calls, misses)
	}
}

// TestResponseCacheOff: without the policy section nothing changes: no
// pdserve.cache, no cache metrics, every request runs the Backend.
func TestResponseCacheOff(t *testing.T) {
	b := &countingBackend{}
	core, logs := observer.New(zap.InfoLevel)
	ts := newTestServer(t, b, func(o *Options) { o.Logger = zap.New(core) })
	const body = `{"prompt":"hello","max_tokens":4,"temperature":0}`
	for range 2 {
		r := read(t, ts.post(t, RouteCompletions, body))
		if _, ok := r.pd[0]["cache"]; ok {
			t.Errorf("pdserve.cache with the cache off: %v", r.pd[0])
		}
	}
	if got := b.calls.Load(); got != 2 {
		t.Errorf("%d Backend calls, want 2", got)
	}
	if ts.srv.cache != nil {
		t.Error("a cache exists with the policy off")
	}
	n, err := testutil.GatherAndCount(ts.reg, "pdserve_response_cache_requests_total", "pdserve_response_cache_entries")
	if err != nil || n != 0 {
		t.Errorf("%d cache series (err %v), want 0", n, err)
	}
	for _, e := range logs.All() {
		if _, ok := e.ContextMap()["cache"]; ok {
			t.Errorf("log line with cache: %v", e.ContextMap())
		}
	}
}

// TestResponseCacheLog: the request log line says hit or miss.
func TestResponseCacheLog(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	ts, _ := cacheServer(t, &countingBackend{}, 4, time.Minute, func(o *Options) { o.Logger = zap.New(core) })
	const body = `{"prompt":"hello","max_tokens":4,"temperature":0}`
	read(t, ts.post(t, RouteCompletions, body))
	read(t, ts.post(t, RouteCompletions, body))
	var got []any
	for _, e := range logs.FilterMessage("request").All() {
		got = append(got, e.ContextMap()["cache"])
	}
	if diff := cmp.Diff([]any{"miss", "hit"}, got); diff != "" {
		t.Errorf("log cache fields (-want +got):\n%s", diff)
	}
}

func compareInts(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
