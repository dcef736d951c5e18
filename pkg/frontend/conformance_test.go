package frontend

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/sampling"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// logitsAt returns made-up logits of the byte-level vocabulary for
// position pos: a deterministic, uneven distribution whose likely tokens
// are ASCII.
func logitsAt(pos int) []float32 {
	l := make([]float32, tokenizer.Vocab)
	for i := range l {
		l[i] = float32((i*7+pos*13)%31) / 4
		if i >= 128 {
			l[i] -= 10
		}
	}
	return l
}

// modelOutput is the text choice j of a request on prompt gets from
// modelBackend: "r", the prompt's first byte, j.
func modelOutput(prompt []int32, j int) string {
	return "r" + string(rune(prompt[0])) + strconv.Itoa(j)
}

// modelBackend emits modelOutput in each choice, one token per emit,
// the choices interleaved, with engine.Logprob of logitsAt(position) when
// asked; and the prompt's logprobs first when asked.
func modelBackend() *fakeBackend {
	return &fakeBackend{complete: func(_ context.Context, req *Request, emit EmitFunc) ([]string, error) {
		if req.PromptLogprobs >= 0 {
			var lps []sampling.TokenLogprob
			for i := 1; i < len(req.Prompt); i++ {
				lps = append(lps, engine.Logprob(logitsAt(i), req.Prompt[i], req.PromptLogprobs))
			}
			if err := emit(Output{Prompt: true, Logprobs: lps}); err != nil {
				return nil, err
			}
		}
		texts := make([][]int32, req.N)
		for j := range texts {
			texts[j] = (tokenizer.Bytes{}).Encode(modelOutput(req.Prompt, j))
			texts[j] = texts[j][:min(len(texts[j]), req.MaxTokens)]
		}
		for k := range texts[0] {
			for j, text := range texts {
				o := Output{Index: j, Tokens: text[k : k+1]}
				if req.Logprobs >= 0 {
					o.Logprobs = []sampling.TokenLogprob{engine.Logprob(logitsAt(len(req.Prompt)+k), text[k], req.Logprobs)}
				}
				if err := emit(o); err != nil && !errors.Is(err, ErrStopped) {
					return nil, err
				}
			}
		}
		return finishes(req, "length"), nil
	}}
}

// wantLogprob is the logprob modelBackend sends for token at pos.
func wantLogprob(pos int, token int32) float64 {
	return float64(engine.Logprob(logitsAt(pos), token, 0).Logprob)
}

// rawRequest opens a connection to ts and sends the headers of a POST to
// path with Content-Length n and no body yet.
func rawRequest(t *testing.T, ts *testServer, path string, n int) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, n); err != nil {
		t.Fatal(err)
	}
	return conn
}

// readResponse reads the HTTP response on conn.
func readResponse(t *testing.T, conn net.Conn) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// inFlight returns the server's admitted requests.
func (ts *testServer) inFlight() int {
	ts.srv.mu.Lock()
	defer ts.srv.mu.Unlock()
	return ts.srv.inFlight
}

// holdSlots takes the server's k in-flight slots (it has no other
// request) with requests whose bodies are not sent yet; release sends
// them.
func holdSlots(t *testing.T, ts *testServer, k int) (release func()) {
	t.Helper()
	body := `{"prompt":"held","max_tokens":1}`
	var conns []net.Conn
	for range k {
		conns = append(conns, rawRequest(t, ts, RouteCompletions, len(body)))
	}
	waitFor(t, func() error {
		if n := ts.inFlight(); n != k {
			return fmt.Errorf("%d requests in flight, want the %d held", n, k)
		}
		return nil
	})
	return func() {
		for _, conn := range conns {
			if _, err := conn.Write([]byte(body)); err != nil {
				t.Fatal(err)
			}
			if resp := readResponse(t, conn); resp.StatusCode != http.StatusOK {
				t.Errorf("held request: status %d", resp.StatusCode)
			}
		}
	}
}

// idle waits until the server has no request in flight (a handler may
// release its slot just after the client read the response).
func (ts *testServer) idle(t *testing.T) {
	t.Helper()
	waitFor(t, func() error {
		if n := ts.inFlight(); n != 0 {
			return fmt.Errorf("%d requests in flight", n)
		}
		return nil
	})
}

func floats(v any) []float64 {
	var out []float64
	for _, x := range v.([]any) {
		if x == nil {
			out = append(out, -1e9) // null
			continue
		}
		out = append(out, x.(float64))
	}
	return out
}

