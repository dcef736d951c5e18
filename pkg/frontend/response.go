package frontend

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/pdserve/pdserve/pkg/budget"
)

// completion is a response body or stream chunk of either route.
type completion struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Choices []choice        `json:"choices"`
	Usage   *usage          `json:"usage,omitempty"`
	PDServe *pdserveSummary `json:"pdserve,omitempty"`
}

type choice struct {
	Index        int      `json:"index"`
	Text         *string  `json:"text,omitempty"`    // completions
	Delta        *delta   `json:"delta,omitempty"`   // chat, streaming
	Message      *message `json:"message,omitempty"` // chat, whole response
	Logprobs     any      `json:"logprobs"`          // *completionLogprobs, *chatLogprobs or nil
	FinishReason *string  `json:"finish_reason"`
	TokenIDs     []int32  `json:"token_ids,omitempty"` // return_token_ids
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
	// Reasoning is the reasoning text (<think>…</think>) of the delta,
	// as vLLM and DeepSeek's API send it.
	Reasoning *string    `json:"reasoning_content,omitempty"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

type message struct {
	Role string `json:"role"`
	// Content is null in a reply of tool calls only.
	Content   *string       `json:"content"`
	Reasoning *string       `json:"reasoning_content,omitempty"`
	ToolCalls []messageCall `json:"tool_calls,omitempty"`
}

// messageCall is a tool call of a whole response: id, type, function.
type messageCall struct {
	ID       string        `json:"id"`
	Type     string        `json:"type"`
	Function namedFunction `json:"function"`
}

// toolCall is one tool call of a message, or a stream delta of one:
// the first delta of a call has its index, id, type, name and empty
// arguments, the next its arguments (index only besides).
type toolCall struct {
	Index    int          `json:"index"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// MarshalJSON writes a call's first delta, or a whole call (they have an
// id), with its name even when it is "" (a call cut by max_tokens before
// its name was whole); a later delta without it.
func (tc toolCall) MarshalJSON() ([]byte, error) {
	type plain toolCall
	if tc.ID == "" {
		return json.Marshal(plain(tc))
	}
	return json.Marshal(struct {
		Index    int           `json:"index"`
		ID       string        `json:"id"`
		Type     string        `json:"type,omitempty"`
		Function namedFunction `json:"function"`
	}{tc.Index, tc.ID, tc.Type, namedFunction(tc.Function)})
}

// namedFunction is a call's function with its name always written.
type namedFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// pdserveSummary is the `pdserve` object: the budget of the request's
// first (usually only) prompt, and for a batched request the budget of
// every prompt in Prompts.
type pdserveSummary struct {
	budget.Summary
	// Prompts holds each prompt's budget, in prompt order, when a
	// /v1/completions request has more than one prompt; else omitted.
	Prompts []promptSummary `json:"prompts,omitempty"`
}

// promptSummary is the budget of one prompt of a batched request.
type promptSummary struct {
	// RequestID is the prompt's own id (the response id, "-", the prompt
	// index), as in its request log line.
	RequestID string `json:"request_id"`
	budget.Summary
}

// sseWriter writes Server-Sent Events, flushing each at once. The headers
// go out with the first event, so an error before any output can still
// be a plain HTTP error. Not safe for concurrent use.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func (s *sseWriter) start() {
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
	s.started = true
}

// event writes `data: <json of v>` and flushes.
func (s *sseWriter) event(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("frontend: encode event: %w", err)
	}
	return s.write(data)
}

// done writes the closing `data: [DONE]`.
func (s *sseWriter) done() error { return s.write([]byte("[DONE]")) }

func (s *sseWriter) write(data []byte) error {
	if !s.started {
		s.start()
	}
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		return fmt.Errorf("frontend: write event: %w", err)
	}
	if err := s.rc.Flush(); err != nil {
		return fmt.Errorf("frontend: flush event: %w", err)
	}
	return nil
}
