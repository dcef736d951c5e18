package frontend

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/pdserve/pdserve/pkg/respstore"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// jetStreamStore runs a JetStream nats-server in process and opens the
// response store on it.
func jetStreamStore(t *testing.T) *respstore.Store {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), JetStreamMaxMemory: 64 << 20, JetStreamMaxStore: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	lim := respstore.DefaultLimits()
	lim.MaxBytes, lim.MaxBytesPerOwner = 16<<20, 8<<20
	st, err := respstore.Open(context.Background(), nc, lim)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// respServer is a frontend with the say backend (it writes the reply the
// last "say:" of the prompt asks for), API keys A and B and a store.
// sayLastBackend is sayBackend for conversations: the last "say:" of the
// prompt is this turn's. last returns the last request.
func sayLastBackend() (b *fakeBackend, last func() *Request) {
	var mu sync.Mutex
	var lastReq *Request
	b = sayBackend()
	inner := b.complete
	b.complete = func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		mu.Lock()
		lastReq = req
		mu.Unlock()
		p := (tokenizer.Bytes{}).Decode(req.Prompt)
		if i := strings.LastIndex(p, "say:"); i >= 0 {
			cp := *req
			cp.Prompt = (tokenizer.Bytes{}).Encode(p[i:])
			req = &cp
		}
		return inner(ctx, req, emit)
	}
	return b, func() *Request { mu.Lock(); defer mu.Unlock(); return lastReq }
}

func respServer(t *testing.T) (*testServer, func() *Request) {
	t.Helper()
	b, last := sayLastBackend()
	keys := loadKeys(t, keyFile(t, keyTeamA+" name=team-a", keyTeamB+" name=team-b"))
	ts := newTestServer(t, b, func(o *Options) {
		o.Policy.Budgets.Default, o.Policy.Budgets.Routes = 8000, nil
		o.Policy.Limits.MaxTokensCap = 0
		o.Models = func() []Model { return []Model{{Name: "tiny", MaxModelLen: 16384}} }
		o.APIKeys = keys
		o.Responses = jetStreamStore(t)
	})
	return ts, last
}

func sayInput(reply string) string {
	q, _ := json.Marshal("say:" + mustJSON(reply))
	return string(q)
}

const weatherTool = `"tools":[{"type":"function","name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]`

func toolCallText(name, args string) string {
	return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>"
}

func respJSON(t *testing.T, r io.Reader) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.NewDecoder(r).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// respEvent is one SSE event of a streamed response.
type respEvent struct {
	name string // the event: line
	data map[string]any
}

func respEvents(t *testing.T, r io.Reader) []respEvent {
	t.Helper()
	var out []respEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var m map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m); err != nil {
				t.Fatalf("event data %q: %v", line, err)
			}
			out = append(out, respEvent{name: name, data: m})
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return out
}

// outputShape is the (type, text) of each output item.
func outputShape(resp map[string]any) [][3]string {
	var out [][3]string
	for _, o := range asSlice(resp["output"]) {
		it := o.(map[string]any)
		switch it["type"] {
		case "message":
			c := asSlice(it["content"])[0].(map[string]any)
			out = append(out, [3]string{"message", c["text"].(string), it["status"].(string)})
		case "reasoning":
			c := asSlice(it["content"])[0].(map[string]any)
			out = append(out, [3]string{"reasoning", c["text"].(string), it["status"].(string)})
		case "function_call":
			out = append(out, [3]string{"function_call", it["name"].(string) + it["arguments"].(string), it["status"].(string)})
		}
	}
	return out
}