func strs(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

func choices(t *testing.T, m map[string]any) []map[string]any {
	t.Helper()
	cs, ok := m["choices"].([]any)
	if !ok {
		t.Fatalf("choices = %v", m["choices"])
	}
	out := make([]map[string]any, len(cs))
	for i, c := range cs {
		out[i] = c.(map[string]any)
	}
	return out
}

// checkCompletionLogprobs checks a completions choice.logprobs against
// modelBackend's: tokens from position start, top alternatives top.
func checkCompletionLogprobs(t *testing.T, lp map[string]any, tokens string, start, top int) {
	t.Helper()
	keys := make([]string, 0, len(lp))
	for k := range lp {
		keys = append(keys, k)
	}
	if diff := cmp.Diff([]string{"text_offset", "token_logprobs", "tokens", "top_logprobs"}, sortedStrings(keys)); diff != "" {
		t.Fatalf("logprobs keys (-want +got):\n%s", diff)
	}
	var wantTokens []string
	var wantLPs []float64
	var wantOffsets []float64
	for i := range len(tokens) {
		wantTokens = append(wantTokens, tokens[i:i+1])
		wantLPs = append(wantLPs, wantLogprob(start+i, int32(tokens[i])))
		wantOffsets = append(wantOffsets, float64(i))
	}
	if diff := cmp.Diff(wantTokens, strs(lp["tokens"])); diff != "" {
		t.Errorf("tokens (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantLPs, floats(lp["token_logprobs"])); diff != "" {
		t.Errorf("token_logprobs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantOffsets, floats(lp["text_offset"])); diff != "" {
		t.Errorf("text_offset (-want +got):\n%s", diff)
	}
	for i, e := range lp["top_logprobs"].([]any) {
		m := e.(map[string]any)
		want := map[string]any{}
		for _, tp := range engine.Logprob(logitsAt(start+i), int32(tokens[i]), top).Top {
			want[string(rune(tp.Token))] = float64(tp.Logprob)
		}
		want[tokens[i:i+1]] = wantLPs[i] // the token itself is always there
		if diff := cmp.Diff(want, m); diff != "" {
			t.Errorf("top_logprobs[%d] (-want +got):\n%s", i, diff)
		}
	}
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestConformance runs OpenAI-shaped requests against the real HTTP
// server on loopback: each gets the status, error code and param OpenAI
// would give, or a reply of OpenAI's shape.
func TestConformance(t *testing.T) {
	var mu sync.Mutex
	var got []*Request // the Backend's requests of the last case
	b := modelBackend()
	inner := b.complete
	b.complete = func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		return inner(ctx, req, emit)
	}
	ts := newTestServer(t, b, func(o *Options) {
		o.MaxBodyBytes = 4096
		o.MaxInFlight = 2 // a batch of two prompts takes both
		o.Policy.Limits.MaxTokensCap = 0
		o.Models = func() []Model { return []Model{{Name: "tiny", MaxModelLen: 64}} }
	})
	type tc struct {
		name, path, body string
		hdr              []string // extra headers, name then value
		hold             bool     // run while other requests hold every slot
		status           int
		code, param      string // of an error
		message          string // of an error, when it matters
		check            func(t *testing.T, m map[string]any, reqs []*Request)
		stream           func(t *testing.T, chunks []map[string]any)
	}
	chat := func(extra string) string {
		return `{"messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	tests := []tc{
		// HTTP edges.
		{name: "form content type", path: RouteCompletions, body: `{"prompt":"a"}`, hdr: []string{"Content-Type", "application/x-www-form-urlencoded"}, status: 415, code: "unsupported_media_type"},
		{name: "text content type", path: RouteChat, body: chat(""), hdr: []string{"Content-Type", "text/plain"}, status: 415, code: "unsupported_media_type"},
		{name: "json with charset", path: RouteCompletions, body: `{"prompt":"a","max_tokens":3}`, hdr: []string{"Content-Type", "Application/JSON; charset=utf-8"}, status: 200},
		{name: "no content type is read as json", path: RouteCompletions, body: `{"prompt":"a","max_tokens":3}`, hdr: []string{"Content-Type", ""}, status: 200},
		{name: "body too large", path: RouteCompletions, body: `{"prompt":"` + strings.Repeat("x", 5000) + `"}`, status: 413, code: "request_too_large"},
		{name: "admission full", path: RouteCompletions, body: `{"prompt":"a"}`, hold: true, status: 429, code: "overloaded"},

		// Models.
		{name: "unknown model", path: RouteCompletions, body: `{"model":"gpt-9","prompt":"a"}`, status: 404, code: "model_not_found", param: "model",
			message: "The model `gpt-9` does not exist or you do not have access to it."},

		// Context length.
		{name: "context exceeded", path: RouteCompletions, body: `{"prompt":"` + strings.Repeat("x", 60) + `","max_tokens":5}`, status: 400, code: "context_length_exceeded", param: "prompt"},
		{name: "chat context exceeded", path: RouteChat, body: chat(`,"max_completion_tokens":60`), status: 400, code: "context_length_exceeded", param: "messages"},
		{name: "batched prompt over the context", path: RouteCompletions, body: `{"prompt":["a","` + strings.Repeat("x", 64) + `"]}`, status: 400, code: "context_length_exceeded", param: "prompt"},
		{name: "max_tokens defaults to the rest of the context", path: RouteCompletions, body: `{"prompt":"abcd"}`, status: 200,
			check: func(t *testing.T, _ map[string]any, reqs []*Request) {
				if reqs[0].MaxTokens != 60 {
					t.Errorf("MaxTokens %d, want 64 - 4", reqs[0].MaxTokens)
				}
			}},

		// Unknown and unsupported parameters.
		{name: "unknown parameter", path: RouteCompletions, body: `{"prompt":"a","frobnicate":1}`, status: 400, code: "unknown_parameter", param: "frobnicate",
			message: "Unrecognized request argument supplied: frobnicate"},
		{name: "parameter of the other route", path: RouteCompletions, body: `{"prompt":"a","top_logprobs":2}`, status: 400, code: "unknown_parameter", param: "top_logprobs"},
		{name: "prompt on chat", path: RouteChat, body: chat(`,"prompt":"a"`), status: 400, code: "unknown_parameter", param: "prompt"},
		{name: "case matters", path: RouteCompletions, body: `{"prompt":"a","Max_Tokens":3}`, status: 400, code: "unknown_parameter", param: "Max_Tokens"},
		{name: "unknown stream option", path: RouteCompletions, body: `{"prompt":"a","stream":true,"stream_options":{"continuous_usage_stats":true}}`, status: 400, code: "unknown_parameter", param: "stream_options.continuous_usage_stats"},
		{name: "tool of another type", path: RouteChat, body: chat(`,"tools":[{"type":"code_interpreter"}]`), status: 400, code: "unsupported_value", param: "tools[0].type"},
		{name: "tool without a name", path: RouteChat, body: chat(`,"tools":[{"type":"function","function":{"description":"d"}}]`), status: 400, code: "invalid_value", param: "tools[0].function.name"},
		{name: "tool named twice", path: RouteChat, body: chat(`,"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]`), status: 400, code: "invalid_value", param: "tools[1].function.name"},
		{name: "tool parameters not a schema", path: RouteChat, body: chat(`,"tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]`), status: 400, code: "invalid_type", param: "tools[0].function.parameters"},
		{name: "tool_choice required without tools", path: RouteChat, body: chat(`,"tool_choice":"required"`), status: 400, code: "invalid_value", param: "tool_choice"},
		{name: "tool_choice unknown", path: RouteChat, body: chat(`,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"always"`), status: 400, code: "invalid_value", param: "tool_choice"},
		{name: "tool_choice names no tool", path: RouteChat, body: chat(`,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}`), status: 400, code: "invalid_value", param: "tool_choice",
			message: `tool_choice names function "g", which is not among the tools`},
		{name: "tool_choice of the wrong shape", path: RouteChat, body: chat(`,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function"}`), status: 400, code: "invalid_type", param: "tool_choice"},
		{name: "tool_choice required with a JSON response_format whose schema is refused", path: RouteChat, body: chat(`,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":5}}`), status: 400, code: "unsupported_value", param: "response_format"},
		{name: "tool_choice required, schema keyword unsupported", path: RouteChat, body: chat(`,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"s":{"type":"string","pattern":"^(a$"}}}}}],"tool_choice":"required"`),
			status: 400, code: "unsupported_value", param: "tools", message: `tools: function f: parameters keyword pattern "^(a$" (unbalanced parentheses) at "#/properties/s" is not supported with tool_choice "required"`},
		{name: "tool_calls not an array", path: RouteChat, body: `{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":{"id":"x"}}]}`, status: 400, code: "invalid_type", param: "messages[1].tool_calls"},
		{name: "tool_call_id not a string", path: RouteChat, body: `{"messages":[{"role":"tool","tool_call_id":7,"content":"r"}]}`, status: 400, code: "invalid_type", param: "messages[0].tool_call_id"},
		{name: "tools with tool_choice none are not rendered", path: RouteChat, status: 200,
			body: chat(`,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"tool_choice":"none","max_tokens":2`),
			check: func(t *testing.T, _ map[string]any, reqs []*Request) {
				if p := (tokenizer.Bytes{}).Decode(reqs[0].Prompt); strings.Contains(p, "get_weather") || reqs[0].Sampling.Grammar != "" {
					t.Errorf("prompt %q, grammar %q: want neither the tools nor a grammar", p, reqs[0].Sampling.Grammar)
				}
			}},
		{name: "functions (deprecated)", path: RouteChat, body: chat(`,"functions":[{"name":"f"}]`), status: 400, code: "unsupported_value", param: "functions"},
		{name: "function_call object", path: RouteChat, body: chat(`,"function_call":{"name":"f"}`), status: 400, code: "unsupported_value", param: "function_call"},
		{name: "logit_bias", path: RouteCompletions, body: `{"prompt":"a","logit_bias":{"50256":-100}}`, status: 400, code: "unsupported_value", param: "logit_bias"},
		{name: "suffix", path: RouteCompletions, body: `{"prompt":"a","suffix":"z"}`, status: 400, code: "unsupported_value", param: "suffix"},
		{name: "best_of over n", path: RouteCompletions, body: `{"prompt":"a","n":2,"best_of":3}`, status: 400, code: "unsupported_value", param: "best_of"},
		{name: "json_object response_format", path: RouteChat, body: chat(`,"response_format":{"type":"json_object"},"max_tokens":2`), status: 200,
			check: func(t *testing.T, _ map[string]any, reqs []*Request) {
				if reqs[0].Sampling.Grammar != grammar.JSONObject {
					t.Errorf("grammar %q, want grammar.JSONObject", reqs[0].Sampling.Grammar)
				}
			}},
		{name: "json_object response_format on completions", path: RouteCompletions, body: `{"prompt":"a","response_format":{"type":"json_object"},"max_tokens":2}`, status: 200},
		{name: "json_schema response_format", path: RouteChat, status: 200,
			body: chat(`,"max_tokens":2,"response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"},"b":{"enum":["x","y"]}},"required":["a","b"],"additionalProperties":false}}}`),
			check: func(t *testing.T, _ map[string]any, reqs []*Request) {
				want, err := grammar.FromSchema([]byte(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"enum":["x","y"]}},"required":["a","b"]}`))
				if err != nil || reqs[0].Sampling.Grammar != want {
					t.Errorf("grammar %q, want the schema's %q (%v)", reqs[0].Sampling.Grammar, want, err)
				}
			}},
		{name: "json_schema without schema", path: RouteCompletions, body: `{"prompt":"a","max_tokens":2,"response_format":{"type":"json_schema","json_schema":{"name":"any"}}}`, status: 200},
		{name: "json_schema unsupported keyword", path: RouteChat, body: chat(`,"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"object","properties":{"s":{"type":"string","pattern":"^(a$"}}}}}`),
			status: 400, code: "unsupported_value", param: "response_format", message: `response_format.json_schema.schema: keyword pattern "^(a$" (unbalanced parentheses) at "#/properties/s" is not supported`},
		{name: "json_schema $ref", path: RouteChat, body: chat(`,"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"$ref":"#/$defs/a"}}}`),
			status: 400, code: "unsupported_value", param: "response_format", message: `response_format.json_schema.schema: keyword $ref "#/$defs/a", which points to nothing in the schema at "#" is not supported`},
		{name: "json_schema without name", path: RouteChat, body: chat(`,"response_format":{"type":"json_schema","json_schema":{"schema":{}}}`), status: 400, code: "invalid_value", param: "response_format.json_schema.name"},
		{name: "json_schema not an object", path: RouteChat, body: chat(`,"response_format":{"type":"json_schema","json_schema":3}`), status: 400, code: "invalid_type", param: "response_format.json_schema"},
		{name: "json_schema schema not JSON Schema", path: RouteChat, body: chat(`,"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":"x"}}`), status: 400, code: "unsupported_value", param: "response_format"},
		{name: "unknown response_format type", path: RouteChat, body: chat(`,"response_format":{"type":"yaml"}`), status: 400, code: "invalid_value", param: "response_format.type"},
		{name: "echo on chat", path: RouteChat, body: chat(`,"echo":true`), status: 400, code: "unsupported_value", param: "echo"},
		{name: "store", path: RouteChat, body: chat(`,"store":true`), status: 400, code: "unsupported_value", param: "store"},
		{name: "flex tier", path: RouteChat, body: chat(`,"service_tier":"flex"`), status: 400, code: "unsupported_value", param: "service_tier"},
		{name: "audio modality", path: RouteChat, body: chat(`,"modalities":["text","audio"]`), status: 400, code: "unsupported_value", param: "modalities"},
		{name: "reasoning_effort", path: RouteChat, body: chat(`,"reasoning_effort":"high"`), status: 400, code: "unsupported_value", param: "reasoning_effort"},
		{name: "prediction", path: RouteChat, body: chat(`,"prediction":{"type":"content","content":"x"}`), status: 400, code: "unsupported_value", param: "prediction"},
		{name: "trivial values accepted", path: RouteChat, status: 200,
			body: chat(`,"user":"u1","metadata":{"k":"v"},"store":false,"service_tier":"auto","tools":[],"tool_choice":"none","parallel_tool_calls":true,"response_format":{"type":"text"},"modalities":["text"],"logit_bias":{},"safety_identifier":"s","prompt_cache_key":"k","max_tokens":2`)},
		{name: "best_of equal to n", path: RouteCompletions, body: `{"prompt":"a","n":2,"best_of":2,"suffix":"","echo":false,"max_tokens":1}`, status: 200},

		// Types and values.
		{name: "max_tokens string", path: RouteCompletions, body: `{"prompt":"a","max_tokens":"many"}`, status: 400, code: "invalid_type", param: "max_tokens", message: "max_tokens must be an integer"},
		{name: "max_tokens fraction", path: RouteCompletions, body: `{"prompt":"a","max_tokens":1.5}`, status: 400, code: "invalid_type", param: "max_tokens", message: "max_tokens must be an integer"},
		{name: "temperature string", path: RouteChat, body: chat(`,"temperature":"hot"`), status: 400, code: "invalid_type", param: "temperature", message: "temperature must be a number"},
		{name: "stream number", path: RouteCompletions, body: `{"prompt":"a","stream":1}`, status: 400, code: "invalid_type", param: "stream", message: "stream must be a boolean"},
		{name: "model number", path: RouteCompletions, body: `{"prompt":"a","model":7}`, status: 400, code: "invalid_type", param: "model", message: "model must be a string"},
		{name: "metadata value", path: RouteChat, body: chat(`,"metadata":{"k":1}`), status: 400, code: "invalid_type", param: "metadata", message: "metadata must be an object of strings"},
		{name: "modalities element", path: RouteChat, body: chat(`,"modalities":[1]`), status: 400, code: "invalid_type", param: "modalities", message: "modalities must be an array of strings"},
		{name: "include_usage string", path: RouteCompletions, body: `{"prompt":"a","stream":true,"stream_options":{"include_usage":"yes"}}`, status: 400, code: "invalid_type", param: "stream_options.include_usage"},
		{name: "completions logprobs boolean", path: RouteCompletions, body: `{"prompt":"a","logprobs":true}`, status: 400, code: "invalid_type", param: "logprobs", message: "logprobs must be an integer"},
		{name: "chat logprobs integer", path: RouteChat, body: chat(`,"logprobs":2`), status: 400, code: "invalid_type", param: "logprobs", message: "logprobs must be a boolean"},
		{name: "top_logprobs without logprobs", path: RouteChat, body: chat(`,"top_logprobs":2`), status: 400, code: "invalid_value", param: "top_logprobs"},
		{name: "top_logprobs over 20", path: RouteChat, body: chat(`,"logprobs":true,"top_logprobs":21`), status: 400, code: "invalid_value", param: "top_logprobs"},
		{name: "presence_penalty over 2", path: RouteCompletions, body: `{"prompt":"a","presence_penalty":2.5}`, status: 400, code: "invalid_value", param: "presence_penalty"},
		{name: "n zero", path: RouteCompletions, body: `{"prompt":"a","n":0}`, status: 400, code: "invalid_value", param: "n"},
		{name: "body not an object", path: RouteCompletions, body: `["prompt"]`, status: 400, code: "invalid_json"},
		{name: "penalties, seed and the default temperature reach the backend", path: RouteCompletions, body: `{"prompt":"a","presence_penalty":0.5,"frequency_penalty":-1,"seed":-3,"max_tokens":1}`, status: 200,
			check: func(t *testing.T, _ map[string]any, reqs []*Request) {
				// Without "temperature": OpenAI's default of 1.
				want := sampling.Sampling{Temperature: 1, Seed: 1<<64 - 3, Penalties: &sampling.Penalties{Presence: 0.5, Frequency: -1}}
				if diff := cmp.Diff(want, reqs[0].Sampling); diff != "" {
					t.Errorf("sampling (-want +got):\n%s", diff)
				}
			}},

		// Logprobs shapes.
		{name: "completions logprobs", path: RouteCompletions, body: `{"prompt":"a","logprobs":2,"max_tokens":3}`, status: 200,
			check: func(t *testing.T, m map[string]any, reqs []*Request) {
				if reqs[0].Logprobs != 2 || reqs[0].PromptLogprobs != -1 {
					t.Errorf("Logprobs %d PromptLogprobs %d, want 2 and -1", reqs[0].Logprobs, reqs[0].PromptLogprobs)
				}
				c := choices(t, m)[0]
				checkCompletionLogprobs(t, c["logprobs"].(map[string]any), "ra0", 1, 2)
			}},
		{name: "chat logprobs", path: RouteChat, body: chat(`,"logprobs":true,"top_logprobs":2`), status: 200,
			check: func(t *testing.T, m map[string]any, reqs []*Request) {
				c := choices(t, m)[0]
				lp := c["logprobs"].(map[string]any)
				content := lp["content"].([]any)
				text := modelOutput(reqs[0].Prompt, 0)
				if len(content) != len(text) || lp["refusal"] != nil {
					t.Fatalf("logprobs %v, want %d entries and a null refusal", lp, len(text))
				}
				for i, e := range content {
					var want []any
					for _, tp := range engine.Logprob(logitsAt(len(reqs[0].Prompt)+i), int32(text[i]), 2).Top {
						want = append(want, map[string]any{"token": string(rune(tp.Token)), "logprob": float64(tp.Logprob), "bytes": []any{float64(tp.Token)}})
					}
					wantEntry := map[string]any{"token": text[i : i+1], "logprob": wantLogprob(len(reqs[0].Prompt)+i, int32(text[i])),
						"bytes": []any{float64(text[i])}, "top_logprobs": want}
					if diff := cmp.Diff(wantEntry, e); diff != "" {
						t.Errorf("content[%d] (-want +got):\n%s", i, diff)
					}
				}
			}},
		{name: "chat without logprobs", path: RouteChat, body: chat(`,"logprobs":false`), status: 200,
			check: func(t *testing.T, m map[string]any, _ []*Request) {
				if c := choices(t, m)[0]; c["logprobs"] != nil {
					t.Errorf("logprobs %v, want null", c["logprobs"])
				}
			}},
		{name: "streamed logprobs", path: RouteCompletions, body: `{"prompt":"a","logprobs":1,"max_tokens":3,"stream":true}`, status: 200,
			stream: func(t *testing.T, chunks []map[string]any) {
				var text strings.Builder
				merged := map[string][]any{}
				for _, ch := range chunks {
					c := choice0(t, ch)
					text.WriteString(c["text"].(string))
					for k, v := range c["logprobs"].(map[string]any) {
						merged[k] = append(merged[k], v.([]any)...)
					}
				}
				lp := map[string]any{}
				for k, v := range merged {
					lp[k] = v
				}
				checkCompletionLogprobs(t, lp, text.String(), 1, 1)
			}},

		// n, echo, batched prompts.
		{name: "n=2", path: RouteCompletions, body: `{"prompt":"a","n":2,"max_tokens":3}`, status: 200,
			check: func(t *testing.T, m map[string]any, reqs []*Request) {
				if len(reqs) != 1 || reqs[0].N != 2 {
					t.Fatalf("backend got %d requests (N %d), want one with N 2", len(reqs), reqs[0].N)
				}
				var got []string
				for _, c := range choices(t, m) {
					got = append(got, fmt.Sprintf("%v %v %v", c["index"], c["text"], c["finish_reason"]))
				}
				if diff := cmp.Diff([]string{"0 ra0 length", "1 ra1 length"}, got); diff != "" {
					t.Errorf("choices (-want +got):\n%s", diff)
				}
				if u := m["usage"].(map[string]any); u["prompt_tokens"] != 1.0 || u["completion_tokens"] != 6.0 {
					t.Errorf("usage %v, want 1 prompt token and 6 completion tokens", u)
				}
			}},
		{name: "n=2 streamed", path: RouteChat, body: chat(`,"n":2,"stream":true`), status: 200,
			stream: func(t *testing.T, chunks []map[string]any) {
				text := map[float64]string{}
				roles := map[float64]int{}
				finish := map[float64]any{}
				for _, ch := range chunks {
					c := choice0(t, ch)
					i := c["index"].(float64)
					d := c["delta"].(map[string]any)
					if d["role"] == "assistant" {
						roles[i]++
					}
					if s, ok := d["content"].(string); ok {
						text[i] += s
					}
					if c["finish_reason"] != nil {
						finish[i] = c["finish_reason"]
					}
				}
				want := "r<0"
				if diff := cmp.Diff(map[float64]string{0: want, 1: "r<1"}, text); diff != "" {
					t.Errorf("texts by index (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(map[float64]int{0: 1, 1: 1}, roles); diff != "" {
					t.Errorf("role chunks by index (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(map[float64]any{0: "length", 1: "length"}, finish); diff != "" {
					t.Errorf("finish by index (-want +got):\n%s", diff)
				}
			}},
		{name: "echo", path: RouteCompletions, body: `{"prompt":"hey","echo":true,"max_tokens":3}`, status: 200,
			check: func(t *testing.T, m map[string]any, reqs []*Request) {
				if c := choices(t, m)[0]; c["text"] != "heyrh0" || reqs[0].PromptLogprobs != -1 {
					t.Errorf("text %q PromptLogprobs %d, want the prompt echoed, no prompt logprobs", c["text"], reqs[0].PromptLogprobs)
				}
			}},
		{name: "echo with logprobs, as lm-evaluation-harness asks", path: RouteCompletions, body: `{"prompt":[[104,101,121]],"echo":true,"logprobs":1,"max_tokens":1,"temperature":0}`, status: 200,
			check: func(t *testing.T, m map[string]any, reqs []*Request) {
				if reqs[0].PromptLogprobs != 1 {
					t.Errorf("PromptLogprobs %d, want 1", reqs[0].PromptLogprobs)
				}
				c := choices(t, m)[0]
				lp := c["logprobs"].(map[string]any)
				if c["text"] != "heyr" {
					t.Errorf("text %q, want the prompt and one token", c["text"])
				}
				wantLPs := []float64{-1e9, wantLogprob(1, 'e'), wantLogprob(2, 'y'), wantLogprob(3, 'r')}
				if diff := cmp.Diff(wantLPs, floats(lp["token_logprobs"])); diff != "" {
					t.Errorf("token_logprobs (-want +got; -1e9 is null):\n%s", diff)
				}
				top := lp["top_logprobs"].([]any)
				if top[0] != nil || len(top) != 4 {
					t.Errorf("top_logprobs %v, want 4 with the first null", top)
				}
				// lm-eval: is_greedy compares the top entry with the continuation.
				if e := top[1].(map[string]any); len(e) < 1 || len(e) > 2 {
					t.Errorf("top_logprobs[1] %v, want the top token and the prompt's", e)
				}
				if diff := cmp.Diff([]string{"h", "e", "y", "r"}, strs(lp["tokens"])); diff != "" {
					t.Errorf("tokens (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]float64{0, 1, 2, 3}, floats(lp["text_offset"])); diff != "" {
					t.Errorf("text_offset (-want +got):\n%s", diff)
				}
			}},
		{name: "batched prompts", path: RouteCompletions, body: `{"prompt":["a","b"],"n":2,"max_tokens":3}`, status: 200,
			check: func(t *testing.T, m map[string]any, reqs []*Request) {
				var got []string
				for _, c := range choices(t, m) {
					got = append(got, fmt.Sprint(c["index"], " ", c["text"]))
				}
				// index = prompt × n + choice, as vLLM.
				if diff := cmp.Diff([]string{"0 ra0", "1 ra1", "2 rb0", "3 rb1"}, got); diff != "" {
					t.Errorf("choices (-want +got):\n%s", diff)
				}
				id := m["id"].(string)
				ids := map[string]bool{}
				for _, r := range reqs {
					ids[r.ID] = true
				}
				if !ids[id+"-0"] || !ids[id+"-1"] || len(reqs) != 2 {
					t.Errorf("backend requests %v, want %s-0 and %s-1", ids, id, id)
				}
				pd := m["pdserve"].(map[string]any)
				ps, _ := pd["prompts"].([]any)
				if len(ps) != 2 || ps[1].(map[string]any)["request_id"] != id+"-1" {
					t.Errorf("pdserve.prompts %v, want both prompts' budgets", pd["prompts"])
				}
				if u := m["usage"].(map[string]any); u["prompt_tokens"] != 2.0 || u["completion_tokens"] != 12.0 {
					t.Errorf("usage %v", u)
				}
			}},
		{name: "batched prompts streamed", path: RouteCompletions, body: `{"prompt":["a","b"],"max_tokens":3,"stream":true}`, status: 200,
			stream: func(t *testing.T, chunks []map[string]any) {
				text := map[float64]string{}
				for _, ch := range chunks {
					c := choice0(t, ch)
					text[c["index"].(float64)] += c["text"].(string)
				}
				if diff := cmp.Diff(map[float64]string{0: "ra0", 1: "rb0"}, text); diff != "" {
					t.Errorf("texts by index (-want +got):\n%s", diff)
				}
				last := chunks[len(chunks)-1]
				if ps, _ := last["pdserve"].(map[string]any)["prompts"].([]any); len(ps) != 2 {
					t.Errorf("last chunk's pdserve %v, want both prompts' budgets", last["pdserve"])
				}
			}},
		{name: "echo streamed", path: RouteCompletions, body: `{"prompt":"hey","echo":true,"max_tokens":3,"stream":true}`, status: 200,
			stream: func(t *testing.T, chunks []map[string]any) {
				var text strings.Builder
				for _, ch := range chunks {
					text.WriteString(choice0(t, ch)["text"].(string))
				}
				if text.String() != "heyrh0" {
					t.Errorf("streamed %q, want the prompt echoed first", text.String())
				}
			}},
		{name: "chat logprobs streamed", path: RouteChat, body: chat(`,"logprobs":true,"top_logprobs":1,"stream":true`), status: 200,
			stream: func(t *testing.T, chunks []map[string]any) {
				var text, tokens strings.Builder
				for _, ch := range chunks {
					c := choice0(t, ch)
					if s, ok := c["delta"].(map[string]any)["content"].(string); ok {
						text.WriteString(s)
					}
					for _, e := range c["logprobs"].(map[string]any)["content"].([]any) {
						e := e.(map[string]any)
						tokens.WriteString(e["token"].(string))
						if n := len(e["top_logprobs"].([]any)); n != 1 {
							t.Errorf("entry %v has %d alternatives, want 1", e, n)
						}
					}
				}
				if text.String() == "" || tokens.String() != text.String() {
					t.Errorf("logprob tokens %q, text %q: want one entry per token", tokens.String(), text.String())
				}
			}},
		{name: "batched token arrays", path: RouteCompletions, body: `{"prompt":[[97,97],[98]],"max_tokens":3}`, status: 200,
			check: func(t *testing.T, m map[string]any, _ []*Request) {
				var got []string
				for _, c := range choices(t, m) {
					got = append(got, fmt.Sprint(c["index"], " ", c["text"]))
				}
				if diff := cmp.Diff([]string{"0 ra0", "1 rb0"}, got); diff != "" {
					t.Errorf("choices (-want +got):\n%s", diff)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts.idle(t)
			mu.Lock()
			got = nil
			mu.Unlock()
			hdr := tc.hdr
			var release func()
			if tc.hold {
				release = holdSlots(t, ts, 2)
			}
			resp := ts.post(t, tc.path, tc.body, hdr...)
			if release != nil {
				release()
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			mu.Lock()
			reqs := got
			mu.Unlock()
			if tc.status != http.StatusOK {
				e := errorBody(t, resp)
				if deref(e.Code) != tc.code || deref(e.Param) != tc.param || tc.message != "" && e.Message != tc.message {
					t.Errorf("error %+v (code %q, param %q), want code %q param %q message %q", e, deref(e.Code), deref(e.Param), tc.code, tc.param, tc.message)
				}
				if tc.status == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
					t.Error("429 without Retry-After")
				}
				return
			}
			if tc.stream != nil {
				tc.stream(t, streamed(t, resp))
				return
			}
			m := decodeJSON(t, resp.Body)
			if tc.check != nil {
				tc.check(t, m, reqs)
			}
		})
	}
}

// The OpenAI error body is exactly {message, type, param, code}.
func TestErrorShape(t *testing.T) {
	ts := newTestServer(t, modelBackend(), nil)
	resp := ts.post(t, RouteCompletions, `{"prompt":"a","bogus":true}`)
	var body map[string]map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]any{"error": {
		"message": "Unrecognized request argument supplied: bogus", "type": "invalid_request_error", "param": "bogus", "code": "unknown_parameter",
	}}
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("error body (-want +got):\n%s", diff)
	}
}

// sayBackend emits, in each choice, the JSON string that follows "say:"
// in the prompt (up to the end of its line), one byte a token, and
// finishes with "stop".
func sayBackend() *fakeBackend {
	return &fakeBackend{complete: func(_ context.Context, req *Request, emit EmitFunc) ([]string, error) {
		p := (tokenizer.Bytes{}).Decode(req.Prompt)
		_, rest, _ := strings.Cut(p, "say:")
		line, _, _ := strings.Cut(rest, "\n")
		var text string
		if err := json.Unmarshal([]byte(line), &text); err != nil {
			return nil, fmt.Errorf("fake: no say: %w", err)
		}
		for _, id := range (tokenizer.Bytes{}).Encode(text) {
			for j := range req.N {
				if err := emit(Output{Index: j, Tokens: []int32{id}}); err != nil && !errors.Is(err, ErrStopped) {
					return nil, err
				}
			}
		}
		return finishes(req, "stop"), nil
	}}
}

// TestConformanceTools checks the shapes of tool calls and reasoning
// against OpenAI's (vLLM's and DeepSeek's for reasoning_content), whole and
// streamed, with a backend that writes the reply each request asks for.
func TestConformanceTools(t *testing.T) {
	var mu sync.Mutex
	var got *Request
	b := sayBackend()
	inner := b.complete
	b.complete = func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		mu.Lock()
		got = req
		mu.Unlock()
		return inner(ctx, req, emit)
	}
	ts := newTestServer(t, b, func(o *Options) {
		o.Policy.Budgets.Default, o.Policy.Budgets.Routes = 4000, nil
		o.Policy.Limits.MaxTokensCap = 0
		o.Models = func() []Model { return []Model{{Name: "tiny", MaxModelLen: 8192}} }
	})
	const tools = `"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string"}},"required":["zone"]}}}]`
	say := func(reply, extra string) string {
		q, _ := json.Marshal("say:" + mustJSON(reply))
		return `{"messages":[{"role":"user","content":` + string(q) + `}],"max_tokens":500` + extra + `}`
	}
	call := func(name, args string) string {
		return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>"
	}
	type wantCall struct{ name, args string }
	// whole checks a non-streamed reply: content (nil: null), reasoning
	// ("" : absent), calls and finish.
	whole := func(t *testing.T, m map[string]any, content any, reasoning string, calls []wantCall, finish string) {
		t.Helper()
		c := choice0(t, m)
		msg := c["message"].(map[string]any)
		if diff := cmp.Diff(content, msg["content"]); diff != "" {
			t.Errorf("content (-want +got):\n%s", diff)
		}
		if r, _ := msg["reasoning_content"].(string); r != reasoning {
			t.Errorf("reasoning_content %q, want %q", r, reasoning)
		}
		raw, _ := msg["tool_calls"].([]any)
		if len(raw) != len(calls) {
			t.Fatalf("tool_calls %v, want %d", msg["tool_calls"], len(calls))
		}
		ids := map[string]bool{}
		for i, rc := range raw {
			tc := rc.(map[string]any)
			fn := tc["function"].(map[string]any)
			id, _ := tc["id"].(string)
			if !strings.HasPrefix(id, "call_") || ids[id] || tc["type"] != "function" || fn["name"] != calls[i].name || fn["arguments"] != calls[i].args {
				t.Errorf("tool_calls[%d] = %v, want a fresh call_ id, type function, %s(%s)", i, tc, calls[i].name, calls[i].args)
			}
			if _, ok := tc["index"]; ok {
				t.Errorf("tool_calls[%d] has an index: OpenAI's whole reply has none", i)
			}
			ids[id] = true
		}
		if c["finish_reason"] != finish {
			t.Errorf("finish_reason %v, want %s", c["finish_reason"], finish)
		}
	}
	for _, tc := range []struct {
		name   string
		body   string
		status int
		check  func(t *testing.T, m map[string]any, req *Request)
		stream func(t *testing.T, chunks []map[string]any)
	}{
		{name: "auto: a call", body: say("Checking.\n"+call("get_weather", `{"city": "Paris"}`), ","+tools), status: 200,
			check: func(t *testing.T, m map[string]any, req *Request) {
				whole(t, m, "Checking.\n", "", []wantCall{{"get_weather", `{"city":"Paris"}`}}, "tool_calls")
				if p := (tokenizer.Bytes{}).Decode(req.Prompt); !strings.Contains(p, `<tools>`) || !strings.Contains(p, `"name": "get_time"`) || req.Sampling.Grammar != "" {
					t.Errorf("prompt %q grammar %q: want the tools described and no grammar under auto", p, req.Sampling.Grammar)
				}
			}},
		{name: "auto: parallel calls, content null", body: say(call("get_weather", `{"city": "Oslo"}`)+"\n"+call("get_time", `{"zone": "CET"}`), ","+tools), status: 200,
			check: func(t *testing.T, m map[string]any, _ *Request) {
				whole(t, m, nil, "", []wantCall{{"get_weather", `{"city":"Oslo"}`}, {"get_time", `{"zone":"CET"}`}}, "tool_calls")
			}},
		{name: "parallel_tool_calls false ends at the first call", body: say(call("get_weather", `{"city": "Oslo"}`)+"\n"+call("get_time", `{"zone": "CET"}`)+" trailing", ","+tools+`,"parallel_tool_calls":false`), status: 200,
			check: func(t *testing.T, m map[string]any, _ *Request) {
				whole(t, m, nil, "", []wantCall{{"get_weather", `{"city":"Oslo"}`}}, "tool_calls")
			}},
		{name: "auto: no call", body: say("It is sunny.", ","+tools), status: 200,
			check: func(t *testing.T, m map[string]any, _ *Request) { whole(t, m, "It is sunny.", "", nil, "stop") }},
		{name: "required: a grammar of both tools", body: say(call("get_time", `{"zone": "UTC"}`), ","+tools+`,"tool_choice":"required"`), status: 200,
			check: func(t *testing.T, m map[string]any, req *Request) {
				whole(t, m, nil, "", []wantCall{{"get_time", `{"zone":"UTC"}`}}, "tool_calls")
				g, err := grammar.Parse(req.Sampling.Grammar, "root")
				if err != nil {
					t.Fatalf("grammar: %v", err)
				}
				for text, ok := range map[string]bool{call("get_time", `{"zone": "UTC"}`): true, call("get_weather", `{"city": "X"}`): true, call("get_time", `{"city": "X"}`): false, "hello": false} {
					mt, _ := g.Matcher()
					if got := mt.Accept([]byte(text)) == nil && mt.Complete(); got != ok {
						t.Errorf("grammar accepts %q: %v, want %v", text, got, ok)
					}
				}
			}},
		{name: "required with a JSON response_format: the call's grammar replaces the format's", body: say(call("get_weather", `{"city": "Oslo"}`), ","+tools+`,"tool_choice":"required","response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object","properties":{"n":{"type":"number"}},"required":["n"]}}}`), status: 200,
			check: func(t *testing.T, m map[string]any, req *Request) {
				whole(t, m, nil, "", []wantCall{{"get_weather", `{"city":"Oslo"}`}}, "tool_calls")
				g, err := grammar.Parse(req.Sampling.Grammar, "root")
				if err != nil {
					t.Fatalf("grammar: %v", err)
				}
				for text, ok := range map[string]bool{call("get_weather", `{"city": "X"}`): true, `{"n": 1}`: false} {
					mt, _ := g.Matcher()
					if got := mt.Accept([]byte(text)) == nil && mt.Complete(); got != ok {
						t.Errorf("grammar accepts %q: %v, want %v", text, got, ok)
					}
				}
			}},
		{name: "auto with a JSON response_format: the format's grammar", body: say(`{"n": 1}`, ","+tools+`,"response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object","properties":{"n":{"type":"number"}},"required":["n"]}}}`), status: 200,
			check: func(t *testing.T, m map[string]any, req *Request) {
				whole(t, m, `{"n": 1}`, "", nil, "stop")
				g, err := grammar.Parse(req.Sampling.Grammar, "root")
				if err != nil {
					t.Fatalf("grammar: %v", err)
				}
				if mt, _ := g.Matcher(); mt.Accept([]byte(call("get_weather", `{"city": "X"}`))) == nil {
					t.Error("under auto the format's grammar accepts a call")
				}
			}},
		{name: "named: a grammar of that tool only", body: say(call("get_weather", `{"city": "Rome"}`), ","+tools+`,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`), status: 200,
			check: func(t *testing.T, m map[string]any, req *Request) {
				whole(t, m, nil, "", []wantCall{{"get_weather", `{"city":"Rome"}`}}, "tool_calls")
				g, err := grammar.Parse(req.Sampling.Grammar, "root")
				if err != nil {
					t.Fatal(err)
				}
				mt, _ := g.Matcher()
				if mt.Accept([]byte(call("get_time", `{"zone": "UTC"}`))) == nil {
					t.Error("the named grammar accepts another tool")
				}
			}},
		{name: "reasoning_content", body: say("<think>\nthe user greets</think>\n\nHello!", ""), status: 200,
			check: func(t *testing.T, m map[string]any, _ *Request) {
				whole(t, m, "\n\nHello!", "\nthe user greets", nil, "stop")
				pd := m["pdserve"].(map[string]any)
				if pd["ttfo_ms"] == nil || pd["ttft_ms"] == nil || pd["ttfo_ms"].(float64) < pd["ttft_ms"].(float64) {
					t.Errorf("pdserve ttfo_ms %v ttft_ms %v: want ttfo after ttft", pd["ttfo_ms"], pd["ttft_ms"])
				}
			}},
		{name: "streamed tool call deltas", body: say("Hm.\n"+call("get_weather", `{"city": "Paris"}`), ","+tools+`,"stream":true`), status: 200,
			stream: func(t *testing.T, chunks []map[string]any) {
				var content strings.Builder
				var deltas []map[string]any
				var finish []any
				for _, ch := range chunks {
					c := choice0(t, ch)
					d := c["delta"].(map[string]any)
					if s, ok := d["content"].(string); ok {
						content.WriteString(s)
					}
					for _, x := range asSlice(d["tool_calls"]) {
						deltas = append(deltas, x.(map[string]any))
					}
					if c["finish_reason"] != nil {
						finish = append(finish, c["finish_reason"])
					}
				}
				if content.String() != "Hm.\n" {
					t.Errorf("content %q", content.String())
				}
				if len(deltas) != 2 {
					t.Fatalf("tool call deltas %v, want 2", deltas)
				}
				first, second := deltas[0], deltas[1]
				fn := first["function"].(map[string]any)
				if first["index"] != 0.0 || !strings.HasPrefix(first["id"].(string), "call_") || first["type"] != "function" || fn["name"] != "get_weather" || fn["arguments"] != "" {
					t.Errorf("first delta %v, want index 0, id, type, name and empty arguments", first)
				}
				fn2 := second["function"].(map[string]any)
				if second["index"] != 0.0 || second["id"] != nil || fn2["name"] != nil || fn2["arguments"] != `{"city":"Paris"}` {
					t.Errorf("second delta %v, want index 0 and the arguments only", second)
				}
				if diff := cmp.Diff([]any{"tool_calls"}, finish); diff != "" {
					t.Errorf("finish reasons (-want +got):\n%s", diff)
				}
			}},
		{name: "streamed reasoning_content", body: say("<think>hmm</think>Hi", `,"stream":true`), status: 200,
			stream: func(t *testing.T, chunks []map[string]any) {
				var content, reasoning strings.Builder
				for _, ch := range chunks {
					d := choice0(t, ch)["delta"].(map[string]any)
					if s, ok := d["content"].(string); ok {
						if reasoning.Len() > 0 && content.Len() == 0 && s != "" && !strings.HasSuffix(reasoning.String(), "hmm") {
							t.Error("content before the reasoning ended")
						}
						content.WriteString(s)
					}
					if s, ok := d["reasoning_content"].(string); ok {
						if content.Len() > 0 {
							t.Error("reasoning after content")
						}
						reasoning.WriteString(s)
					}
				}
				if content.String() != "Hi" || reasoning.String() != "hmm" {
					t.Errorf("content %q reasoning %q", content.String(), reasoning.String())
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts.idle(t)
			resp := ts.post(t, RouteChat, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %v", resp.StatusCode, tc.status, decodeJSON(t, resp.Body))
			}
			if tc.stream != nil {
				tc.stream(t, streamed(t, resp))
				return
			}
			m := decodeJSON(t, resp.Body)
			mu.Lock()
			req := got
			mu.Unlock()
			tc.check(t, m, req)
		})
	}
}

func mustJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}
