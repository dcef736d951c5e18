package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/tokenizer"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// prompts used for output comparisons: short, multi-chunk (chunks are 16
// tokens in tests), non-ASCII, and as token ids.
var prompts = []struct {
	name   string
	prompt any
	ids    []int32
}{
	{name: "short", prompt: "Hi"},
	{name: "sentence", prompt: "The quick brown fox jumps over the lazy dog."},
	{name: "long", prompt: strings.Repeat("pdserve splits prefill from decode. ", 4)},
	{name: "unicode", prompt: "Grüße, 世界 ✓"},
	{name: "token ids", prompt: []int32{1, 2, 3, 250, 100, 42, 7, 7, 7}},
}

func promptIDs(p any) []int32 {
	switch p := p.(type) {
	case string:
		return tokenizer.Bytes{}.Encode(p)
	case []int32:
		return p
	}
	panic(fmt.Sprintf("prompt of type %T", p))
}

// Outputs in every mode, streamed or not, equal the engine run alone.
func TestOutputsMatchEngine(t *testing.T) {
	ref := newReference(t)
	seed := int64(42)
	modes := []struct {
		name string
		co   clusterOpts
	}{
		{"disaggregated first token from prefill", clusterOpts{}},
		{"disaggregated first token from decode", clusterOpts{edit: func(o *coordinator.Options) { o.FirstTokenPolicy = coordinator.PolicyDecode }}},
		{"disaggregated with local prefill of short prompts", clusterOpts{edit: func(o *coordinator.Options) {
			edit(o, func(p *config.Policy) { p.Routing.LocalPrefillBelowTokens = 20 })
		}}},
		{"colocated", clusterOpts{mode: coordinator.ModeColocated}},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			cl := startCluster(t, mode.co)
			for _, p := range prompts {
				for _, v := range []struct{ stream, sampled bool }{{false, false}, {true, false}, {true, true}} {
					req := request{Prompt: p.prompt, MaxTokens: 20, IgnoreEOS: true, Stream: v.stream}
					var s engine.Sampling
					if v.sampled {
						req.Temperature, req.Seed = 0.9, &seed
						s = engine.Sampling{Temperature: 0.9, Seed: uint64(seed)}
					}
					t.Run(fmt.Sprintf("%s/stream=%v/sampled=%v", p.name, v.stream, v.sampled), func(t *testing.T) {
						want := ref.generate(t, promptIDs(p.prompt), req.MaxTokens, s, true)
						got := complete(context.Background(), t, cl.url, req)
						if diff := cmp.Diff(want, got.Tokens); diff != "" {
							t.Errorf("tokens (-engine alone +served):\n%s", diff)
						}
						if wantText := clientText(t, tokenizer.Bytes{}, want); got.Text != wantText {
							t.Errorf("text %q, want %q", got.Text, wantText)
						}
						if got.Finish != "length" {
							t.Errorf("finish_reason %q, want length", got.Finish)
						}
						checkBudget(t, got.Budget, len(promptIDs(p.prompt)), len(want))
					})
				}
			}
			// A stop string cuts the output before it and ends the request
			// on the workers.
			t.Run("stop string", func(t *testing.T) {
				p := promptIDs(prompts[2].prompt)
				full := ref.generate(t, p, 40, engine.Sampling{}, true)
				at := slices.IndexFunc(full[2:], func(id int32) bool { return id >= ' ' && id < 127 })
				if at < 0 {
					t.Skip("no printable ASCII token in the reference output to stop at")
				}
				stop := full[2+at]
				cut := slices.Index(full, stop)
				got := complete(context.Background(), t, cl.url, request{Prompt: p, MaxTokens: 40, IgnoreEOS: true, Stream: true, Stop: []string{string(rune(stop))}})
				if wantText := clientText(t, tokenizer.Bytes{}, full[:cut]); got.Text != wantText || got.Finish != "stop" {
					t.Errorf("text %q finish %q, want %q stop", got.Text, got.Finish, wantText)
				}
			})
			// EOS ends a request early unless ignore_eos: same as the engine.
			t.Run("eos honoured", func(t *testing.T) {
				p := promptIDs(prompts[1].prompt)
				want := ref.generate(t, p, 200, engine.Sampling{}, false)
				got := complete(context.Background(), t, cl.url, request{Prompt: p, MaxTokens: 200, Stream: true})
				if diff := cmp.Diff(want, got.Tokens); diff != "" {
					t.Errorf("tokens (-engine alone +served):\n%s", diff)
				}
			})
			waitFor(t, 5*time.Second, func() error { return cl.idle(t) })
		})
	}
}

