package client_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pdserve/pdserve/loadtest/client"
	"github.com/pdserve/pdserve/loadtest/internal/ssetest"
	"github.com/pdserve/pdserve/pkg/workload"
)

var ms = ssetest.Ms

func oneRequest(t *testing.T, s workload.Synth, in, out int) *workload.Request {
	t.Helper()
	w, err := workload.Random(workload.RandomOptions{InputLen: in, OutputLen: out}, 1, 1, s)
	if err != nil {
		t.Fatal(err)
	}
	return &w.Requests[0]
}

func TestOutcomes(t *testing.T) {
	budget := map[string]any{"ttft_ms": 95.0, "queue_ms": 10.0, "prefill_ms": 80.0, "kv_transfer_ms": 5.0, "codec": "zstd"}
	for _, tc := range []struct {
		name     string
		endpoint string
		script   ssetest.Script
		want     client.Outcome
	}{
		{
			name: "completion stream",
			script: ssetest.Script{Events: ssetest.Stream(false, []ssetest.Token{
				{At: ms(100), Text: "a"}, {At: ms(120), Text: "b"}, {At: ms(150), Text: "c"}, {At: ms(190), Text: "d"},
			}, ms(200), 4, budget)},
			want: client.Outcome{
				Success: true, Status: 200, PromptLen: 16, Asked: 4, OutputTokens: 4, UsageReported: true,
				TTFT: ms(100), TTFO: ms(100), HasAnswer: true, ITL: []time.Duration{ms(20), ms(30), ms(40)},
				Latency: ms(190), Events: 4, FinishReason: "length", Budget: budget, GeneratedText: "abcd",
			},
		},
		{
			name:   "one token",
			script: ssetest.Script{Events: ssetest.Stream(false, []ssetest.Token{{At: ms(80), Text: "x"}}, ms(81), 1, nil)},
			want: client.Outcome{
				Success: true, Status: 200, PromptLen: 16, Asked: 4, OutputTokens: 1, UsageReported: true,
				TTFT: ms(80), TTFO: ms(80), HasAnswer: true, Latency: ms(80), Events: 1, FinishReason: "length", GeneratedText: "x",
			},
		},
		{
			name:     "chat with reasoning",
			endpoint: "/v1/chat/completions",
			script: ssetest.Script{Events: append([]ssetest.Event{
				// A role-only first delta is not a token.
				{At: ms(5), Data: `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`},
			}, ssetest.Stream(true, []ssetest.Token{
				{At: ms(50), Text: "think", Reasoning: true}, {At: ms(60), Text: "more", Reasoning: true},
				{At: ms(90), Text: "Yes"}, {At: ms(100), Text: "."},
			}, ms(100), 4, nil)...)},
			want: client.Outcome{
				Success: true, Status: 200, PromptLen: 16, Asked: 4, OutputTokens: 4, UsageReported: true,
				TTFT: ms(50), TTFO: ms(90), HasAnswer: true, Reasoning: true,
				ITL: []time.Duration{ms(10), ms(30), ms(10)}, Latency: ms(100), Events: 4, FinishReason: "length", GeneratedText: "Yes.",
			},
		},
		{
			name:     "chat with reasoning, then a tool call",
			endpoint: "/v1/chat/completions",
			script: ssetest.Script{Events: []ssetest.Event{
				{At: ms(5), Data: `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`},
				{At: ms(40), Data: `{"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}`},
				{At: ms(70), Data: `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}`},
				{At: ms(75), Data: `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`},
				{At: ms(76), Data: `[DONE]`},
			}},
			want: client.Outcome{
				Success: true, Status: 200, PromptLen: 16, Asked: 4, OutputTokens: 3,
				TTFT: ms(40), TTFO: ms(70), HasAnswer: true, Reasoning: true,
				ITL: []time.Duration{ms(30), ms(5)}, Latency: ms(75), Events: 3, FinishReason: "tool_calls",
			},
		},
		{
			name: "no usage: events counted",
			script: ssetest.Script{Events: ssetest.Stream(false, []ssetest.Token{
				{At: ms(10), Text: "a"}, {At: ms(30), Text: "b"},
			}, ms(30), -1, nil)},
			want: client.Outcome{
				Success: true, Status: 200, PromptLen: 16, Asked: 4, OutputTokens: 2,
				TTFT: ms(10), TTFO: ms(10), HasAnswer: true, ITL: []time.Duration{ms(20)},
				Latency: ms(30), Events: 2, FinishReason: "length", GeneratedText: "ab",
			},
		},
		{
			name:   "rejected",
			script: ssetest.Script{Status: 429, Body: `{"error":{"message":"queue full","type":"rate_limit_error","param":null,"code":"overloaded"}}`},
			want: client.Outcome{Status: 429, PromptLen: 16, Asked: 4, FailKind: client.FailHTTP,
				ErrorType: "rate_limit_error", ErrorCode: "overloaded", ErrorMessage: "queue full",
				Error: `HTTP 429: {"error":{"message":"queue full","type":"rate_limit_error","param":null,"code":"overloaded"}}`},
		},
		{
			name:   "rejected, not JSON",
			script: ssetest.Script{Status: 502, Body: `bad gateway`},
			want:   client.Outcome{Status: 502, PromptLen: 16, Asked: 4, FailKind: client.FailHTTP, Error: `HTTP 502: bad gateway`},
		},
		{
			name: "error event mid-stream",
			script: ssetest.Script{Events: []ssetest.Event{
				{At: ms(40), Data: `{"choices":[{"index":0,"text":"a"}]}`},
				{At: ms(60), Data: `{"error":{"message":"decode worker lost","type":"server_error"}}`},
			}},
			want: client.Outcome{
				Status: 200, PromptLen: 16, Asked: 4, OutputTokens: 1, TTFT: ms(40), TTFO: ms(40), HasAnswer: true,
				Latency: ms(40), Events: 1, GeneratedText: "a", Error: "server error: decode worker lost",
				FailKind: client.FailStream, ErrorType: "server_error", ErrorMessage: "decode worker lost",
			},
		},
		{
			name:   "no token",
			script: ssetest.Script{Events: ssetest.Stream(false, nil, ms(30), 0, nil)},
			want: client.Outcome{
				Status: 200, PromptLen: 16, Asked: 4, UsageReported: true, FinishReason: "length",
				Error: "no token arrived before the response ended", FailKind: client.FailEmpty,
			},
		},
		{
			name: "garbage event",
			script: ssetest.Script{Events: []ssetest.Event{
				{At: ms(40), Data: `{"choices":[{"index":0,"text":"a"}]}`},
				{At: ms(45), Data: `{"choices":[`},
			}},
			want: client.Outcome{
				Status: 200, PromptLen: 16, Asked: 4, OutputTokens: 1, TTFT: ms(40), TTFO: ms(40), HasAnswer: true,
				Latency: ms(40), Events: 1, GeneratedText: "a", Error: `bad event "{\"choices\":[": unexpected end of JSON input`,
				FailKind: client.FailStream,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := ssetest.NewClock(time.Unix(1000, 0))
			srv := ssetest.NewServer(t, clock, func(ssetest.Request) ssetest.Script { return tc.script })
			c, err := client.New(client.Options{BaseURL: srv.URL, Endpoint: tc.endpoint, Model: "m", Clock: clock, IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			got := c.Do(context.Background(), oneRequest(t, workload.Synth{}, 16, 4))
			tc.want.Start = time.Unix(1000, 0)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNonStreaming(t *testing.T) {
	clock := ssetest.NewClock(time.Unix(0, 0))
	srv := ssetest.NewServer(t, clock, func(ssetest.Request) ssetest.Script {
		return ssetest.Script{
			JSON:   `{"choices":[{"index":0,"text":"hello","finish_reason":"length"}],"usage":{"prompt_tokens":16,"completion_tokens":5},"pdserve":{"e2e_ms":250}}`,
			JSONAt: ms(250),
		}
	})
	c, _ := client.New(client.Options{BaseURL: srv.URL, Clock: clock, NoStream: true})
	got := c.Do(context.Background(), oneRequest(t, workload.Synth{}, 16, 5))
	want := client.Outcome{
		Success: true, Status: 200, PromptLen: 16, Asked: 5, OutputTokens: 5, UsageReported: true, ServerPromptTokens: 16,
		Start: time.Unix(0, 0), TTFT: ms(250), TTFO: ms(250), HasAnswer: true, Latency: ms(250), Events: 1,
		FinishReason: "length", Budget: map[string]any{"e2e_ms": 250.0}, GeneratedText: "hello",
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
	if s := srv.Requests()[0].Body["stream"]; s != false {
		t.Errorf("stream = %v, want false", s)
	}
}

func TestRequestBodies(t *testing.T) {
	clock := ssetest.NewClock(time.Unix(0, 0))
	srv := ssetest.NewServer(t, clock, func(ssetest.Request) ssetest.Script {
		return ssetest.Script{Events: ssetest.Stream(false, []ssetest.Token{{At: ms(1), Text: "a"}}, ms(1), 1, nil)}
	})
	comp, _ := client.New(client.Options{BaseURL: srv.URL + "/", Model: "opt", IgnoreEOS: true, APIKey: "k", Clock: clock,
		ExtraBody: map[string]any{"temperature": 0.5, "top_k": 3}})
	r := oneRequest(t, workload.Synth{Format: workload.Tokens}, 4, 7)
	if o := comp.Do(context.Background(), r); !o.Success {
		t.Fatalf("request failed: %s", o.Error)
	}
	_, ids := r.Body()
	var prompt []any
	for _, id := range ids {
		prompt = append(prompt, float64(id))
	}
	want := map[string]any{
		"model": "opt", "prompt": prompt, "max_tokens": 7.0, "temperature": 0.5, "top_k": 3.0,
		"stream": true, "stream_options": map[string]any{"include_usage": true}, "ignore_eos": true,
	}
	got := srv.Requests()[0]
	if got.Path != "/v1/completions" {
		t.Errorf("path %q, want /v1/completions", got.Path)
	}
	if diff := cmp.Diff(want, got.Body); diff != "" {
		t.Errorf("completion body (-want +got):\n%s", diff)
	}

	chat, _ := client.New(client.Options{BaseURL: srv.URL, Endpoint: "v1/chat/completions", Model: "opt", Clock: clock})
	r = oneRequest(t, workload.Synth{}, 5, 3)
	chat.Do(context.Background(), r)
	text, _ := r.Body()
	want = map[string]any{
		"model": "opt", "messages": []any{map[string]any{"role": "user", "content": text}},
		"max_tokens": 3.0, "max_completion_tokens": 3.0, "temperature": 0.0,
		"stream": true, "stream_options": map[string]any{"include_usage": true},
	}
	got = srv.Requests()[1]
	if got.Path != "/v1/chat/completions" {
		t.Errorf("path %q, want /v1/chat/completions", got.Path)
	}
	if diff := cmp.Diff(want, got.Body); diff != "" {
		t.Errorf("chat body (-want +got):\n%s", diff)
	}

	o := chat.Do(context.Background(), oneRequest(t, workload.Synth{Format: workload.Tokens}, 5, 3))
	if o.Success || !strings.Contains(o.Error, "text prompts") {
		t.Errorf("token ids on chat: %+v, want a failure naming text prompts", o)
	}
}

// cancelClock cancels a context at its n-th read.
type cancelClock struct {
	*ssetest.Clock
	n      int
	cancel context.CancelFunc
}

func (c *cancelClock) Now() time.Time {
	c.n--
	if c.n == 0 {
		c.cancel()
	}
	return c.Clock.Now()
}

func TestCancelMidStream(t *testing.T) {
	clock := ssetest.NewClock(time.Unix(0, 0))
	srv := ssetest.NewServer(t, clock, func(ssetest.Request) ssetest.Script {
		return ssetest.Script{Events: ssetest.Stream(false, []ssetest.Token{
			{At: ms(10), Text: "a"}, {At: ms(20), Text: "b"}, {At: ms(30), Text: "c"},
		}, ms(30), 3, nil)}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Reads: 1 = send, 2 = first token (cancels).
	cc := &cancelClock{Clock: clock, n: 2, cancel: cancel}
	c, _ := client.New(client.Options{BaseURL: srv.URL, Clock: cc})
	o := c.Do(ctx, oneRequest(t, workload.Synth{}, 4, 3))
	if o.Success || !strings.Contains(o.Error, "context canceled") || o.FailKind != client.FailCanceled {
		t.Errorf("got success=%v error=%q kind %q, want a context-canceled failure", o.Success, o.Error, o.FailKind)
	}
}

// TestFailKinds: a refused connection and a request past its deadline
// fail with their own kinds.
func TestFailKinds(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String()
	l.Close()
	c, _ := client.New(client.Options{BaseURL: refused})
	if o := c.Do(context.Background(), oneRequest(t, workload.Synth{}, 4, 3)); o.Success || o.FailKind != client.FailConnection || o.Status != 0 {
		t.Errorf("refused: success %v kind %q status %d (%s), want a connection failure", o.Success, o.FailKind, o.Status, o.Error)
	}
	hold := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-hold:
		}
	}))
	defer srv.Close()
	defer close(hold)
	c, _ = client.New(client.Options{BaseURL: srv.URL})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if o := c.Do(ctx, oneRequest(t, workload.Synth{}, 4, 3)); o.Success || o.FailKind != client.FailTimeout {
		t.Errorf("deadline: success %v kind %q (%s), want a timeout", o.Success, o.FailKind, o.Error)
	}
}
