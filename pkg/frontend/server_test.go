package frontend

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/metrics"
	"github.com/pdserve/pdserve/pkg/sampling"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// fakeBackend runs complete for every request.
type fakeBackend struct {
	complete func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error)
}

func (f *fakeBackend) Complete(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
	return f.complete(ctx, req, emit)
}

// finishes returns req.N copies of reason.
func finishes(req *Request, reason string) []string {
	out := make([]string, req.N)
	for i := range out {
		out[i] = reason
	}
	return out
}

// echoText emits text one token at a time in each of the request's
// choices (interleaved), ending a choice at ErrStopped and the request at
// any other emit error, and finishes with "length".
func echoText(text string) func(context.Context, *Request, EmitFunc) ([]string, error) {
	return func(_ context.Context, req *Request, emit EmitFunc) ([]string, error) {
		req.Trace.DecodeWorker = "d0"
		stopped := make([]bool, req.N)
		for _, id := range (tokenizer.Bytes{}).Encode(text) {
			for i := range req.N {
				if stopped[i] {
					continue
				}
				err := emit(Output{Index: i, Tokens: []int32{id}})
				switch {
				case errors.Is(err, ErrStopped):
					stopped[i] = true
				case err != nil:
					return nil, fmt.Errorf("fake: %w", err)
				}
			}
		}
		out := finishes(req, "length")
		for i, s := range stopped {
			if s {
				out[i] = "stop"
			}
		}
		return out, nil
	}
}

type testServer struct {
	*httptest.Server
	srv *Server
	reg *prometheus.Registry
}

func newTestServer(t *testing.T, b Backend, edit func(*Options)) *testServer {
	t.Helper()
	return newTestServerConfig(t, b, edit, nil)
}

