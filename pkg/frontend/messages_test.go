package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// msgServer is a test server whose backend writes the reply the last
// "say:" of the prompt asks for, with API keys (team-a limited to 3
// requests a minute); last returns the last request's prompt.
func msgServer(t *testing.T) (*testServer, func() string) {
	t.Helper()
	b, lastReq := sayLastBackend()
	last := func() string { return (tokenizer.Bytes{}).Decode(lastReq().Prompt) }
	keys := loadKeys(t, keyFile(t, keyTeamA+" name=team-a rpm=3", keyTeamB+" name=team-b"))
	ts := newTestServer(t, b, func(o *Options) {
		roomForTools(o)
		o.APIKeys = keys
	})
	return ts, last
}

// msgBody is a Messages API body whose user turn asks for reply.
func msgBody(reply, extra string) string {
	return `{"model":"tiny","max_tokens":200,"messages":[{"role":"user","content":` + sayInput(reply) + `}]` + extra + `}`
}

const msgWeatherTool = `,"tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]`

// msgEvents reads a Messages API stream: each event's name must be its
// data's type.
func msgEvents(t *testing.T, resp *http.Response) []map[string]any {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q, status %d", ct, resp.StatusCode)
	}
	var out []map[string]any
	for _, ev := range respEvents(t, resp.Body) {
		if ev.data["type"] != ev.name {
			t.Errorf("event %q carries type %v", ev.name, ev.data["type"])
		}
		out = append(out, ev.data)
	}
	return out
}

// streamShape returns the event types of a stream, runs of deltas of
// one block written once, and the text, thinking and input JSON of its
// deltas by block index.
func streamShape(evs []map[string]any) ([]string, map[int]string) {
	var types []string
	text := map[int]string{}
	for _, e := range evs {
		typ := e["type"].(string)
		if typ == "content_block_delta" {
			i := int(e["index"].(float64))
			d := e["delta"].(map[string]any)
			switch d["type"] {
			case "text_delta":
				text[i] += d["text"].(string)
			case "thinking_delta":
				text[i] += d["thinking"].(string)
			case "input_json_delta":
				text[i] += d["partial_json"].(string)
			}
			if len(types) > 0 && types[len(types)-1] == typ {
				continue
			}
		}
		if typ == "content_block_start" {
			typ += ":" + e["content_block"].(map[string]any)["type"].(string)
		}
		types = append(types, typ)
	}
	return types, text
}

// TestMessagesWhole: a Message with text and a tool call has Anthropic's
// shape (a text block, a tool_use block with its input an object,
// stop_reason tool_use, usage) and the pdserve budget; the system prompt
// reaches the model. Fails when the chat reply is not turned into
// content blocks.
func TestMessagesWhole(t *testing.T) {
	ts, last := msgServer(t)
	body := msgBody("Checking.\n"+toolCallText("get_weather", `{"city": "Paris"}`), `,"system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}]`+msgWeatherTool+`,"metadata":{"user_id":"u1"},"temperature":0.5,"top_p":0.9`)
	resp := ts.post(t, RouteMessages, body, "x-api-key", keyTeamB, "anthropic-version", "2023-06-01")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %v", resp.StatusCode, decodeJSON(t, resp.Body))
	}
	m := decodeJSON(t, resp.Body)
	if !strings.HasPrefix(m["id"].(string), "msg_") || m["type"] != "message" || m["role"] != "assistant" || m["model"] != "tiny" {
		t.Errorf("message head %v", m)
	}
	if m["stop_reason"] != "tool_use" || m["stop_sequence"] != nil {
		t.Errorf("stop_reason %v stop_sequence %v, want tool_use and null", m["stop_reason"], m["stop_sequence"])
	}
	content := asSlice(m["content"])
	if len(content) != 2 {
		t.Fatalf("content %v, want a text and a tool_use block", content)
	}
	if tb := content[0].(map[string]any); tb["type"] != "text" || tb["text"] != "Checking.\n" {
		t.Errorf("text block %v", tb)
	}
	tu := content[1].(map[string]any)
	if tu["type"] != "tool_use" || tu["name"] != "get_weather" || !strings.HasPrefix(tu["id"].(string), "toolu_") {
		t.Errorf("tool_use block %v", tu)
	}
	if diff := cmp.Diff(map[string]any{"city": "Paris"}, tu["input"]); diff != "" {
		t.Errorf("tool_use input (-want +got):\n%s", diff)
	}
	u := m["usage"].(map[string]any)
	for _, k := range []string{"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"} {
		if _, ok := u[k].(float64); !ok {
			t.Errorf("usage.%s missing: %v", k, u)
		}
	}
	if u["input_tokens"].(float64) <= 0 || u["output_tokens"].(float64) <= 0 {
		t.Errorf("usage %v", u)
	}
	if _, ok := m["pdserve"].(map[string]any)["ttft_ms"]; !ok {
		t.Errorf("no pdserve budget: %v", m["pdserve"])
	}
	if p := last(); !strings.Contains(p, "Be brief.") || !strings.Contains(p, "get_weather") {
		t.Errorf("the prompt lacks the system prompt or the tool: %q", p)
	}
}

