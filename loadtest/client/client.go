package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/pdserve/pdserve/pkg/workload"
)

// Clock tells the time. The real clock is time.Now.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// RealClock is the wall clock.
var RealClock Clock = realClock{}

// Options configure a Client.
type Options struct {
	// BaseURL is the server's root, e.g. "http://127.0.0.1:8000".
	BaseURL string
	// Endpoint is the API path: "/v1/completions" (default) or
	// "/v1/chat/completions" (any path ending in "chat/completions" is
	// treated as chat).
	Endpoint string
	// Model is sent as "model".
	Model string
	// APIKey, when set, is sent as "Authorization: Bearer KEY".
	APIKey string
	// IgnoreEOS sends "ignore_eos": true (vLLM, SGLang, pdserve), so the
	// output runs to max_tokens.
	IgnoreEOS bool
	// NoStream asks for one JSON response instead of SSE; TTFT is then the
	// whole latency.
	NoStream bool
	// Temperature is sent as "temperature" (0 = greedy, vLLM's default).
	Temperature float64
	// ExtraBody fields are merged into every request body last, so they
	// override the fields above. Read only after New.
	ExtraBody map[string]any
	// HTTP is the client to use; nil means one with a pool sized for
	// thousands of concurrent streams and no timeout (deadlines come from
	// the context).
	HTTP *http.Client
	// Clock stamps events; nil means RealClock.
	Clock Clock
}

// Client sends benchmark requests. Safe for concurrent use.
type Client struct {
	o    Options
	url  string
	chat bool
}

// ErrOptions reports unusable options.
var ErrOptions = errors.New("client: bad options")

// New checks o and returns a Client.
func New(o Options) (*Client, error) {
	if o.BaseURL == "" {
		return nil, fmt.Errorf("%w: no base URL", ErrOptions)
	}
	if o.Endpoint == "" {
		o.Endpoint = "/v1/completions"
	}
	if !strings.HasPrefix(o.Endpoint, "/") {
		o.Endpoint = "/" + o.Endpoint
	}
	if o.HTTP == nil {
		o.HTTP = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			MaxIdleConns:        0,
			MaxIdleConnsPerHost: 4096,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}}
	}
	if o.Clock == nil {
		o.Clock = RealClock
	}
	return &Client{
		o:    o,
		url:  strings.TrimRight(o.BaseURL, "/") + o.Endpoint,
		chat: strings.HasSuffix(strings.TrimRight(o.Endpoint, "/"), "chat/completions"),
	}, nil
}

// Chat reports whether the endpoint is the chat API.
func (c *Client) Chat() bool { return c.chat }

// CloseIdle closes the client's idle connections (call when done with a
// server).
func (c *Client) CloseIdle() { c.o.HTTP.CloseIdleConnections() }

// Model returns the model name requests carry.
func (c *Client) Model() string { return c.o.Model }

// BaseURL returns the server's root URL.
func (c *Client) BaseURL() string { return strings.TrimRight(c.o.BaseURL, "/") }

// URL returns the full endpoint URL.
func (c *Client) URL() string { return c.url }

// Outcome is what one request did, timed from the client.
type Outcome struct {
	Index   int  // the workload request's index
	Success bool // at least one token arrived and no error was reported
	Error   string
	Status  int // HTTP status, 0 when no response came
	// FailKind says how a failed request failed: FailHTTP, FailTimeout,
	// FailConnection, FailStream, FailEmpty, FailCanceled or FailRequest;
	// "" when it succeeded.
	FailKind string
	// ErrorType, ErrorCode and ErrorMessage are the "type", "code" and
	// "message" of the OpenAI error object the server sent (the body of a
	// non-200 response, or an error event in the stream); "" when none.
	ErrorType, ErrorCode, ErrorMessage string
	PromptLen                          int // tokens, from the workload
	Asked                              int // output tokens asked for (max_tokens)
	// OutputTokens is usage.completion_tokens when the server reported
	// usage, else the number of token-carrying events (one token each, a
	// lower bound when a server packs several tokens in one event).
	OutputTokens  int
	UsageReported bool
	// ServerPromptTokens is usage.prompt_tokens (0 when not reported).
	ServerPromptTokens int

	Start time.Time // the request was sent
	// TTFT is the time to the first token-carrying event, reasoning or
	// answer (vLLM's TTFT).
	TTFT time.Duration
	// TTFO is the time to the first answer (non-reasoning) token; valid
	// when HasAnswer. It equals TTFT when no reasoning precedes the answer.
	TTFO      time.Duration
	HasAnswer bool
	// Reasoning reports that the stream carried reasoning tokens
	// (delta.reasoning_content or delta.reasoning).
	Reasoning bool
	// ITL holds the gaps between consecutive token-carrying events.
	ITL []time.Duration
	// Latency (E2EL) is the time to the last token-carrying event.
	Latency time.Duration
	// Events counts token-carrying events.
	Events int
	// FinishReason is the last finish_reason the server sent.
	FinishReason string
	// Budget is the server's per-request "pdserve" object (the last one
	// seen), nil when absent.
	Budget map[string]any
	// GeneratedText is the answer text (reasoning text excluded).
	GeneratedText string
}