// newTestServerConfig is newTestServer with setup, when not nil, given
// the unstarted httptest server (its http.Server's hooks) before it starts.
func newTestServerConfig(t *testing.T, b Backend, edit func(*Options), setup func(*httptest.Server)) *testServer {
	t.Helper()
	reg := prometheus.NewRegistry()
	pol := config.Default()
	pol.Limits.MaxTokensCap = 64
	pol.Budgets = config.Budgets{Default: 100, Routes: map[string]int{RouteChat: 50}, APIKeys: map[string]int{"small-key": 5}}
	o := Options{
		Backend:   b,
		Tokenizer: tokenizer.Bytes{},
		Policy:    pol,
		Models:    func() []Model { return []Model{{Name: "tiny", MaxModelLen: 1024}, {Name: "alias"}} },
		Metrics:   metrics.New(reg, metrics.SLO{}),
		Gatherer:  reg,
	}
	if edit != nil {
		edit(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s)
	if setup != nil {
		setup(ts)
	}
	ts.Start()
	t.Cleanup(ts.Close)
	return &testServer{Server: ts, srv: s, reg: reg}
}

func (ts *testServer) post(t *testing.T, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// sseData reads a whole event stream and returns the data payloads.
func sseData(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		out = append(out, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// streamed decodes the chunks of a stream (all but [DONE], which must end it).
func streamed(t *testing.T, resp *http.Response) []map[string]any {
	t.Helper()
	data := sseData(t, resp.Body)
	if len(data) == 0 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", data)
	}
	var chunks []map[string]any
	for _, d := range data[:len(data)-1] {
		var m map[string]any
		if err := json.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("chunk %q: %v", d, err)
		}
		chunks = append(chunks, m)
	}
	return chunks
}

func decodeJSON(t *testing.T, r io.Reader) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.NewDecoder(r).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func choice0(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	cs, ok := m["choices"].([]any)
	if !ok || len(cs) != 1 {
		t.Fatalf("choices = %v, want one", m["choices"])
	}
	return cs[0].(map[string]any)
}

func TestCompletionNonStreaming(t *testing.T) {
	var got *Request
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		got = req
		return echoText("hello wörld")(ctx, req, emit)
	}}, nil)
	resp := ts.post(t, RouteCompletions, `{"model":"tiny","prompt":"abc","max_tokens":20,"temperature":0.5,"top_p":0.9,"seed":7,"ignore_eos":true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	m := decodeJSON(t, resp.Body)
	c := choice0(t, m)
	if c["text"] != "hello wörld" || c["finish_reason"] != "length" {
		t.Errorf("choice = %v", c)
	}
	if m["object"] != "text_completion" || m["model"] != "tiny" || !strings.HasPrefix(m["id"].(string), "cmpl-") {
		t.Errorf("response header fields = %v", m)
	}
	if diff := cmp.Diff(map[string]any{"prompt_tokens": 3.0, "completion_tokens": 12.0, "total_tokens": 15.0}, m["usage"]); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
	pd, _ := m["pdserve"].(map[string]any)
	for _, k := range []string{"ttft_ms", "queue_ms", "prefill_ms", "kv_transfer_ms", "decode_ms", "e2e_ms", "kv_bytes_raw", "kv_bytes_wire", "codec", "prefill_worker", "decode_worker", "first_token_policy"} {
		if _, ok := pd[k]; !ok {
			t.Errorf("pdserve object lacks %q: %v", k, pd)
		}
	}
	if pd["decode_worker"] != "d0" {
		t.Errorf("pdserve.decode_worker = %v, want d0", pd["decode_worker"])
	}
	want := &Request{
		ID: m["id"].(string), Route: RouteCompletions, Model: "tiny", Prompt: []int32{'a', 'b', 'c'}, MaxTokens: 20, N: 1,
		Sampling: sampling.Sampling{Temperature: 0.5, TopP: 0.9, Seed: 7}, IgnoreEOS: true, Logprobs: -1, PromptLogprobs: -1,
	}
	if diff := cmp.Diff(want, got, cmpIgnoreTrace); diff != "" {
		t.Errorf("backend request (-want +got):\n%s", diff)
	}
	if resp.Header.Get("X-Request-Id") != m["id"] {
		t.Errorf("X-Request-Id %q, id %v", resp.Header.Get("X-Request-Id"), m["id"])
	}
}

var cmpIgnoreTrace = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Trace" }, cmp.Ignore())

func TestCompletionStreaming(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: echoText("hi ✓")}, nil)
	resp := ts.post(t, RouteCompletions, `{"model":"tiny","prompt":[1,2,3],"stream":true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for k, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	chunks := streamed(t, resp)
	var text strings.Builder
	for i, ch := range chunks {
		c := choice0(t, ch)
		text.WriteString(c["text"].(string))
		last := i == len(chunks)-1
		if (c["finish_reason"] != nil) != last {
			t.Errorf("chunk %d finish_reason = %v", i, c["finish_reason"])
		}
		if _, ok := ch["pdserve"]; ok != last {
			t.Errorf("chunk %d has pdserve = %v, want only on the last", i, ok)
		}
		if _, ok := ch["usage"]; ok {
			t.Errorf("chunk %d has usage without include_usage", i)
		}
	}
	if text.String() != "hi ✓" {
		t.Errorf("streamed text %q", text.String())
	}
	// The 3 bytes of ✓ arrive as one chunk, never split.
	for _, ch := range chunks {
		if s := choice0(t, ch)["text"].(string); strings.ContainsRune(s, '\uFFFD') {
			t.Errorf("chunk text %q holds a broken rune", s)
		}
	}
}

// TestReplyOfNoToken: a reply whose first token was its end (the model's
// end of sequence, which the client never sees) is an empty answer with
// finish_reason stop, whole or streamed; its budget has no TTFT and an
// e2e to its end (it used to say 0 ms, however long the client waited).
func TestReplyOfNoToken(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	ts := newTestServer(t, &fakeBackend{complete: func(_ context.Context, req *Request, _ EmitFunc) ([]string, error) {
		clock.Advance(250 * time.Millisecond) // the prefill that sampled the end
		return finishes(req, "stop"), nil
	}}, func(o *Options) { o.Now = clock.Now })
	for _, stream := range []bool{false, true} {
		resp := ts.post(t, RouteCompletions, fmt.Sprintf(`{"model":"tiny","prompt":"abc","max_tokens":4,"stream":%v}`, stream))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %v: status %d", stream, resp.StatusCode)
		}
		last := map[string]any{}
		if stream {
			chunks := streamed(t, resp)
			last = chunks[len(chunks)-1]
		} else {
			last = decodeJSON(t, resp.Body)
		}
		c := choice0(t, last)
		pd, _ := last["pdserve"].(map[string]any)
		if c["text"] != "" || c["finish_reason"] != "stop" || pd["output_tokens"] != 0.0 || pd["ttft_ms"] != 0.0 || pd["e2e_ms"] != 250.0 {
			t.Errorf("stream %v: choice %v, budget %v; want no text, finish stop, 0 tokens, ttft 0, e2e 250 ms", stream, c, pd)
		}
	}
}