// TestResponsesWhole: a non-streamed response with text and a tool call
// has OpenAI's shape, the pdserve budget and usage; fails when the chat
// reply is not turned into output items.
func TestResponsesWhole(t *testing.T) {
	ts, last := respServer(t)
	body := `{"model":"tiny","instructions":"Be brief.","input":` + sayInput("Checking.\n"+toolCallText("get_weather", `{"city": "Paris"}`)) +
		`,` + weatherTool + `,"metadata":{"k":"v"},"max_output_tokens":400,"temperature":0.5}`
	resp := ts.post(t, RouteResponses, body, "Authorization", "Bearer "+keyTeamA)
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	m := respJSON(t, resp.Body)
	want := [][3]string{{"message", "Checking.\n", "completed"}, {"function_call", `get_weather{"city":"Paris"}`, "completed"}}
	if diff := cmp.Diff(want, outputShape(m)); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
	id, _ := m["id"].(string)
	if !strings.HasPrefix(id, "resp_") || m["object"] != "response" || m["status"] != "completed" || m["model"] != "tiny" ||
		m["instructions"] != "Be brief." || m["temperature"] != 0.5 || m["max_output_tokens"] != 400.0 || m["store"] != true {
		t.Errorf("response fields: %v", m)
	}
	if diff := cmp.Diff(map[string]any{"k": "v"}, m["metadata"]); diff != "" {
		t.Errorf("metadata: %s", diff)
	}
	call := asSlice(m["output"])[1].(map[string]any)
	if cid, _ := call["call_id"].(string); !strings.HasPrefix(cid, "call_") || !strings.HasPrefix(call["id"].(string), "fc_") {
		t.Errorf("function_call ids: %v", call)
	}
	u := m["usage"].(map[string]any)
	if u["input_tokens"].(float64) < 1 || u["output_tokens"].(float64) < 1 || u["total_tokens"] != u["input_tokens"].(float64)+u["output_tokens"].(float64) {
		t.Errorf("usage %v", u)
	}
	if _, ok := u["input_tokens_details"].(map[string]any)["cached_tokens"]; !ok {
		t.Errorf("usage without input_tokens_details.cached_tokens: %v", u)
	}
	if _, ok := m["pdserve"].(map[string]any)["ttft_ms"]; !ok {
		t.Errorf("no pdserve budget: %v", m["pdserve"])
	}
	if p := (tokenizer.Bytes{}).Decode(last().Prompt); !strings.Contains(p, "Be brief.") || !strings.Contains(p, "get_weather") {
		t.Errorf("prompt %q lacks the instructions or the tool", p)
	}
	// The stored copy is what was returned.
	r2, got := ts.get(t, RouteResponses+"/"+id, "Authorization", "Bearer "+keyTeamA)
	if r2.StatusCode != 200 {
		t.Fatalf("GET: %d %s", r2.StatusCode, got)
	}
	var stored map[string]any
	_ = json.Unmarshal([]byte(got), &stored)
	if diff := cmp.Diff(m, stored); diff != "" {
		t.Errorf("stored response differs (-returned +stored):\n%s", diff)
	}
}

// TestResponsesStream: the events of a streamed response with reasoning
// and text come in OpenAI's order with sequence numbers 0, 1, …, and
// the final response is the one stored. Fails on a missing or
// misordered event.
func TestResponsesStream(t *testing.T) {
	ts, _ := respServer(t)
	body := `{"input":` + sayInput("<think>hm</think>Hi") + `,"stream":true}`
	resp := ts.post(t, RouteResponses, body, "Authorization", "Bearer "+keyTeamA)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := respEvents(t, resp.Body)
	var types []string
	var reasoning, text strings.Builder
	for i, e := range evs {
		typ, _ := e.data["type"].(string)
		if typ != e.name {
			t.Errorf("event %d: event line %q, type %q", i, e.name, typ)
		}
		if e.data["sequence_number"] != float64(i) {
			t.Errorf("event %d (%s): sequence_number %v", i, typ, e.data["sequence_number"])
		}
		switch typ {
		case "response.reasoning_text.delta":
			reasoning.WriteString(e.data["delta"].(string))
		case "response.output_text.delta":
			text.WriteString(e.data["delta"].(string))
		}
		if len(types) == 0 || types[len(types)-1] != typ || !strings.HasSuffix(typ, ".delta") {
			types = append(types, typ) // deltas in a row count once
		}
	}
	want := []string{"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.completed"}
	if diff := cmp.Diff(want, types); diff != "" {
		t.Fatalf("event types (-want +got):\n%s", diff)
	}
	if reasoning.String() != "hm" || text.String() != "Hi" {
		t.Errorf("reasoning %q text %q", reasoning.String(), text.String())
	}
	final := evs[len(evs)-1].data["response"].(map[string]any)
	if diff := cmp.Diff([][3]string{{"reasoning", "hm", "completed"}, {"message", "Hi", "completed"}}, outputShape(final)); diff != "" {
		t.Errorf("final output (-want +got):\n%s", diff)
	}
	if created := evs[0].data["response"].(map[string]any); created["status"] != "in_progress" || created["id"] != final["id"] {
		t.Errorf("response.created: %v", created)
	}
	_, got := ts.get(t, RouteResponses+"/"+final["id"].(string), "Authorization", "Bearer "+keyTeamA)
	var stored map[string]any
	_ = json.Unmarshal([]byte(got), &stored)
	if diff := cmp.Diff(final, stored); diff != "" {
		t.Errorf("stored response differs from response.completed's (-event +stored):\n%s", diff)
	}
}