// How requests fail (Outcome.FailKind).
const (
	FailHTTP       = "http"       // a response other than 200
	FailTimeout    = "timeout"    // the request's deadline passed
	FailConnection = "connection" // no response: refused, reset, closed
	FailStream     = "stream"     // the stream broke or carried an error event
	FailEmpty      = "empty"      // the response ended without a token
	FailCanceled   = "canceled"   // the run was interrupted
	FailRequest    = "request"    // the request could not be built
)

// TokenTimes returns the offsets from Start of every token-carrying event.
func (o *Outcome) TokenTimes() []time.Duration {
	if !o.Success {
		return nil
	}
	out := make([]time.Duration, 0, 1+len(o.ITL))
	t := o.TTFT
	out = append(out, t)
	for _, g := range o.ITL {
		t += g
		out = append(out, t)
	}
	return out
}

// body builds the JSON request for r.
func (c *Client) body(r *workload.Request) ([]byte, error) {
	text, ids := r.Body()
	b := map[string]any{
		"model":       c.o.Model,
		"max_tokens":  r.OutputLen,
		"temperature": c.o.Temperature,
		"stream":      !c.o.NoStream,
	}
	if !c.o.NoStream {
		b["stream_options"] = map[string]any{"include_usage": true}
	}
	if c.o.IgnoreEOS {
		b["ignore_eos"] = true
	}
	if c.chat {
		if ids != nil {
			return nil, fmt.Errorf("%w: the chat endpoint takes text prompts, not token ids (use --prompt-format text)", ErrOptions)
		}
		b["messages"] = []map[string]string{{"role": "user", "content": text}}
		b["max_completion_tokens"] = r.OutputLen
	} else if ids != nil {
		b["prompt"] = ids
	} else {
		b["prompt"] = text
	}
	maps.Copy(b, c.o.ExtraBody)
	return json.Marshal(b)
}

// maxErrorBody bounds how much of an error response is kept.
const maxErrorBody = 2048

// Do sends r and returns its outcome; failures are reported in the
// Outcome, never as a panic. ctx bounds the whole request (a deadline or
// cancel ends it as a failure and closes the stream).
func (c *Client) Do(ctx context.Context, r *workload.Request) Outcome {
	out := Outcome{Index: r.Index, PromptLen: r.PromptLen, Asked: r.OutputLen}
	body, err := c.body(r)
	if err != nil {
		out.Error, out.FailKind = err.Error(), FailRequest
		return out
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		out.Error, out.FailKind = fmt.Sprintf("client: build request: %v", err), FailRequest
		return out
	}
	req.Header.Set("Content-Type", "application/json")
	if !c.o.NoStream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if c.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.o.APIKey)
	}
	out.Start = c.o.Clock.Now()
	resp, err := c.o.HTTP.Do(req)
	if err != nil {
		out.Error, out.FailKind = fmt.Sprintf("client: send: %v", err), ctxFail(ctx, FailConnection)
		return out
	}
	defer resp.Body.Close()
	out.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		out.Error, out.FailKind = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg))), FailHTTP
		var e struct {
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(msg, &e) == nil && len(e.Error) > 0 {
			out.ErrorType, out.ErrorCode, out.ErrorMessage = apiErrorFields(e.Error)
		}
		return out
	}
	var t tracker
	t.start = out.Start
	if c.o.NoStream {
		err = c.readJSON(resp.Body, &t, &out)
	} else {
		err = c.readSSE(ctx, resp.Body, &t, &out)
	}
	t.finish(&out)
	switch {
	case err != nil:
		out.Success = false
		out.Error, out.FailKind = err.Error(), ctxFail(ctx, FailStream)
	case out.Events == 0:
		out.Success = false
		out.Error, out.FailKind = "no token arrived before the response ended", FailEmpty
	default:
		out.Success = true
	}
	return out
}

// ctxFail returns FailTimeout or FailCanceled when ctx has ended, else
// kind.
func ctxFail(ctx context.Context, kind string) string {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return FailTimeout
	case ctx.Err() != nil:
		return FailCanceled
	}
	return kind
}

// tracker follows the timing of token events.
type tracker struct {
	start, last time.Time
	text        strings.Builder
}

func (t *tracker) token(now time.Time, answer, reasoning bool, out *Outcome) {
	if out.Events == 0 {
		out.TTFT = now.Sub(t.start)
	} else {
		out.ITL = append(out.ITL, now.Sub(t.last))
	}
	if answer && !out.HasAnswer {
		out.HasAnswer = true
		out.TTFO = now.Sub(t.start)
	}
	out.Reasoning = out.Reasoning || reasoning
	out.Events++
	t.last = now
}