func TestChatStreamingWithUsage(t *testing.T) {
	var prompt []int32
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		prompt = req.Prompt
		return echoText("ok")(ctx, req, emit)
	}}, nil)
	resp := ts.post(t, RouteChat, `{"model":"alias","messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"H"},{"type":"text","text":"i"}]}],
		"stream":true,"stream_options":{"include_usage":true}}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if want := "<|system|>\nS\n<|user|>\nHi\n<|assistant|>\n"; (tokenizer.Bytes{}).Decode(prompt) != want {
		t.Errorf("rendered prompt %q, want %q", (tokenizer.Bytes{}).Decode(prompt), want)
	}
	chunks := streamed(t, resp)
	if len(chunks) < 3 {
		t.Fatalf("got %d chunks", len(chunks))
	}
	first := choice0(t, chunks[0])["delta"].(map[string]any)
	if first["role"] != "assistant" {
		t.Errorf("first delta %v lacks the assistant role", first)
	}
	var text strings.Builder
	for _, ch := range chunks[:len(chunks)-1] {
		if ch["object"] != "chat.completion.chunk" {
			t.Errorf("object %v", ch["object"])
		}
		if s, ok := choice0(t, ch)["delta"].(map[string]any)["content"].(string); ok {
			text.WriteString(s)
		}
		if _, ok := ch["pdserve"]; ok {
			t.Errorf("pdserve on a chunk before the usage chunk")
		}
	}
	if text.String() != "ok" {
		t.Errorf("text %q", text.String())
	}
	if fr := choice0(t, chunks[len(chunks)-2])["finish_reason"]; fr != "length" {
		t.Errorf("finish chunk finish_reason %v", fr)
	}
	last := chunks[len(chunks)-1]
	if cs := last["choices"].([]any); len(cs) != 0 {
		t.Errorf("usage chunk choices = %v, want []", cs)
	}
	u := last["usage"].(map[string]any)
	if u["completion_tokens"] != 2.0 || u["prompt_tokens"] != float64(len(prompt)) {
		t.Errorf("usage %v", u)
	}
	if _, ok := last["pdserve"]; !ok {
		t.Errorf("usage chunk lacks pdserve")
	}
}

func TestChatNonStreaming(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: echoText("yes")}, nil)
	resp := ts.post(t, RouteChat, `{"messages":[{"role":"user","content":"q"}]}`)
	m := decodeJSON(t, resp.Body)
	if resp.StatusCode != http.StatusOK || m["object"] != "chat.completion" || m["model"] != "tiny" {
		t.Fatalf("status %d body %v", resp.StatusCode, m)
	}
	msg := choice0(t, m)["message"].(map[string]any)
	if diff := cmp.Diff(map[string]any{"role": "assistant", "content": "yes"}, msg); diff != "" {
		t.Errorf("message (-want +got):\n%s", diff)
	}
}

func TestStopString(t *testing.T) {
	var emitErr error
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		for _, id := range (tokenizer.Bytes{}).Encode("abcSTOPdef") {
			if emitErr = emit(Output{Tokens: []int32{id}}); emitErr != nil {
				break
			}
		}
		return []string{"stop"}, nil
	}}, nil)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			resp := ts.post(t, RouteCompletions, fmt.Sprintf(`{"prompt":"x","stop":["zz","STOP"],"stream":%v}`, stream))
			var text, finish any
			if stream {
				chunks := streamed(t, resp)
				var sb strings.Builder
				for _, ch := range chunks {
					sb.WriteString(choice0(t, ch)["text"].(string))
				}
				text, finish = sb.String(), choice0(t, chunks[len(chunks)-1])["finish_reason"]
			} else {
				c := choice0(t, decodeJSON(t, resp.Body))
				text, finish = c["text"], c["finish_reason"]
			}
			if text != "abc" || finish != "stop" {
				t.Errorf("text %q finish %v, want \"abc\" stop", text, finish)
			}
			if !errors.Is(emitErr, ErrStopped) {
				t.Errorf("emit returned %v, want ErrStopped", emitErr)
			}
		})
	}
}

func TestBadRequests(t *testing.T) {
	called := false
	ts := newTestServer(t, &fakeBackend{complete: func(_ context.Context, req *Request, _ EmitFunc) ([]string, error) {
		called = true
		return finishes(req, "stop"), nil
	}}, nil)
	long := strings.Repeat("x", 101)
	tests := []struct {
		name, path, body string
		hdr              []string
		status           int
		param, code      string
	}{
		{"malformed json", RouteCompletions, `{"prompt":`, nil, 400, "", "invalid_json"},
		{"trailing data", RouteCompletions, `{"prompt":"a"} {}`, nil, 400, "", "invalid_json"},
		{"wrong type", RouteCompletions, `{"prompt":"a","max_tokens":"many"}`, nil, 400, "max_tokens", "invalid_type"},
		{"unknown model", RouteCompletions, `{"model":"gpt-9","prompt":"a"}`, nil, 404, "model", "model_not_found"},
		{"missing prompt", RouteCompletions, `{}`, nil, 400, "prompt", "missing_prompt"},
		{"empty prompt", RouteCompletions, `{"prompt":""}`, nil, 400, "prompt", "empty_prompt"},
		{"empty token array", RouteCompletions, `{"prompt":[]}`, nil, 400, "prompt", "empty_prompt"},
		{"token out of vocabulary", RouteCompletions, `{"prompt":[1,258]}`, nil, 400, "prompt", "invalid_token"},
		{"batched prompt empty", RouteCompletions, `{"prompt":["a",""]}`, nil, 400, "prompt", "empty_prompt"},
		{"batched prompts mixed", RouteCompletions, `{"prompt":["a",[1]]}`, nil, 400, "prompt", "invalid_type"},
		{"prompt of wrong type", RouteCompletions, `{"prompt":{"a":1}}`, nil, 400, "prompt", "invalid_type"},
		{"prompt over default budget", RouteCompletions, `{"prompt":"` + long + `"}`, nil, 400, "prompt", "prompt_too_long"},
		{"prompt over route budget", RouteChat, `{"messages":[{"role":"user","content":"` + long[:40] + `"}]}`, nil, 400, "messages", "prompt_too_long"},
		{"prompt over api key budget", RouteCompletions, `{"prompt":"abcdef"}`, []string{"Authorization", "Bearer small-key"}, 400, "prompt", "prompt_too_long"},
		{"max_tokens over cap", RouteCompletions, `{"prompt":"a","max_tokens":65}`, nil, 400, "max_tokens", "max_tokens_over_cap"},
		{"max_completion_tokens over cap", RouteChat, `{"messages":[{"role":"user","content":"a"}],"max_completion_tokens":65}`, nil, 400, "max_completion_tokens", "max_tokens_over_cap"},
		{"max_tokens zero", RouteCompletions, `{"prompt":"a","max_tokens":0}`, nil, 400, "max_tokens", "invalid_value"},
		{"n over the bound", RouteCompletions, `{"prompt":"a","n":129}`, nil, 400, "n", "invalid_value"},
		{"best_of", RouteCompletions, `{"prompt":"a","best_of":3}`, nil, 400, "best_of", "unsupported_value"},
		{"logprobs over 20", RouteCompletions, `{"prompt":"a","logprobs":21}`, nil, 400, "logprobs", "invalid_value"},
		{"stream_options without stream", RouteCompletions, `{"prompt":"a","stream_options":{"include_usage":true}}`, nil, 400, "stream_options", "invalid_value"},
		{"temperature out of range", RouteCompletions, `{"prompt":"a","temperature":2.5}`, nil, 400, "temperature", "invalid_value"},
		{"top_p zero", RouteCompletions, `{"prompt":"a","top_p":0}`, nil, 400, "top_p", "invalid_value"},
		{"too many stops", RouteCompletions, `{"prompt":"a","stop":["1","2","3","4","5"]}`, nil, 400, "stop", "invalid_value"},
		{"stop of wrong type", RouteCompletions, `{"prompt":"a","stop":7}`, nil, 400, "stop", "invalid_type"},
		{"empty messages", RouteChat, `{"messages":[]}`, nil, 400, "messages", "empty_prompt"},
		{"unknown role", RouteChat, `{"messages":[{"role":"robot","content":"a"}]}`, nil, 400, "messages[0].role", "invalid_value"},
		{"image content", RouteChat, `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, nil, 400, "messages[0].content", "invalid_type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := ts.post(t, tc.path, tc.body, tc.hdr...)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			e := errorBody(t, resp)
			if e.Type != "invalid_request_error" || e.Message == "" {
				t.Errorf("error = %+v", e)
			}
			if got := deref(e.Param); got != tc.param {
				t.Errorf("param %q, want %q", got, tc.param)
			}
			if got := deref(e.Code); got != tc.code {
				t.Errorf("code %q, want %q (message %q)", got, tc.code, e.Message)
			}
		})
	}
	if called {
		t.Errorf("backend called for a bad request")
	}
	if got := requestsTotal(t, ts.reg, "invalid"); got != float64(len(tests)) {
		t.Errorf("requests_total{status=invalid} = %v, want %d", got, len(tests))
	}
}