// TestResponsesContinuation: previous_response_id continues the
// conversation (the earlier turns are in the prompt, instructions are
// not carried over); another key can neither read, list, delete nor
// continue the response (404); a deleted one is 404. Fails when the
// store ignores the owner.
func TestResponsesContinuation(t *testing.T) {
	ts, last := respServer(t)
	authA := []string{"Authorization", "Bearer " + keyTeamA}
	authB := []string{"Authorization", "Bearer " + keyTeamB}
	resp := ts.post(t, RouteResponses, `{"instructions":"FIRST-INSTR","input":`+sayInput(toolCallText("get_weather", `{"city": "Oslo"}`))+`,`+weatherTool+`}`, authA...)
	m := respJSON(t, resp.Body)
	id := m["id"].(string)
	callID := asSlice(m["output"])[0].(map[string]any)["call_id"].(string)

	next := `{"previous_response_id":"` + id + `","input":[{"type":"function_call_output","call_id":"` + callID + `","output":"TOOL-RESULT-7"},{"role":"user","content":` + sayInput("Done.") + `}],` + weatherTool + `}`
	// Another key: 404, and nothing of the conversation reaches a worker.
	r := ts.post(t, RouteResponses, next, authB...)
	if r.StatusCode != 404 {
		t.Fatalf("continuation by another key: %d, want 404", r.StatusCode)
	}
	e := respJSON(t, r.Body)["error"].(map[string]any)
	if e["param"] != "previous_response_id" || e["code"] != "response_not_found" {
		t.Errorf("error %v", e)
	}
	for _, path := range []string{"/" + id, "/" + id + "/input_items"} {
		if r, body := ts.get(t, RouteResponses+path, authB...); r.StatusCode != 404 || strings.Contains(body, "Oslo") {
			t.Errorf("GET %s by another key: %d %s", path, r.StatusCode, body)
		}
	}
	req, _ := http.NewRequest(http.MethodDelete, ts.URL+RouteResponses+"/"+id, nil)
	req.Header.Set(authB[0], authB[1])
	if r, err := ts.Client().Do(req); err != nil || r.StatusCode != 404 {
		t.Fatalf("DELETE by another key: %v %v", r.StatusCode, err)
	}

	r = ts.post(t, RouteResponses, next, authA...)
	m2 := respJSON(t, r.Body)
	if r.StatusCode != 200 || m2["previous_response_id"] != id {
		t.Fatalf("continuation: %d %v", r.StatusCode, m2)
	}
	p := (tokenizer.Bytes{}).Decode(last().Prompt)
	for _, s := range []string{"Oslo", "TOOL-RESULT-7", "get_weather"} {
		if !strings.Contains(p, s) {
			t.Errorf("the continued prompt lacks %q: %q", s, p)
		}
	}
	if strings.Contains(p, "FIRST-INSTR") {
		t.Errorf("the previous response's instructions were carried over: %q", p)
	}
	if diff := cmp.Diff([][3]string{{"message", "Done.", "completed"}}, outputShape(m2)); diff != "" {
		t.Errorf("output: %s", diff)
	}
	// input_items: this request's items, newest first by default.
	_, body := ts.get(t, RouteResponses+"/"+m2["id"].(string)+"/input_items", authA...)
	var list map[string]any
	_ = json.Unmarshal([]byte(body), &list)
	data := asSlice(list["data"])
	if list["object"] != "list" || len(data) != 2 || data[0].(map[string]any)["type"] != "message" || data[1].(map[string]any)["type"] != "function_call_output" {
		t.Errorf("input_items: %s", body)
	}
	// DELETE, then 404 for reads and continuations.
	req, _ = http.NewRequest(http.MethodDelete, ts.URL+RouteResponses+"/"+id, nil)
	req.Header.Set(authA[0], authA[1])
	dr, err := ts.Client().Do(req)
	if err != nil || dr.StatusCode != 200 {
		t.Fatalf("DELETE: %v %v", dr.StatusCode, err)
	}
	if del := respJSON(t, dr.Body); del["deleted"] != true || del["object"] != "response.deleted" {
		t.Errorf("delete body %v", del)
	}
	if r, _ := ts.get(t, RouteResponses+"/"+id, authA...); r.StatusCode != 404 {
		t.Errorf("GET after DELETE: %d", r.StatusCode)
	}
	if r := ts.post(t, RouteResponses, next, authA...); r.StatusCode != 404 {
		t.Errorf("continuation of a deleted response: %d", r.StatusCode)
	}
}