// TestMessagesStream: the events of a streamed Message, in Anthropic's
// order, their deltas adding up to the reply, usage and stop_reason in
// message_delta. Fails when a block is not started or stopped, or the
// stream ends otherwise.
func TestMessagesStream(t *testing.T) {
	ts, _ := msgServer(t)
	body := msgBody("<think>hmm</think>Checking.\n"+toolCallText("get_weather", `{"city": "Paris"}`), msgWeatherTool+`,"stream":true`)
	evs := msgEvents(t, ts.post(t, RouteMessages, body, "Authorization", "Bearer "+keyTeamB))
	types, text := streamShape(evs)
	want := []string{"message_start", "ping",
		"content_block_start:thinking", "content_block_delta", "content_block_stop",
		"content_block_start:text", "content_block_delta", "content_block_stop",
		"content_block_start:tool_use", "content_block_delta", "content_block_stop",
		"message_delta", "message_stop"}
	if diff := cmp.Diff(want, types); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[int]string{0: "hmm", 1: "Checking.\n", 2: `{"city":"Paris"}`}, text); diff != "" {
		t.Errorf("deltas (-want +got):\n%s", diff)
	}
	start := evs[0]["message"].(map[string]any)
	if start["stop_reason"] != nil || len(asSlice(start["content"])) != 0 || start["usage"].(map[string]any)["input_tokens"].(float64) <= 0 {
		t.Errorf("message_start %v", start)
	}
	md := evs[len(evs)-2]
	if d := md["delta"].(map[string]any); d["stop_reason"] != "tool_use" || d["stop_sequence"] != nil {
		t.Errorf("message_delta %v", md)
	}
	if u := md["usage"].(map[string]any); u["output_tokens"].(float64) <= 0 {
		t.Errorf("message_delta usage %v", u)
	}
	if _, ok := md["pdserve"]; !ok {
		t.Errorf("message_delta without the pdserve budget")
	}
	for _, e := range evs {
		if e["type"] == "content_block_start" {
			if cb := e["content_block"].(map[string]any); cb["type"] == "tool_use" && (cb["name"] != "get_weather" || cmp.Diff(map[string]any{}, cb["input"]) != "") {
				t.Errorf("tool_use start %v", cb)
			}
		}
	}
}

// TestMessagesToolRoundTrip: an assistant turn's tool_use and the user
// turn's tool_result go back into the prompt as the chat path's call and
// tool message. Fails when either is dropped.
func TestMessagesToolRoundTrip(t *testing.T) {
	ts, last := msgServer(t)
	body := `{"model":"tiny","max_tokens":50` + msgWeatherTool + `,"tool_choice":{"type":"auto","disable_parallel_tool_use":true},"messages":[
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny, 21C"}]},{"type":"text","text":` + sayInput("It is sunny.") + `}]}]}`
	resp := ts.post(t, RouteMessages, body, "x-api-key", keyTeamB)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %v", resp.StatusCode, decodeJSON(t, resp.Body))
	}
	m := decodeJSON(t, resp.Body)
	if m["stop_reason"] != "end_turn" || asSlice(m["content"])[0].(map[string]any)["text"] != "It is sunny." {
		t.Errorf("message %v", m)
	}
	p := last()
	for _, want := range []string{`"name": "get_weather"`, `"city": "Paris"`, "sunny, 21C", "Checking."} {
		if !strings.Contains(p, want) {
			t.Errorf("prompt lacks %q:\n%s", want, p)
		}
	}
	if strings.Index(p, "sunny, 21C") > strings.LastIndex(p, "say:") {
		t.Errorf("the tool result comes after the user's text")
	}
}