// requestsTotal returns pdserve_requests_total{status}.
func requestsTotal(t *testing.T, reg prometheus.Gatherer, status string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pdserve_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == status {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

type errorJSON struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func errorBody(t *testing.T, resp *http.Response) errorJSON {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("error Content-Type %q", ct)
	}
	var body struct {
		Error *errorJSON `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error == nil {
		t.Fatalf("error body: %v, %+v", err, body)
	}
	return *body.Error
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Backend errors reach the client as a generic message of their kind,
// never their own text; NewError's message, code and param go as they are.
func TestBackendErrors(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		status     int
		retryAfter string
		typ, code  string
		param      string
		message    string // "" : generic, without the error's text
	}{
		{"overloaded", fmt.Errorf("queue full at 10.0.0.7: %w", ErrOverloaded), 429, "2", "rate_limit_error", "overloaded", "", ""},
		{"unavailable", fmt.Errorf("no decode workers at 10.0.0.7: %w", ErrUnavailable), 503, "2", "service_unavailable", "unavailable", "", ""},
		{"invalid", fmt.Errorf("worker 10.0.0.7 said: %w", ErrInvalid), 400, "", "invalid_request_error", "invalid_request", "", ""},
		{"internal", errors.New("boom at 10.0.0.7"), 500, "", "server_error", "internal_error", "", ""},
		{"client-safe", fmt.Errorf("router at 10.0.0.7: %w", NewError(ErrInvalid, "kv_too_large", "max_tokens", "max_tokens %d does not fit in any worker", 99)),
			400, "", "invalid_request_error", "kv_too_large", "max_tokens", "max_tokens 99 does not fit in any worker"},
		{"client-safe overload", NewError(ErrOverloaded, "", "", "every decode worker is full"), 429, "2", "rate_limit_error", "", "", "every decode worker is full"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			ts := newTestServer(t, &fakeBackend{complete: func(context.Context, *Request, EmitFunc) ([]string, error) {
				return nil, tc.err
			}}, func(o *Options) {
				o.RetryAfter = 1500 * time.Millisecond
				o.Logger = zap.New(core)
			})
			resp := ts.post(t, RouteCompletions, `{"prompt":"a","stream":true}`)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if got := resp.Header.Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.retryAfter)
			}
			e := errorBody(t, resp)
			if e.Type != tc.typ || deref(e.Code) != tc.code || deref(e.Param) != tc.param {
				t.Errorf("error %+v (code %q param %q), want type %s code %q param %q", e, deref(e.Code), deref(e.Param), tc.typ, tc.code, tc.param)
			}
			if strings.Contains(e.Message, "10.0.0.7") || tc.message != "" && e.Message != tc.message {
				t.Errorf("message %q, want %q without internal text", e.Message, tc.message)
			}
			if tc.status == 500 && !strings.Contains(e.Message, resp.Header.Get("X-Request-Id")) {
				t.Errorf("500 message %q does not name the request %s", e.Message, resp.Header.Get("X-Request-Id"))
			}
			lines := logs.FilterMessage("request").All()
			if len(lines) != 1 || fmt.Sprint(lines[0].ContextMap()["cause"]) != tc.err.Error() {
				t.Errorf("request log %+v lacks the cause", lines)
			}
		})
	}
}

func TestErrorMidStream(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		if err := emit(Output{Tokens: []int32{'a'}}); err != nil {
			return nil, err
		}
		return nil, errors.New("decode worker d0 failed and no KV is retained")
	}}, nil)
	resp := ts.post(t, RouteCompletions, `{"prompt":"a","stream":true}`)
	data := sseData(t, resp.Body)
	if len(data) != 3 || data[2] != "[DONE]" {
		t.Fatalf("events %q, want a chunk, an error and [DONE]", data)
	}
	var ev struct {
		Error *errorJSON `json:"error"`
	}
	if err := json.Unmarshal([]byte(data[1]), &ev); err != nil || ev.Error == nil || deref(ev.Error.Code) != "internal_error" || strings.Contains(ev.Error.Message, "KV") {
		t.Errorf("error event %q (%v), want a generic internal_error", data[1], err)
	}
	if got := requestsTotal(t, ts.reg, budget.StatusError); got != 1 {
		t.Errorf("requests_total{status=error} = %v, want 1", got)
	}
}

func TestNoModelsIs503(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: echoText("x")}, func(o *Options) { o.Models = nil })
	resp := ts.post(t, RouteCompletions, `{"prompt":"a"}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("status %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := requestsTotal(t, ts.reg, budget.StatusUnavailable); got != 1 {
		t.Errorf("requests_total{status=unavailable} = %v, want 1", got)
	}
}

// A client that goes away cancels the backend's context.
func TestClientDisconnectCancels(t *testing.T) {
	started := make(chan struct{})
	ended := make(chan error, 1)
	core, logs := observer.New(zap.InfoLevel)
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		if err := emit(Output{Tokens: []int32{'a'}}); err != nil {
			ended <- err
			return nil, err
		}
		close(started)
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	}}, func(o *Options) { o.Logger = zap.New(core) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+RouteCompletions, strings.NewReader(`{"prompt":"a","stream":true}`))
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	cancel()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("backend ended with %v, want context.Canceled", err)
	}
	waitFor(t, func() error {
		if got := requestsTotal(t, ts.reg, budget.StatusCancelled); got != 1 {
			return fmt.Errorf("requests_total{status=cancelled} = %v", got)
		}
		return nil
	})
	// Logged as nginx's 499, not as a 500 with the TCP error's text.
	lines := logs.FilterMessage("request").All()
	if len(lines) != 1 {
		t.Fatalf("%d request lines, want 1", len(lines))
	}
	if f := lines[0].ContextMap(); f["http_status"] != int64(499) || f["error"] != "cancelled" || f["status"] != budget.StatusCancelled {
		t.Errorf("log line %v, want http_status 499, error cancelled", f)
	}
}

