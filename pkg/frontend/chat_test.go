package frontend

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// templater is a byte-level tokenizer with a chat template of its own:
// apply renders the messages, and every call's messages are recorded.
type templater struct {
	tokenizer.Bytes
	apply func([]engine.ChatMessage) (string, error)
	got   [][]engine.ChatMessage
}

var _ engine.ChatTemplater = (*templater)(nil)

func (tt *templater) ApplyChatTemplate(msgs []engine.ChatMessage) (string, error) {
	tt.got = append(tt.got, msgs)
	return tt.apply(msgs)
}

// chatML renders msgs as ChatML, the way a GGUF template would.
func chatML(msgs []engine.ChatMessage) (string, error) {
	var sb strings.Builder
	for _, m := range msgs {
		sb.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
	}
	return sb.String() + "<|im_start|>assistant\n", nil
}

func TestChatTemplate(t *testing.T) {
	secret := errors.New("jinja: undefined variable 'tools' at line 3 of /models/secret.gguf")
	tests := []struct {
		name     string
		apply    func([]engine.ChatMessage) (string, error)
		body     string
		wantMsgs []engine.ChatMessage // what the template receives; nil: not called
		// A success renders wantPrompt; a failure is a 400 with code.
		wantPrompt string
		code       string
	}{
		{
			name:  "rendered by the model's template, content parts flattened",
			apply: chatML,
			body:  `{"messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"H"},{"type":"text","text":"i"}]},{"role":"assistant","content":null},{"role":"developer","content":"D"}]}`,
			wantMsgs: []engine.ChatMessage{
				{Role: "system", Content: "S"}, {Role: "user", Content: "Hi"}, {Role: "assistant", Content: ""}, {Role: "developer", Content: "D"},
			},
			wantPrompt: "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>developer\nD<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name:     "template error is a 400 without its text",
			apply:    func([]engine.ChatMessage) (string, error) { return "", secret },
			body:     `{"messages":[{"role":"developer","content":"t"}]}`,
			wantMsgs: []engine.ChatMessage{{Role: "developer", Content: "t"}},
			code:     "chat_template_error",
		},
		{
			name:  "tool calls and results reach a template without tools as Hermes text",
			apply: chatML,
			body:  `{"messages":[{"role":"user","content":"W?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{\"c\":\"P\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"sun"}]}`,
			wantMsgs: []engine.ChatMessage{
				{Role: "user", Content: "W?"},
				{Role: "assistant", Content: "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"P\"}}\n</tool_call>"},
				{Role: "user", Content: "<tool_response>\nsun\n</tool_response>"},
			},
			wantPrompt: "<|im_start|>user\nW?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"P\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsun\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name:     "empty rendering",
			apply:    func([]engine.ChatMessage) (string, error) { return "", nil },
			body:     `{"messages":[{"role":"user","content":"q"}]}`,
			wantMsgs: []engine.ChatMessage{{Role: "user", Content: "q"}},
			code:     "empty_prompt",
		},
		{
			name:  "messages validated before the template",
			apply: chatML,
			body:  `{"messages":[{"role":"robot","content":"a"}]}`,
			code:  "invalid_value",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := &templater{apply: tc.apply}
			var prompt []int32
			called := false
			core, logs := observer.New(zap.InfoLevel)
			ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
				called, prompt = true, req.Prompt
				return echoText("ok")(ctx, req, emit)
			}}, func(o *Options) {
				o.Tokenizer = tok
				o.Logger = zap.New(core)
				o.Policy.Budgets.Default, o.Policy.Budgets.Routes = 1000, nil // ChatML is longer than the test's budgets

			})
			resp := ts.post(t, RouteChat, tc.body)
			var wantGot [][]engine.ChatMessage
			if tc.wantMsgs != nil {
				wantGot = [][]engine.ChatMessage{tc.wantMsgs}
			}
			if diff := cmp.Diff(wantGot, tok.got); diff != "" {
				t.Errorf("template calls (-want +got):\n%s", diff)
			}
			if tc.code == "" {
				m := decodeJSON(t, resp.Body)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %v", resp.StatusCode, m)
				}
				if got := tok.Decode(prompt); got != tc.wantPrompt {
					t.Errorf("prompt %q, want %q", got, tc.wantPrompt)
				}
				return
			}
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("status %d, want 400", resp.StatusCode)
			}
			e := errorBody(t, resp)
			if e.Type != "invalid_request_error" || deref(e.Code) != tc.code || !strings.HasPrefix(deref(e.Param), "messages") {
				t.Errorf("error %+v, want invalid_request_error %s on messages", e, tc.code)
			}
			if strings.Contains(e.Message, "jinja") || strings.Contains(e.Message, "secret") {
				t.Errorf("error message %q leaks the template's error", e.Message)
			}
			if called {
				t.Error("backend called for a chat that did not render")
			}
			if _, err := tc.apply(nil); errors.Is(err, secret) {
				// The operator sees the cause in the request log.
				lines := logs.FilterMessage("request").All()
				if len(lines) != 1 || !strings.Contains(lines[0].ContextMap()["cause"].(string), "undefined variable") {
					t.Errorf("request log %+v lacks the template's error as cause", lines)
				}
			}
		})
	}
}

// A tokenizer without a template of its own keeps the byte-level one.
func TestChatByteTemplate(t *testing.T) {
	msgs := []engine.ChatMessage{{Role: "system", Content: "S"}, {Role: "user", Content: "Hi"}}
	got, aerr := renderFlat(tokenizer.Bytes{}, msgs)
	if aerr != nil || got != "<|system|>\nS\n<|user|>\nHi\n<|assistant|>\n" {
		t.Errorf("renderFlat = %q, %v", got, aerr)
	}
}