// checkBudget checks the pdserve object of a finished request.
func checkBudget(t *testing.T, b map[string]any, promptTokens, outputTokens int) {
	t.Helper()
	if b == nil {
		t.Fatal("no pdserve object")
	}
	for _, k := range []string{"ttft_ms", "queue_ms", "prefill_ms", "kv_transfer_ms", "decode_ms", "e2e_ms",
		"kv_bytes_raw", "kv_bytes_wire", "codec", "prefill_worker", "decode_worker", "first_token_policy"} {
		if _, ok := b[k]; !ok {
			t.Errorf("pdserve object lacks %s: %v", k, b)
		}
	}
	if b["prompt_tokens"] != float64(promptTokens) || b["output_tokens"] != float64(outputTokens) {
		t.Errorf("pdserve tokens %v/%v, want %d/%d", b["prompt_tokens"], b["output_tokens"], promptTokens, outputTokens)
	}
	if e2e, ttft := b["e2e_ms"].(float64), b["ttft_ms"].(float64); ttft <= 0 || e2e < ttft {
		t.Errorf("ttft %v ms, e2e %v ms", ttft, e2e)
	}
	if b["decode_worker"] == "" {
		t.Errorf("no decode worker in %v", b)
	}
	if b["mode"] == coordinator.ModeDisaggregated {
		if b["prefill_worker"] == "" || b["kv_bytes_raw"].(float64) <= 0 || b["kv_bytes_wire"].(float64) <= 0 || b["codec"] == "" {
			t.Errorf("disaggregated request without KV transfer facts: %v", b)
		}
		if b["prefill_ms"].(float64) <= 0 {
			t.Errorf("prefill_ms %v", b["prefill_ms"])
		}
	}
}

// 64 concurrent streams all complete with the engine's outputs.
func TestConcurrentStreams(t *testing.T) {
	ref := newReference(t)
	cl := startCluster(t, clusterOpts{prefill: 1, decode: 2})
	const n = 64
	wants := make([][]int32, n)
	reqs := make([]request, n)
	for i := range n {
		p := tokenizer.Bytes{}.Encode(fmt.Sprintf("request %d: %s", i, strings.Repeat("x", i%23)))
		reqs[i] = request{Prompt: p, MaxTokens: 8 + i%9, IgnoreEOS: true, Stream: true}
		wants[i] = ref.generate(t, p, reqs[i].MaxTokens, engine.Sampling{}, true)
	}
	var wg sync.WaitGroup
	results := make([]result, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			resp, err := postErr(context.Background(), cl.url+"/v1/completions", withIDs(reqs[i]))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				errs[i] = fmt.Errorf("status %d: %s", resp.StatusCode, b)
				return
			}
			results[i], errs[i] = readStream(resp.Body)
		})
	}
	wg.Wait()
	decodes := map[string]int{}
	for i := range n {
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
			continue
		}
		if diff := cmp.Diff(wants[i], results[i].Tokens); diff != "" {
			t.Errorf("request %d tokens (-engine alone +served):\n%s", i, diff)
		}
		decodes[fmt.Sprint(results[i].Budget["decode_worker"])]++
	}
	if len(decodes) != 2 {
		t.Errorf("requests per decode worker %v: want both workers used", decodes)
	}
	waitFor(t, 5*time.Second, func() error { return cl.idle(t) })
}