// waitFor polls f until it returns nil or 10 s pass.
func waitFor(t *testing.T, f func() error) {
	t.Helper()
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, f)
}

func TestInfoEndpoints(t *testing.T) {
	ready := errors.New("no decode worker yet")
	ts := newTestServer(t, &fakeBackend{complete: echoText("x")}, func(o *Options) {
		o.Ready = func() error { return ready }
	})
	get := func(path string) (int, string) {
		resp, err := ts.Client().Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "no decode worker yet") {
		t.Errorf("/readyz not ready: %d %q", code, body)
	}
	ready = nil
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz ready: %d", code)
	}
	code, body := get(RouteModels)
	var list map[string]any
	if err := json.Unmarshal([]byte(body), &list); err != nil || code != 200 {
		t.Fatalf("/v1/models %d %q: %v", code, body, err)
	}
	// vLLM's shape; max_model_len only where the length is known.
	wantList := map[string]any{"object": "list", "data": []any{
		map[string]any{"id": "tiny", "object": "model", "created": 0.0, "owned_by": "pdserve", "max_model_len": 1024.0},
		map[string]any{"id": "alias", "object": "model", "created": 0.0, "owned_by": "pdserve"},
	}}
	if diff := cmp.Diff(wantList, list); diff != "" {
		t.Errorf("/v1/models (-want +got):\n%s", diff)
	}
	ts.post(t, RouteCompletions, `{"prompt":"a"}`)
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, `pdserve_requests_total{status="ok"} 1`) {
		t.Errorf("/metrics %d lacks the ok request:\n%s", code, body)
	}
	if code, _ := get(RouteCompletions); code != http.StatusMethodNotAllowed {
		t.Errorf("GET %s = %d, want 405", RouteCompletions, code)
	}
	if code, _ := get("/v2/nothing"); code != http.StatusNotFound {
		t.Errorf("unknown path = %d, want 404", code)
	}
}