func (t *tracker) finish(out *Outcome) {
	if out.Events > 0 {
		out.Latency = t.last.Sub(t.start)
	}
	if !out.UsageReported {
		out.OutputTokens = out.Events
	}
	out.GeneratedText = t.text.String()
}

// chunk is the part of a completion (chunk) we read.
type chunk struct {
	Choices []struct {
		Text         *string  `json:"text"`
		Delta        *message `json:"delta"`
		Message      *message `json:"message"`
		FinishReason *string  `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error   json.RawMessage `json:"error"`
	Pdserve map[string]any  `json:"pdserve"`
}

type message struct {
	Content          *string `json:"content"`
	ReasoningContent *string `json:"reasoning_content"`
	Reasoning        *string `json:"reasoning"`
	// ToolCalls are tool call deltas: output that is not reasoning (TTFO).
	ToolCalls []json.RawMessage `json:"tool_calls"`
}

func nonEmpty(s *string) bool { return s != nil && *s != "" }

// apply records one parsed chunk received at now. It returns an error for
// an error object in the stream.
func (t *tracker) apply(now time.Time, ch *chunk, out *Outcome) error {
	if len(ch.Error) > 0 && string(ch.Error) != "null" {
		out.ErrorType, out.ErrorCode, out.ErrorMessage = apiErrorFields(ch.Error)
		return fmt.Errorf("server error: %s", errorText(ch.Error))
	}
	if ch.Usage != nil {
		out.UsageReported = true
		out.OutputTokens = ch.Usage.CompletionTokens
		out.ServerPromptTokens = ch.Usage.PromptTokens
	}
	if ch.Pdserve != nil {
		out.Budget = ch.Pdserve
	}
	var answer, reasoning bool
	for _, c := range ch.Choices {
		if c.FinishReason != nil && *c.FinishReason != "" {
			out.FinishReason = *c.FinishReason
		}
		m := c.Delta
		if m == nil {
			m = c.Message
		}
		if nonEmpty(c.Text) {
			answer = true
			t.text.WriteString(*c.Text)
		}
		if m != nil {
			if nonEmpty(m.Content) {
				answer = true
				t.text.WriteString(*m.Content)
			}
			answer = answer || len(m.ToolCalls) > 0
			reasoning = reasoning || nonEmpty(m.ReasoningContent) || nonEmpty(m.Reasoning)
		}
	}
	if answer || reasoning {
		t.token(now, answer, reasoning, out)
	}
	return nil
}

// apiErrorFields returns the type, code and message of an OpenAI error
// object; a bare string is its message. Fields that are absent, null or
// not strings are "".
func apiErrorFields(raw json.RawMessage) (typ, code, msg string) {
	var e struct {
		Type    any `json:"type"`
		Code    any `json:"code"`
		Message any `json:"message"`
	}
	str := func(v any) string {
		switch x := v.(type) {
		case string:
			return x
		case float64:
			return fmt.Sprint(x)
		}
		return ""
	}
	if json.Unmarshal(raw, &e) == nil {
		return str(e.Type), str(e.Code), str(e.Message)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return "", "", s
	}
	return "", "", ""
}

// errorText returns the message of an OpenAI error object, or the raw JSON.
func errorText(raw json.RawMessage) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return e.Message
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// readSSE reads the event stream. Each "data:" line is one event, stamped
// as it is read (as vLLM's benchmark client does); "[DONE]" ends the
// stream; comments and other fields are ignored.
func (c *Client) readSSE(ctx context.Context, body io.Reader, t *tracker, out *Outcome) error {
	br := bufio.NewReaderSize(body, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			line = bytes.TrimRight(line, "\r\n")
			if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				now := c.o.Clock.Now()
				// A run ended mid-stream fails the request as canceled
				// (or timed out) even when the rest of the stream is
				// already in the buffer, where no read would see ctx.
				if cerr := ctx.Err(); cerr != nil {
					return fmt.Errorf("stream: %w", cerr)
				}
				v = bytes.TrimPrefix(v, []byte(" "))
				if string(v) == "[DONE]" {
					return nil
				}
				var ch chunk
				if jerr := json.Unmarshal(v, &ch); jerr != nil {
					return fmt.Errorf("bad event %q: %v", truncate(v, 120), jerr)
				}
				if aerr := t.apply(now, &ch, out); aerr != nil {
					return aerr
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("stream: %v", err)
		}
	}
}

// readJSON reads a non-streaming response, stamped when it has arrived.
func (c *Client) readJSON(body io.Reader, t *tracker, out *Outcome) error {
	data, err := io.ReadAll(body)
	if err != nil {
		return fmt.Errorf("response: %v", err)
	}
	now := c.o.Clock.Now()
	var ch chunk
	if err := json.Unmarshal(data, &ch); err != nil {
		return fmt.Errorf("bad response %q: %v", truncate(data, 120), err)
	}
	return t.apply(now, &ch, out)
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