func withIDs(r request) request {
	r.ReturnTokenIDs = true
	return r
}

func postErr(ctx context.Context, url string, body any) (*http.Response, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(data)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

// openStream starts a streaming request and reads until it has at least
// min tokens; the caller owns the response.
func openStream(ctx context.Context, t *testing.T, url string, req request, min int) (*http.Response, []int32) {
	t.Helper()
	req.Stream, req.ReturnTokenIDs = true, true
	resp := post(ctx, t, url+"/v1/completions", req)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var toks []int32
	buf := make([]byte, 0, 4096)
	one := make([]byte, 1)
	for len(toks) < min {
		// Read one event (up to the blank line).
		buf = buf[:0]
		for !strings.HasSuffix(string(buf), "\n\n") {
			if _, err := resp.Body.Read(one); err != nil {
				t.Fatalf("reading stream after %d tokens: %v", len(toks), err)
			}
			buf = append(buf, one[0])
		}
		var ch struct {
			Choices []struct {
				TokenIDs []int32 `json:"token_ids"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(string(buf)), "data: ")), &ch); err != nil {
			t.Fatalf("event %q: %v", buf, err)
		}
		for _, c := range ch.Choices {
			toks = append(toks, c.TokenIDs...)
		}
	}
	return resp, toks
}

// A client that disconnects mid-stream cancels the request on both workers:
// their KV returns to the starting counts.
func TestClientDisconnectFreesKV(t *testing.T) {
	for _, mode := range []string{coordinator.ModeDisaggregated, coordinator.ModeColocated} {
		t.Run(mode, func(t *testing.T) {
			checkNoLeaks(t)
			cl := startCluster(t, clusterOpts{mode: mode, gated: true})
			var g *gatedEngine
			for _, ge := range cl.gates {
				g = ge
			}
			g.allow(3)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, toks := openStream(ctx, t, cl.url, request{Prompt: "cancel me please", MaxTokens: 500, IgnoreEOS: true}, 2)
			defer resp.Body.Close()
			if len(toks) >= 500 {
				t.Fatalf("request finished before the disconnect")
			}
			if err := cl.idle(t); err == nil {
				t.Fatalf("workers idle while a request is in flight")
			}
			cancel()
			g.open()
			waitFor(t, 10*time.Second, func() error { return cl.idle(t) })
			waitFor(t, 5*time.Second, func() error {
				if v := counter(t, cl, "pdserve_requests_total", "status", "cancelled"); v != 1 {
					return fmt.Errorf("cancelled requests %v, want 1", v)
				}
				return nil
			})
		})
	}
}

// checkNoLeaks verifies, once the test and its cleanups (a cluster
// started after this call) are done, that no goroutine started during the
// test is left.
func checkNoLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// counter returns a gathered counter's value with one label.
func counter(t *testing.T, cl *cluster, name, label, value string) float64 {
	t.Helper()
	mfs, err := cl.c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// activeDecode returns the id of the decode worker whose engine has run
// steps, waiting until exactly one has.
func activeDecode(t *testing.T, cl *cluster) string {
	t.Helper()
	var id string
	waitFor(t, 5*time.Second, func() error {
		id = ""
		for wid, g := range cl.gates {
			if g.steps.Load() > 0 {
				if id != "" {
					return errors.New("two decode workers ran steps")
				}
				id = wid
			}
		}
		if id == "" {
			return errors.New("no decode worker ran a step")
		}
		return nil
	})
	return id
}

// gatedStream opens a greedy 40-token stream of text on cl (its decode
// workers gated) and reads its first 3 tokens, toks; then only the decode
// worker running it, active, stays held (pinActive). want is the engine
// alone's output; the caller reads the rest of resp and closes it.
func gatedStream(t *testing.T, ref *reference, cl *cluster, text string) (resp *http.Response, toks, want []int32, active string) {
	t.Helper()
	for _, g := range cl.gates {
		g.allow(4)
	}
	prompt := tokenizer.Bytes{}.Encode(text)
	want = ref.generate(t, prompt, 40, engine.Sampling{}, true)
	resp, toks = openStream(context.Background(), t, cl.url, request{Prompt: prompt, MaxTokens: 40, IgnoreEOS: true}, 3)
	return resp, toks, want, pinActive(t, cl)
}

// pinActive returns the decode worker running the gated stream just
// opened (activeDecode) and opens every other decode worker's gate, so
// that only it stays held.
func pinActive(t *testing.T, cl *cluster) string {
	t.Helper()
	id := activeDecode(t, cl)
	for wid, g := range cl.gates {
		if wid != id {
			g.open()
		}
	}
	return id
}

// checkRest reads the rest of stream resp, whose first tokens toks were
// read, and checks that the whole is want, the engine alone's output,
// across what happened mid-stream (what: "a failover", "a migration"); it
// returns the rest and the whole.
func checkRest(t *testing.T, resp *http.Response, toks, want []int32, what string) (result, []int32) {
	t.Helper()
	rest, err := readStream(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if rest.Err != "" {
		t.Fatalf("stream failed: %s", rest.Err)
	}
	got := append(slices.Clone(toks), rest.Tokens...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tokens (-engine alone +served with %s):\n%s", what, diff)
	}
	return rest, got
}

func worker(cl *cluster, id string) *workerrun.Worker {
	for _, w := range cl.c.Workers() {
		if w.ID() == id {
			return w
		}
	}
	return nil
}

// A decode worker that dies mid-request: the request finishes on the other
// decode worker from KV re-sent by the prefill worker (or prefilled again
// locally in colocated mode), with the same output.
func TestDecodeWorkerFailureRecovers(t *testing.T) {
	ref := newReference(t)
	for _, mode := range []string{coordinator.ModeDisaggregated, coordinator.ModeColocated} {
		t.Run(mode, func(t *testing.T) {
			checkNoLeaks(t)
			cl := startCluster(t, clusterOpts{mode: mode, decode: 2, gated: true})
			resp, toks, want, victim := gatedStream(t, ref, cl, "recover this request, please")
			defer resp.Body.Close()
			if err := worker(cl, victim).Kill(); err != nil {
				t.Logf("kill %s: %v", victim, err)
			}
			rest, _ := checkRest(t, resp, toks, want, "a failover")
			if rest.Budget["recoveries"] != 1.0 || rest.Budget["decode_worker"] == victim {
				t.Errorf("budget %v: want 1 recovery onto the other worker", rest.Budget)
			}
			waitFor(t, 10*time.Second, func() error { return idleExcept(t, cl, victim) })
		})
	}
}

// idleExcept is cluster.idle ignoring one (dead) worker.
func idleExcept(t *testing.T, cl *cluster, dead string) error {
	for _, w := range cl.c.Workers() {
		if w.ID() == dead {
			continue
		}
		if w.Role() == control.RolePrefill {
			if b, _ := gauge(t, cl.c.Registry(), "pdserve_prefill_retained_bytes", w.ID()); b != 0 {
				return fmt.Errorf("prefill worker %s retains %v bytes", w.ID(), b)
			}
			continue
		}
		free, _ := gauge(t, cl.c.Registry(), "pdserve_kv_blocks_free", w.ID())
		total, _ := gauge(t, cl.c.Registry(), "pdserve_kv_blocks_capacity", w.ID())
		if free != total {
			return fmt.Errorf("decode worker %s has %v of %v KV blocks free", w.ID(), free, total)
		}
	}
	return nil
}

// With no other decode worker, a failure mid-stream ends the stream with a
// clear error event and frees the prefill worker's KV.
func TestDecodeWorkerFailureWithoutSpare(t *testing.T) {
	checkNoLeaks(t)
	cl := startCluster(t, clusterOpts{decode: 1, gated: true})
	var victim string
	for id, g := range cl.gates {
		victim = id
		g.allow(3)
	}
	resp, _ := openStream(context.Background(), t, cl.url, request{Prompt: "doomed", MaxTokens: 40, IgnoreEOS: true}, 2)
	defer resp.Body.Close()
	if err := worker(cl, victim).Kill(); err != nil {
		t.Logf("kill %s: %v", victim, err)
	}
	rest, err := readStream(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rest.Err, "no other decode worker") {
		t.Errorf("error event %q, want one saying no other decode worker could take the request", rest.Err)
	}
	waitFor(t, 10*time.Second, func() error { return idleExcept(t, cl, victim) })
}

// Bad input gets a 4xx OpenAI-shaped error.
func TestBadInput(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("prompt_budgets: {default: 1000, api_keys: {tiny-key: 4}}\nlimits: {max_tokens_cap: 200}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) { o.PolicyFile = policy }})
	tests := []struct {
		name, body, key string
		code            string
	}{
		{"malformed json", `{"prompt": "a"`, "", "invalid_json"},
		{"empty prompt", `{"prompt": ""}`, "", "empty_prompt"},
		{"prompt over default budget", `{"prompt": "` + strings.Repeat("a", 1001) + `"}`, "", "prompt_too_long"},
		{"prompt over api key budget", `{"prompt": "abcde"}`, "tiny-key", "prompt_too_long"},
		{"max_tokens over cap", `{"prompt": "a", "max_tokens": 201}`, "", "max_tokens_over_cap"},
		{"n over 128", `{"prompt": "a", "n": 129}`, "", "invalid_value"},
		// tiny's context is 1024 tokens: refused by the coordinator, with
		// no worker asked.
		{"over the context", `{"prompt": "` + strings.Repeat("a", 900) + `", "max_tokens": 200}`, "", "context_length_exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, cl.url+"/v1/completions", strings.NewReader(tc.body))
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest || body.Error.Type != "invalid_request_error" || body.Error.Code == nil || *body.Error.Code != tc.code {
				t.Errorf("status %d error %+v, want 400 invalid_request_error %s", resp.StatusCode, body.Error, tc.code)
			}
		})
	}
	// A request the workers refuse (prompt + max_tokens over the model's
	// 1024 tokens) is a 400 too, and leaks nothing.
	t.Run("over the model's maximum length", func(t *testing.T) {
		resp := post(context.Background(), t, cl.url+"/v1/completions", request{Prompt: strings.Repeat("z", 900), MaxTokens: 200})
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "1024") {
			t.Errorf("status %d: %s; want 400 naming the model's maximum of 1024 tokens", resp.StatusCode, b)
		}
	})
	waitFor(t, 5*time.Second, func() error { return cl.idle(t) })
}

// More requests than limits.queue_limit, or than the decode workers' KV can
// hold, get 429 with Retry-After.
func TestOverload(t *testing.T) {
	t.Run("queue limit", func(t *testing.T) {
		cl := startCluster(t, clusterOpts{gated: true, edit: func(o *coordinator.Options) { edit(o, func(p *config.Policy) { p.Limits.QueueLimit = 1 }) }})
		var g *gatedEngine
		for _, ge := range cl.gates {
			g = ge
		}
		g.allow(2)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp, _ := openStream(ctx, t, cl.url, request{Prompt: "hold the only slot", MaxTokens: 100, IgnoreEOS: true}, 1)
		defer resp.Body.Close()
		second := post(context.Background(), t, cl.url+"/v1/completions", request{Prompt: "one too many", MaxTokens: 4})
		second.Body.Close()
		if second.StatusCode != http.StatusTooManyRequests || second.Header.Get("Retry-After") == "" {
			t.Errorf("second request: status %d Retry-After %q, want 429 with Retry-After", second.StatusCode, second.Header.Get("Retry-After"))
		}
		g.open()
		if _, err := readStream(resp.Body); err != nil {
			t.Fatal(err)
		}
	})
	// A prefill worker whose queue is full (here: the KV of one prompt in
	// flight is all MaxLiveKVBytes allows) refuses at once, and the client
	// gets 429 with Retry-After instead of waiting in an unbounded queue.
	t.Run("prefill queue full", func(t *testing.T) {
		e, err := enginebuild.Build(enginecfg.DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { enginebuild.Close(e) })
		held := &heldPrefill{Engine: e, gate: make(chan struct{})}
		cl := startCluster(t, clusterOpts{worker: func(wo *workerrun.Options) {
			if wo.Role == control.RolePrefill {
				wo.EngineOverride = held
				wo.Prefill.RetainBytes, wo.Prefill.MaxLiveKVBytes = 1, 1
			}
		}})
		first := make(chan int, 1) // its status, or 0 when the call failed
		go func() {
			resp, err := http.Post(cl.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "held in the prefill worker", "max_tokens": 4}`))
			if err != nil {
				first <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			first <- resp.StatusCode
		}()
		waitFor(t, 5*time.Second, func() error {
			if held.started.Load() == 0 {
				return errors.New("the first prompt is not being prefilled yet")
			}
			return nil
		})
		second := post(context.Background(), t, cl.url+"/v1/completions", request{Prompt: "no room", MaxTokens: 4})
		b, _ := io.ReadAll(second.Body)
		second.Body.Close()
		if second.StatusCode != http.StatusTooManyRequests || second.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "queue full") {
			t.Errorf("second request: status %d Retry-After %q (%s), want 429 with Retry-After saying the queue is full", second.StatusCode, second.Header.Get("Retry-After"), b)
		}
		close(held.gate)
		if code := <-first; code != http.StatusOK {
			t.Errorf("first request: status %d, want 200", code)
		}
		waitFor(t, 5*time.Second, func() error { return cl.idle(t) })
	})
	t.Run("no KV capacity", func(t *testing.T) {
		cl := startCluster(t, clusterOpts{worker: func(wo *workerrun.Options) { wo.Decode.KVBlocks = 4 }})
		// 4 blocks × 16 tokens = 64 tokens; 10 + 100 do not fit.
		resp := post(context.Background(), t, cl.url+"/v1/completions", request{Prompt: "0123456789", MaxTokens: 100})
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			b, _ := io.ReadAll(resp.Body)
			t.Errorf("status %d Retry-After %q (%s), want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), b)
		}
		waitFor(t, 5*time.Second, func() error { return cl.idle(t) })
	})
}