// TestResponsesStoreFalse: store false keeps nothing.
func TestResponsesStoreFalse(t *testing.T) {
	ts, _ := respServer(t)
	m := respJSON(t, ts.post(t, RouteResponses, `{"input":`+sayInput("x")+`,"store":false}`, "Authorization", "Bearer "+keyTeamA).Body)
	if m["store"] != false {
		t.Errorf("store %v", m["store"])
	}
	if r, _ := ts.get(t, RouteResponses+"/"+m["id"].(string), "Authorization", "Bearer "+keyTeamA); r.StatusCode != 404 {
		t.Errorf("GET of a store:false response: %d, want 404", r.StatusCode)
	}
}

// TestResponsesIncomplete: a response cut by max_output_tokens is
// incomplete, streamed and not (a server without a store: store
// false).
func TestResponsesIncomplete(t *testing.T) {
	ts2 := newTestServer(t, &fakeBackend{complete: echoText("abcdef")}, nil)
	m := respJSON(t, ts2.post(t, RouteResponses, `{"input":"hi","max_output_tokens":6}`).Body)
	if m["status"] != "incomplete" || m["incomplete_details"].(map[string]any)["reason"] != "max_output_tokens" || m["store"] != false {
		t.Errorf("cut response: %v", m)
	}
	evs := respEvents(t, ts2.post(t, RouteResponses, `{"input":"hi","max_output_tokens":6,"stream":true}`).Body)
	lastEv := evs[len(evs)-1].data
	if lastEv["type"] != "response.incomplete" || lastEv["response"].(map[string]any)["status"] != "incomplete" {
		t.Errorf("last event %v", lastEv)
	}
	item := evs[len(evs)-2].data
	if item["type"] != "response.output_item.done" || item["item"].(map[string]any)["status"] != "incomplete" {
		t.Errorf("last item event %v", item)
	}
}

// TestResponsesRefusals: what pdserve cannot do is a 400 naming the
// parameter, never ignored.
func TestResponsesRefusals(t *testing.T) {
	ts, _ := respServer(t)
	for _, tc := range []struct{ body, param string }{
		{`{"input":"x","background":true}`, "background"},
		{`{"input":"x","tools":[{"type":"web_search"}]}`, "tools[0].type"},
		{`{"input":"x","frobnicate":1}`, "frobnicate"},
		{`{"input":"x","truncation":"auto"}`, "truncation"},
		{`{"input":"x","reasoning":{"effort":"high"}}`, "reasoning.effort"},
		{`{"input":"x","include":["reasoning.encrypted_content"]}`, "include"},
		{`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x"}]}]}`, "input[0].content[0].type"},
		{`{"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"},"bogus":1}}}`, "text.format.bogus"},
		{`{"input":"x","max_output_tokens":999999}`, "max_output_tokens"},
		{`{"input":"x","max_output_tokens":-1}`, "max_output_tokens"},
		{`{"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":5}}}`, "text.format"},
		{`{"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object","not":{}}}}}`, "text.format"},
		{`{"input":"x","tool_choice":{"type":"file_search"}}`, "tool_choice.type"},
		{`{"input":"x","conversation":"conv_1"}`, "conversation"},
		{`{}`, "input"},
	} {
		r := ts.post(t, RouteResponses, tc.body, "Authorization", "Bearer "+keyTeamA)
		m := respJSON(t, r.Body)
		e, _ := m["error"].(map[string]any)
		if r.StatusCode != 400 || e == nil || e["param"] != tc.param {
			t.Errorf("%s: %d %v, want 400 naming %s", tc.body, r.StatusCode, m, tc.param)
		}
		// The message names the parameters as this API does, never as
		// the chat path it runs on.
		msg, _ := e["message"].(string)
		for _, chat := range []string{"response_format", "max_completion_tokens", "max_tokens", "messages"} {
			if strings.Contains(msg, chat) {
				t.Errorf("%s: message %q names chat's %s", tc.body, msg, chat)
			}
		}
	}
}

