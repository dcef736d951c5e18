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
	PDServe *budget.Summary `json:"pdserve,omitempty"`
}

type choice struct {
	Index        int      `json:"index"`
	Text         *string  `json:"text,omitempty"`    // completions
	Delta        *delta   `json:"delta,omitempty"`   // chat, streaming
	Message      *message `json:"message,omitempty"` // chat, whole response
	Logprobs     any      `json:"logprobs"`          // always null
	FinishReason *string  `json:"finish_reason"`
	TokenIDs     []int32  `json:"token_ids,omitempty"` // return_token_ids
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (c *call) usageNow() *usage {
	tr := c.req.Trace
	return &usage{PromptTokens: tr.PromptTokens, CompletionTokens: tr.OutputTokens, TotalTokens: tr.PromptTokens + tr.OutputTokens}
}

func (c *call) base(object string) completion {
	return completion{ID: c.req.ID, Object: object, Created: c.created, Model: c.req.Model}
}

// chunk returns a stream chunk carrying text (and finish when not nil).
// The first chat chunk also carries the assistant role.
// With return_token_ids it carries the ids delivered since the last chunk.
func (c *call) chunk(text string, finish *string) completion {
	ids := c.pendingIDs
	c.pendingIDs = nil
	if !c.chat {
		out := c.base("text_completion")
		out.Choices = []choice{{Text: &text, FinishReason: finish, TokenIDs: ids}}
		return out
	}
	out := c.base("chat.completion.chunk")
	d := &delta{}
	if !c.sse.started {
		d.Role = "assistant"
	}
	if text != "" || d.Role != "" {
		d.Content = &text
	}
	out.Choices = []choice{{Delta: d, FinishReason: finish, TokenIDs: ids}}
	return out
}

// usageChunk is the extra last chunk of stream_options.include_usage.
func (c *call) usageChunk() completion {
	object := "text_completion"
	if c.chat {
		object = "chat.completion.chunk"
	}
	out := c.base(object)
	out.Choices = []choice{}
	out.Usage = c.usageNow()
	return out
}

// response is the body of a non-streaming response.
func (c *call) response(text, finish string, s *budget.Summary) completion {
	var out completion
	if c.chat {
		out = c.base("chat.completion")
		out.Choices = []choice{{Message: &message{Role: "assistant", Content: text}, FinishReason: &finish, TokenIDs: c.pendingIDs}}
	} else {
		out = c.base("text_completion")
		out.Choices = []choice{{Text: &text, FinishReason: &finish, TokenIDs: c.pendingIDs}}
	}
	out.Usage = c.usageNow()
	out.PDServe = s
	return out
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