// Without workers the coordinator is live but not ready, and requests get 503.
func TestNoWorkers(t *testing.T) {
	url := startWithoutWorkers(t, "tiny")
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	resp := post(context.Background(), t, url+"/v1/completions", request{Prompt: "anyone?", MaxTokens: 2})
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("completion without workers: %d, want 503", resp.StatusCode)
	}
}

// startWithoutWorkers starts a coordinator serving modelName (--model-name)
// that no worker joins, shut down when the test ends, and returns its URL.
func startWithoutWorkers(t *testing.T, modelName string) string {
	t.Helper()
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.NATSListen, o.ModelName = "127.0.0.1:0", "127.0.0.1:-1", modelName
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	c, err := coordinator.Start(context.Background(), o, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return "http://" + c.HTTPAddr()
}

// Shutdown marks the coordinator not ready and lets a stream in flight
// finish before the workers stop.
func TestShutdownDrains(t *testing.T) {
	cl := startCluster(t, clusterOpts{gated: true})
	for _, g := range cl.gates {
		g.allow(2)
	}
	resp, toks := openStream(context.Background(), t, cl.url, request{Prompt: "finish me", MaxTokens: 30, IgnoreEOS: true}, 1)
	defer resp.Body.Close()
	stopped := make(chan error, 1)
	go func() { stopped <- cl.c.Shutdown(context.Background()) }()
	waitFor(t, 5*time.Second, func() error {
		if cl.c.Ready() == nil {
			return errors.New("still ready while shutting down")
		}
		return nil
	})
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	default:
	}
	for _, g := range cl.gates {
		g.open()
	}
	rest, err := readStream(resp.Body)
	if err != nil || rest.Err != "" || rest.Finish != "length" || len(toks)+len(rest.Tokens) != 30 {
		t.Errorf("drained stream: %d+%d tokens, finish %q, error %q / %v; want 30 tokens, length", len(toks), len(rest.Tokens), rest.Finish, rest.Err, err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// heldPrefill is a prefill worker's engine whose Prefill calls wait until
// gate is closed; started counts the calls that began.
type heldPrefill struct {
	engine.Engine
	gate    chan struct{}
	started atomic.Int64
}

func (h *heldPrefill) Prefill(ctx context.Context, batch []engine.PrefillItem, onKV engine.KVFunc) ([]engine.Output, error) {
	h.started.Add(1)
	select {
	case <-h.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return h.Engine.Prefill(ctx, batch, onKV)
}

// A prefill worker that dies before the first token: the request is sent
// to the other prefill worker, for the same decode worker, and completes
// with the engine's tokens.
func TestPrefillWorkerFailureBeforeFirstToken(t *testing.T) {
	checkNoLeaks(t)
	var mu sync.Mutex
	held := map[string]*heldPrefill{}
	cl := startCluster(t, clusterOpts{prefill: 2, worker: func(wo *workerrun.Options) {
		if wo.Role != control.RolePrefill {
			return
		}
		e, err := enginebuild.Build(enginecfg.DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { enginebuild.Close(e) })
		h := &heldPrefill{Engine: e, gate: make(chan struct{})}
		mu.Lock()
		held[wo.ID] = h
		mu.Unlock()
		wo.EngineOverride = h
	}})
	prompt := "the prefill worker dies"
	want := newReference(t).generate(t, promptIDs(prompt), 8, engine.Sampling{}, true)
	got := make(chan result, 1)
	go func() {
		got <- complete(context.Background(), t, cl.url, request{Prompt: prompt, MaxTokens: 8, IgnoreEOS: true})
	}()
	var victim string
	waitFor(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for id, h := range held {
			if h.started.Load() > 0 {
				victim = id
				return nil
			}
		}
		return errors.New("no prefill worker has the prompt yet")
	})
	mu.Lock()
	for id, h := range held {
		if id != victim {
			close(h.gate) // the survivor prefills at once
		}
	}
	mu.Unlock()
	if err := worker(cl, victim).Kill(); err != nil {
		t.Logf("kill %s: %v", victim, err)
	}
	res := <-got
	if diff := cmp.Diff(want, res.Tokens); diff != "" {
		t.Errorf("tokens (-engine alone +served):\n%s", diff)
	}
	if pw, _ := res.Budget["prefill_worker"].(string); pw == victim || pw == "" {
		t.Errorf("prefilled on %q, want the surviving prefill worker (victim %s)", pw, victim)
	}
	if n, _ := res.Budget["prefill_retries"].(float64); n != 1 {
		t.Errorf("prefill_retries %v, want 1", res.Budget["prefill_retries"])
	}
	// The failed call took the victim out of routing: the next requests,
	// sent well within its heartbeat TTL, go to the survivor at once.
	for i := range 4 {
		res := complete(context.Background(), t, cl.url, request{Prompt: fmt.Sprintf("after the failure %d", i), MaxTokens: 2, IgnoreEOS: true})
		if res.Err != "" {
			t.Fatalf("request %d after the failure: %s", i, res.Err)
		}
		if pw, _ := res.Budget["prefill_worker"].(string); pw == victim {
			t.Errorf("request %d after the failure prefilled on the dead worker %s", i, victim)
		}
		if n, _ := res.Budget["prefill_retries"].(float64); n != 0 {
			t.Errorf("request %d after the failure: prefill_retries %v, want 0", i, n)
		}
	}
	waitFor(t, 10*time.Second, func() error { return idleExcept(t, cl, victim) })
}