// TestMessagesStopSequence: a stop sequence ends the reply before it with
// stop_reason stop_sequence and the sequence, whole and streamed. Fails
// when the matched string is not reported.
func TestMessagesStopSequence(t *testing.T) {
	ts, _ := msgServer(t)
	body := msgBody("abcENDdef", `,"stop_sequences":["XYZ","END"]`)
	m := decodeJSON(t, ts.post(t, RouteMessages, body, "x-api-key", keyTeamB).Body)
	if m["stop_reason"] != "stop_sequence" || m["stop_sequence"] != "END" || asSlice(m["content"])[0].(map[string]any)["text"] != "abc" {
		t.Errorf("message %v", m)
	}
	evs := msgEvents(t, ts.post(t, RouteMessages, strings.TrimSuffix(body, "}")+`,"stream":true}`, "x-api-key", keyTeamB))
	d := evs[len(evs)-2]["delta"].(map[string]any)
	if d["stop_reason"] != "stop_sequence" || d["stop_sequence"] != "END" {
		t.Errorf("message_delta %v", d)
	}
}

// TestMessagesMaxTokens: a reply cut by max_tokens has stop_reason
// max_tokens; one cut inside a tool call has its tool_use block as far
// as it goes (the input closed where it was cut; streamed, the partial
// JSON as written). Fails on the old parser, which made the cut call
// text.
func TestMessagesMaxTokens(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: echoText("Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par")}, roomForTools)
	body := `{"model":"tiny","max_tokens":60,"messages":[{"role":"user","content":"w?"}]` + msgWeatherTool
	m := decodeJSON(t, ts.post(t, RouteMessages, body+`}`).Body)
	if m["stop_reason"] != "max_tokens" {
		t.Errorf("stop_reason %v", m["stop_reason"])
	}
	content := asSlice(m["content"])
	if len(content) != 2 {
		t.Fatalf("content %v, want text and tool_use", content)
	}
	tu := content[1].(map[string]any)
	if tu["type"] != "tool_use" || tu["name"] != "get_weather" || cmp.Diff(map[string]any{"city": "Par"}, tu["input"]) != "" {
		t.Errorf("cut tool_use %v", tu)
	}
	types, text := streamShape(msgEvents(t, ts.post(t, RouteMessages, body+`,"stream":true}`)))
	if !strings.Contains(strings.Join(types, " "), "content_block_start:tool_use content_block_delta content_block_stop message_delta") || text[1] != `{"city": "Par` {
		t.Errorf("stream %v, deltas %v", types, text)
	}
}