func TestReturnTokenIDs(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: echoText("a✓b")}, nil)
	want := []float64{'a', 0xe2, 0x9c, 0x93, 'b'}
	toFloats := func(v any) []float64 {
		var out []float64
		for _, x := range v.([]any) {
			out = append(out, x.(float64))
		}
		return out
	}
	m := decodeJSON(t, ts.post(t, RouteCompletions, `{"prompt":"x","return_token_ids":true}`).Body)
	if diff := cmp.Diff(want, toFloats(choice0(t, m)["token_ids"])); diff != "" {
		t.Errorf("token_ids (-want +got):\n%s", diff)
	}
	var got []float64
	for _, ch := range streamed(t, ts.post(t, RouteCompletions, `{"prompt":"x","return_token_ids":true,"stream":true}`)) {
		if ids, ok := choice0(t, ch)["token_ids"]; ok {
			got = append(got, toFloats(ids)...)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("streamed token_ids (-want +got):\n%s", diff)
	}
	if _, ok := choice0(t, decodeJSON(t, ts.post(t, RouteCompletions, `{"prompt":"x"}`).Body))["token_ids"]; ok {
		t.Errorf("token_ids present without return_token_ids")
	}
}

// TestContextLength: prompt + max_tokens over the model's context length
// is refused before the backend is asked, with OpenAI's and vLLM's wording;
// exactly the context length is served.
func TestContextLength(t *testing.T) {
	calls := 0
	ts := newTestServer(t, &fakeBackend{complete: func(_ context.Context, req *Request, _ EmitFunc) ([]string, error) {
		calls++
		return finishes(req, "stop"), nil
	}}, func(o *Options) { o.Models = func() []Model { return []Model{{Name: "small", MaxModelLen: 20}} } })
	prompt := strings.Repeat("x", 10) // 10 byte-level tokens
	tests := []struct {
		name, path, body string
		status           int
		param, message   string
	}{
		{"fits exactly", RouteCompletions, `{"prompt":"` + prompt + `","max_tokens":10}`, 200, "", ""},
		{"completion over", RouteCompletions, `{"prompt":"` + prompt + `","max_tokens":11}`, 400, "prompt",
			"This model's maximum context length is 20 tokens. However, you requested 21 tokens (10 in the prompt, 11 in the completion). Please reduce the length of the prompt or completion."},
		{"chat over", RouteChat, `{"messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":11}`, 400, "messages", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := calls
			resp := ts.post(t, tc.path, tc.body)
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if tc.status == 200 {
				if calls != before+1 {
					t.Errorf("backend not called for a request that fits")
				}
				return
			}
			e := errorBody(t, resp)
			if deref(e.Code) != "context_length_exceeded" || deref(e.Param) != tc.param {
				t.Errorf("error %+v (code %q, param %q), want context_length_exceeded on %q", e, deref(e.Code), deref(e.Param), tc.param)
			}
			if tc.message != "" && e.Message != tc.message {
				t.Errorf("message %q, want %q", e.Message, tc.message)
			}
			if !strings.Contains(e.Message, "maximum context length is 20 tokens") {
				t.Errorf("message %q does not state the context length", e.Message)
			}
			if calls != before {
				t.Errorf("backend called for a request over the context")
			}
		})
	}
}