// TestResponsesJSONSchema: text.format json_schema decodes under the
// schema's grammar, as chat's response_format does.
func TestResponsesJSONSchema(t *testing.T) {
	ts, last := respServer(t)
	body := `{"input":` + sayInput(`{"a":1}`) + `,"text":{"format":{"type":"json_schema","name":"out","schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false},"strict":true}}}`
	r := ts.post(t, RouteResponses, body, "Authorization", "Bearer "+keyTeamA)
	m := respJSON(t, r.Body)
	if r.StatusCode != 200 || last().Sampling.Grammar == "" {
		t.Fatalf("%d %v grammar %q", r.StatusCode, m, last().Sampling.Grammar)
	}
	f := m["text"].(map[string]any)["format"].(map[string]any)
	if f["type"] != "json_schema" || f["name"] != "out" {
		t.Errorf("text.format echo %v", f)
	}
}

// wsDial opens a Responses WebSocket with key.
func wsDial(t *testing.T, ts *testServer, key string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{}
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(ts.URL, "http")+RouteResponses, &websocket.DialOptions{HTTPHeader: h})
	if err == nil {
		t.Cleanup(func() { _ = c.CloseNow() })
	}
	return c, resp, err
}

// wsUntilEnd reads events until a response's last one (or an error)
// and returns them.
func wsUntilEnd(t *testing.T, c *websocket.Conn) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []map[string]any
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v (after %d events)", err, len(out))
		}
		var ev map[string]any
		if err := json.Unmarshal(data, &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
		switch ev["type"] {
		case "response.completed", "response.incomplete", "response.failed", "error":
			return out
		}
	}
}

// TestResponsesWebSocket: WebSocket mode authenticates the upgrade,
// runs response.create events in sequence with stream_id echoed,
// continues with previous_response_id from the socket's own state (store
// false) and refuses another key's response; a closed socket cancels
// its generation. Fails without the socket's conversation state (the
// continuation is then a 404 error event).
func TestResponsesWebSocket(t *testing.T) {
	ts, last := respServer(t)
	if _, resp, err := wsDial(t, ts, ""); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("upgrade without a key: %v %v", resp, err)
	}
	c, _, err := wsDial(t, ts, keyTeamA)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	send := func(c *websocket.Conn, v string) {
		if err := c.Write(ctx, websocket.MessageText, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	send(c, `{"type":"response.create","stream_id":"lane-1","store":false,"input":`+sayInput("FIRST-ANSWER")+`}`)
	evs := wsUntilEnd(t, c)
	end := evs[len(evs)-1]
	if end["type"] != "response.completed" {
		t.Fatalf("first response ended with %v", end)
	}
	for i, ev := range evs {
		if ev["stream_id"] != "lane-1" || ev["sequence_number"] != float64(i) {
			t.Errorf("event %d: stream_id %v sequence_number %v", i, ev["stream_id"], ev["sequence_number"])
		}
	}
	id := end["response"].(map[string]any)["id"].(string)
	send(c, `{"type":"response.create","previous_response_id":"`+id+`","store":false,"input":`+sayInput("second")+`}`)
	evs = wsUntilEnd(t, c)
	if end := evs[len(evs)-1]; end["type"] != "response.completed" {
		t.Fatalf("continuation ended with %v", end)
	}
	if p := (tokenizer.Bytes{}).Decode(last().Prompt); !strings.Contains(p, "FIRST-ANSWER") {
		t.Errorf("the continuation's prompt lacks the first turn: %q", p)
	}
	// Another key's socket: not its response.
	cb, _, err := wsDial(t, ts, keyTeamB)
	if err != nil {
		t.Fatal(err)
	}
	send(cb, `{"type":"response.create","previous_response_id":"`+id+`","input":"x"}`)
	evs = wsUntilEnd(t, cb)
	if e := evs[len(evs)-1]; e["type"] != "error" || e["status"] != 404.0 {
		t.Errorf("another key's continuation: %v", e)
	}
	send(cb, `{"type":"response.cancel"}`)
	if e := wsUntilEnd(t, cb); e[0]["type"] != "error" {
		t.Errorf("an unknown event type: %v", e)
	}
}

// TestResponsesWebSocketClose: closing the socket cancels its
// generation.
func TestResponsesWebSocketClose(t *testing.T) {
	started, cancelled := make(chan struct{}), make(chan struct{})
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		close(started)
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	}}, nil)
	c, _, err := wsDial(t, ts, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(context.Background(), websocket.MessageText, []byte(`{"type":"response.create","input":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	<-started
	_ = c.CloseNow()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the socket did not cancel the generation")
	}
}