// TestMessagesErrors: what is wrong or unsupported is a 400 in
// Anthropic's shape naming the parameter; authentication takes x-api-key
// or a bearer token; a key's rate limit applies (429 rate_limit_error).
func TestMessagesErrors(t *testing.T) {
	ts, _ := msgServer(t)
	for _, tc := range []struct {
		name, body, param string
	}{
		{"max_tokens required", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`, "max_tokens"},
		{"model required", `{"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "model"},
		{"messages required", `{"model":"tiny","max_tokens":5}`, "messages"},
		{"top_k", msgBody("hi", `,"top_k":5`), "top_k"},
		{"unknown", msgBody("hi", `,"frequency_penalty":1`), "frequency_penalty"},
		{"temperature over 1", msgBody("hi", `,"temperature":1.5`), "temperature"},
		{"thinking", msgBody("hi", `,"thinking":{"type":"enabled","budget_tokens":1024}`), "thinking"},
		{"image", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":""}}]}]}`, "messages.0.content.0.type"},
		{"server tool", msgBody("hi", `,"tools":[{"type":"web_search_20250305","name":"web_search"}]`), "tools.0.type"},
		{"tool_choice", msgBody("hi", msgWeatherTool+`,"tool_choice":{"type":"required"}`), "tool_choice.type"},
		{"mcp", msgBody("hi", `,"mcp_servers":[{"type":"url","url":"http://x","name":"x"}]`), "mcp_servers"},
		{"role", `{"model":"tiny","max_tokens":5,"messages":[{"role":"system","content":"hi"}]}`, "messages.0.role"},
		{"unknown model", `{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "model"},
		{"too many stop sequences", msgBody("hi", `,"stop_sequences":["a","b","c","d","e"]`), "stop_sequences"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := ts.post(t, RouteMessages, tc.body, "x-api-key", keyTeamB)
			want := http.StatusBadRequest
			if tc.name == "unknown model" {
				want = http.StatusNotFound
			}
			m := decodeJSON(t, resp.Body)
			e, _ := m["error"].(map[string]any)
			if resp.StatusCode != want || m["type"] != "error" || e == nil {
				t.Fatalf("status %d body %v, want %d and an Anthropic error", resp.StatusCode, m, want)
			}
			typ := "invalid_request_error"
			if want == http.StatusNotFound {
				typ = "not_found_error"
			}
			if e["type"] != typ || !strings.Contains(e["message"].(string), tc.param) {
				t.Errorf("error %v, want type %s naming %s", e, typ, tc.param)
			}
		})
	}

	// Authentication: none, a wrong key, either header.
	for _, tc := range []struct {
		hdr  []string
		want int
	}{
		{nil, http.StatusUnauthorized},
		{[]string{"x-api-key", keyWrong}, http.StatusUnauthorized},
		{[]string{"x-api-key", keyTeamA}, http.StatusOK},
		{[]string{"Authorization", "Bearer " + keyTeamA}, http.StatusOK},
	} {
		resp := ts.post(t, RouteMessages, msgBody("ok", ""), tc.hdr...)
		m := decodeJSON(t, resp.Body)
		if resp.StatusCode != tc.want {
			t.Errorf("%v: status %d (%v), want %d", tc.hdr, resp.StatusCode, m, tc.want)
		}
		if tc.want == http.StatusUnauthorized && (m["type"] != "error" || m["error"].(map[string]any)["type"] != "authentication_error") {
			t.Errorf("%v: 401 body %v", tc.hdr, m)
		}
	}
	// team-a has 3 requests a minute: two were taken above.
	ts.post(t, RouteMessages, msgBody("ok", ""), "x-api-key", keyTeamA)
	resp := ts.post(t, RouteMessages, msgBody("ok", ""), "x-api-key", keyTeamA)
	m := decodeJSON(t, resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || m["error"].(map[string]any)["type"] != "rate_limit_error" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("over the limit: status %d %v Retry-After %q", resp.StatusCode, m, resp.Header.Get("Retry-After"))
	}
}

// TestMessagesOverloaded: a full server is Anthropic's 529
// overloaded_error with Retry-After.
func TestMessagesOverloaded(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return finishes(req, "stop"), nil
	}}, func(o *Options) { o.MaxInFlight = 1 })
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Post(ts.URL+RouteMessages, "application/json", strings.NewReader(`{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-started
	resp := ts.post(t, RouteMessages, `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
	m := decodeJSON(t, resp.Body)
	close(release)
	<-done
	if resp.StatusCode != 529 || m["error"].(map[string]any)["type"] != "overloaded_error" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("status %d %v Retry-After %q, want 529 overloaded_error", resp.StatusCode, m, resp.Header.Get("Retry-After"))
	}
}

// TestPartialObject: a tool input cut short is closed where it was cut.
func TestPartialObject(t *testing.T) {
	for in, want := range map[string]string{
		`{"city": "Paris"}`:             `{"city": "Paris"}`,
		`{"city": "Par`:                 `{"city": "Par"}`,
		`{"a": 1, "b`:                   `{"a": 1}`,
		`{"a": [1, 2, {"x": tr`:         `{"a": [1, 2, {}]}`,
		`{"a": "x\"y`:                   `{"a": "x\"y"}`,
		`{"a": 12`:                      `{"a": 12}`,
		`{"a":`:                         `{}`,
		``:                              `{}`,
		`[1, 2`:                         `{}`,
		`{"a": {"b": "c"}, "d": ["e", `: `{"a": {"b": "c"}, "d": ["e"]}`,
	} {
		got := string(partialObject(in))
		if got != want {
			t.Errorf("partialObject(%q) = %s, want %s", in, got, want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("partialObject(%q) = %s: not JSON", in, got)
		}
	}
}

// TestMessagesErrorMidStream: a failure after the stream began ends it
// with Anthropic's error event (api_error, no internal text), after the
// text already sent; before any output it is a whole error response.
func TestMessagesErrorMidStream(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		if err := emit(Output{Tokens: []int32{'a'}}); err != nil {
			return nil, err
		}
		return nil, errors.New("decode worker d0 failed and no KV is retained")
	}}, nil)
	body := `{"model":"tiny","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	evs := msgEvents(t, ts.post(t, RouteMessages, body))
	types, _ := streamShape(evs)
	if diff := cmp.Diff([]string{"message_start", "ping", "content_block_start:text", "content_block_delta", "error"}, types); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	e := evs[len(evs)-1]["error"].(map[string]any)
	if e["type"] != "api_error" || strings.Contains(e["message"].(string), "KV") {
		t.Errorf("error event %v, want a generic api_error", e)
	}

	ts2 := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		return nil, errors.New("no KV")
	}}, nil)
	resp := ts2.post(t, RouteMessages, body)
	m := decodeJSON(t, resp.Body)
	if resp.StatusCode != http.StatusInternalServerError || m["type"] != "error" || m["error"].(map[string]any)["type"] != "api_error" || !strings.HasPrefix(m["request_id"].(string), "msg_") {
		t.Errorf("status %d body %v, want a 500 api_error", resp.StatusCode, m)
	}
}
