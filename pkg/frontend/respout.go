package frontend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// respObject is a Response as OpenAI's reference defines it, plus the
// `pdserve` budget.
type respObject struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	CompletedAt        *int64            `json:"completed_at"`
	Background         bool              `json:"background"`
	Error              *respError        `json:"error"`
	IncompleteDetails  *respIncomplete   `json:"incomplete_details"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Metadata           map[string]string `json:"metadata"`
	Model              string            `json:"model"`
	Output             []any             `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Reasoning          respReasoningOut  `json:"reasoning"`
	ServiceTier        string            `json:"service_tier"`
	Store              bool              `json:"store"`
	Temperature        float64           `json:"temperature"`
	Text               respText          `json:"text"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              []json.RawMessage `json:"tools"`
	TopP               float64           `json:"top_p"`
	Truncation         string            `json:"truncation"`
	Usage              *respUsage        `json:"usage"`
	User               *string           `json:"user"`
	PDServe            *pdserveSummary   `json:"pdserve,omitempty"`
}

type respError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type respIncomplete struct {
	Reason string `json:"reason"`
}

type respReasoningOut struct {
	Effort  *string `json:"effort"`
	Summary *string `json:"summary"`
}

type respText struct {
	Format json.RawMessage `json:"format"`
}

type respUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// Output item kinds.
const (
	itemReasoning = "reasoning"
	itemMessage   = "message"
	itemCall      = "function_call"
)

// outItem is one output item being built.
type outItem struct {
	kind   string
	id     string
	text   strings.Builder // the message's text, the reasoning, the call's arguments
	name   string          // function_call
	callID string          // function_call
	status string          // in_progress, completed, incomplete
}

type textPart struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

type reasoningPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// part returns the item's content part (message, reasoning) as it is.
func (it *outItem) part() any {
	if it.kind == itemReasoning {
		return reasoningPart{Type: "reasoning_text", Text: it.text.String()}
	}
	return textPart{Type: "output_text", Text: it.text.String(), Annotations: []any{}, Logprobs: []any{}}
}

// json returns the item as the Response's output holds it.
func (it *outItem) json() any {
	switch it.kind {
	case itemReasoning:
		content := []any{}
		if it.status != "in_progress" {
			content = append(content, it.part())
		}
		return struct {
			ID      string `json:"id"`
			Type    string `json:"type"`
			Summary []any  `json:"summary"`
			Content []any  `json:"content"`
			Status  string `json:"status"`
		}{it.id, it.kind, []any{}, content, it.status}
	case itemCall:
		args := it.text.String()
		if it.status == "in_progress" {
			args = ""
		}
		return struct {
			ID        string `json:"id"`
			Type      string `json:"type"`
			Status    string `json:"status"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		}{it.id, it.kind, it.status, it.callID, it.name, args}
	}
	content := []any{}
	if it.status != "in_progress" {
		content = append(content, it.part())
	}
	return struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Status  string `json:"status"`
		Role    string `json:"role"`
		Content []any  `json:"content"`
	}{it.id, it.kind, it.status, "assistant", content}
}

// respRun turns a chat completion of one choice into a Response and,
// streamed, into the Responses API's events, numbered from 0.
type respRun struct {
	rq   *respRequest
	resp respObject
	// emit sends one event (nil: none are sent, a whole response).
	emit func(typ string, ev map[string]any) error
	seq  int

	items   []*outItem
	cur     *outItem // the open item, nil when none
	calls   map[int]*outItem
	finish  string
	failed  *apiError
	started bool // response.created was sent
	// reasoningText collects every reasoning item's text (for
	// reasoning_tokens).
	reasoningText strings.Builder
}

func newRespRun(rq *respRequest, id string, created int64) *respRun {
	r := &respRun{rq: rq, calls: map[int]*outItem{}}
	r.resp = respObject{
		ID: id, Object: "response", CreatedAt: created, Status: "in_progress", Instructions: rq.instructions,
		MaxOutputTokens: rq.maxOutput, Metadata: rq.metadata, Model: rq.model, Output: []any{}, ParallelToolCalls: rq.parallel,
		ServiceTier: "default", Store: rq.store, Temperature: rq.temperature, Text: respText{Format: rq.textFormat},
		ToolChoice: rq.toolChoice, Tools: rq.tools, TopP: rq.topP, Truncation: rq.truncation, User: rq.user,
	}
	if rq.prevID != "" {
		r.resp.PreviousResponseID = &rq.prevID
	}
	return r
}

// send emits one event of type typ with fields ev and the next
// sequence number.
func (r *respRun) send(typ string, ev map[string]any) error {
	if r.emit == nil {
		return nil
	}
	ev["type"] = typ
	ev["sequence_number"] = r.seq
	r.seq++
	return r.emit(typ, ev)
}

// snapshot returns the Response as it stands, its output items included.
func (r *respRun) snapshot() respObject {
	o := r.resp
	o.Output = make([]any, 0, len(r.items))
	for _, it := range r.items {
		if it.status != "in_progress" {
			o.Output = append(o.Output, it.json())
		}
	}
	return o
}

// start sends response.created and response.in_progress.
func (r *respRun) start() error {
	if r.started {
		return nil
	}
	r.started = true
	if err := r.send("response.created", map[string]any{"response": r.snapshot()}); err != nil {
		return err
	}
	return r.send("response.in_progress", map[string]any{"response": r.snapshot()})
}

// open closes the open item and opens a new one of kind.
func (r *respRun) open(kind string, it *outItem) (*outItem, error) {
	if err := r.closeCur("completed"); err != nil {
		return nil, err
	}
	if it == nil {
		it = &outItem{kind: kind}
	}
	it.status = "in_progress"
	switch kind {
	case itemReasoning:
		it.id = "rs_" + newID()
	case itemMessage:
		it.id = "msg_" + newID()
	case itemCall:
		it.id = "fc_" + newID()
	}
	r.items = append(r.items, it)
	r.cur = it
	idx := len(r.items) - 1
	if err := r.send("response.output_item.added", map[string]any{"output_index": idx, "item": it.json()}); err != nil {
		return nil, err
	}
	if kind != itemCall {
		if err := r.send("response.content_part.added", map[string]any{"item_id": it.id, "output_index": idx, "content_index": 0, "part": it.part()}); err != nil {
			return nil, err
		}
	}
	return it, nil
}

// closeCur ends the open item with status.
func (r *respRun) closeCur(status string) error {
	it := r.cur
	if it == nil {
		return nil
	}
	r.cur = nil
	idx := len(r.items) - 1
	base := func() map[string]any { return map[string]any{"item_id": it.id, "output_index": idx} }
	switch it.kind {
	case itemReasoning:
		ev := base()
		ev["content_index"], ev["text"] = 0, it.text.String()
		if err := r.send("response.reasoning_text.done", ev); err != nil {
			return err
		}
	case itemMessage:
		ev := base()
		ev["content_index"], ev["text"], ev["logprobs"] = 0, it.text.String(), []any{}
		if err := r.send("response.output_text.done", ev); err != nil {
			return err
		}
	case itemCall:
		ev := base()
		ev["arguments"], ev["name"] = it.text.String(), it.name
		if err := r.send("response.function_call_arguments.done", ev); err != nil {
			return err
		}
	}
	if it.kind != itemCall {
		ev := base()
		ev["content_index"], ev["part"] = 0, it.part()
		if err := r.send("response.content_part.done", ev); err != nil {
			return err
		}
	}
	it.status = status
	return r.send("response.output_item.done", map[string]any{"output_index": idx, "item": it.json()})
}

// reasoning adds reasoning text.
func (r *respRun) reasoning(s string) error {
	if s == "" {
		return nil
	}
	it := r.cur
	if it == nil || it.kind != itemReasoning {
		var err error
		if it, err = r.open(itemReasoning, nil); err != nil {
			return err
		}
	}
	it.text.WriteString(s)
	r.reasoningText.WriteString(s)
	return r.send("response.reasoning_text.delta", map[string]any{"item_id": it.id, "output_index": len(r.items) - 1, "content_index": 0, "delta": s})
}

// content adds answer text.
func (r *respRun) content(s string) error {
	if s == "" {
		return nil
	}
	it := r.cur
	if it == nil || it.kind != itemMessage {
		var err error
		if it, err = r.open(itemMessage, nil); err != nil {
			return err
		}
	}
	it.text.WriteString(s)
	return r.send("response.output_text.delta", map[string]any{"item_id": it.id, "output_index": len(r.items) - 1, "content_index": 0, "delta": s, "logprobs": []any{}})
}

// call adds a tool call delta: its head (id, name) opens the call's
// item, its arguments go to the open call.
func (r *respRun) call(tc toolCall) error {
	it := r.calls[tc.Index]
	if it == nil || tc.ID != "" {
		var err error
		it = &outItem{kind: itemCall, callID: tc.ID, name: tc.Function.Name}
		if it, err = r.open(itemCall, it); err != nil {
			return err
		}
		r.calls[tc.Index] = it
	}
	if tc.Function.Arguments == "" {
		return nil
	}
	it.text.WriteString(tc.Function.Arguments)
	return r.send("response.function_call_arguments.delta", map[string]any{"item_id": it.id, "output_index": slicesIndex(r.items, it), "delta": tc.Function.Arguments})
}

func slicesIndex(items []*outItem, it *outItem) int {
	for i, x := range items {
		if x == it {
			return i
		}
	}
	return -1
}

// end finishes the Response: its status from the finish reason (length:
// incomplete, max_output_tokens), its usage, and its last event, which
// goes out after before (when not nil) saw the final Response.
func (r *respRun) end(u *usage, pd *pdserveSummary, now int64, tokens func(string) int, before func(*respRun)) error {
	status := "completed"
	if r.finish == "length" {
		status = "incomplete"
		r.resp.IncompleteDetails = &respIncomplete{Reason: "max_output_tokens"}
	}
	if err := r.closeCur(status); err != nil {
		return err
	}
	r.resp.Status = status
	if status == "completed" {
		r.resp.CompletedAt = &now
	}
	if u != nil {
		ru := &respUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
		if pd != nil {
			ru.InputTokensDetails.CachedTokens = min(u.PromptTokens, max(pd.PrefixHitTokens, pd.DecodePrefixHitTokens))
		}
		if s := r.reasoningText.String(); s != "" && tokens != nil {
			ru.OutputTokensDetails.ReasoningTokens = min(u.CompletionTokens, tokens(s))
		}
		r.resp.Usage = ru
	}
	r.resp.PDServe = pd
	if before != nil {
		before(r)
	}
	return r.send("response."+status, map[string]any{"response": r.snapshot()})
}

// fail ends a streamed Response with an error event and
// response.failed.
func (r *respRun) fail(e *apiError) error {
	r.resp.Status = "failed"
	code := "server_error"
	if e.status == http.StatusTooManyRequests {
		code = "rate_limit_exceeded"
	}
	r.resp.Error = &respError{Code: code, Message: e.Message}
	ev := map[string]any{"code": e.Code, "message": e.Message, "param": e.Param}
	if err := r.send("error", ev); err != nil {
		return err
	}
	return r.send("response.failed", map[string]any{"response": r.snapshot()})
}

// chatChunk is a chat stream chunk as a chatTap reads it.
type chatChunk struct {
	Choices []struct {
		Delta        *delta  `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage   *usage          `json:"usage"`
	PDServe *pdserveSummary `json:"pdserve"`
	Error   *apiError       `json:"error"`
}

// chatSink turns the chat completion of one choice into another API's
// output (the Responses API's, the Messages API's) as a chatTap reads it.
type chatSink interface {
	// start sends a stream's first events.
	start() error
	reasoning(s string) error
	content(s string) error
	// answer is the whole answer text of a reply that was not streamed
	// ("" too, when the reply has no tool calls).
	answer(s string) error
	// call adds a tool call delta: its head (id, name), then arguments.
	call(tc toolCall) error
	finished(reason string)
	// end sends the last events (or builds the whole output).
	end(u *usage, pd *pdserveSummary) error
	// fail ends a stream with an error.
	fail(e *apiError) error
}

// chatTap is the http.ResponseWriter the chat path writes a request of
// another API to (Server.serve): streamed, it turns each chat chunk
// into the sink's events at once (a slow client slows the chat path,
// whose write deadline still applies); whole, and for an error, it keeps
// the body for whole or for the caller. Not safe for concurrent use (the
// chat path serializes its writes).
type chatTap struct {
	w      http.ResponseWriter // the client's; its headers are shared
	rc     *http.ResponseController
	sink   chatSink
	stream bool
	ws     bool // events go to a WebSocket, not to w
	// onCall, when not nil, is handed the chat call before it runs.
	onCall func(*call)

	status  int
	body    bytes.Buffer // a whole response or an error
	pending []byte       // stream bytes not yet a whole event
	err     error        // the error the client's writer returned
}

func (x *chatTap) Header() http.Header { return x.w.Header() }

func (x *chatTap) WriteHeader(code int) {
	if x.status != 0 {
		return
	}
	x.status = code
	if code == http.StatusOK && x.stream {
		if !x.ws {
			x.w.WriteHeader(code)
		}
		x.err = x.sink.start()
	}
}

func (x *chatTap) Write(p []byte) (int, error) {
	if x.status == 0 {
		x.WriteHeader(http.StatusOK)
	}
	if x.err != nil {
		return 0, x.err
	}
	if x.status != http.StatusOK || !x.stream {
		return x.body.Write(p)
	}
	x.pending = append(x.pending, p...)
	for {
		i := bytes.Index(x.pending, []byte("\n\n"))
		if i < 0 {
			break
		}
		line := x.pending[:i]
		x.pending = x.pending[i+2:]
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok || string(data) == "[DONE]" {
			continue
		}
		if err := x.event(data); err != nil {
			x.err = err
			return 0, err
		}
	}
	return len(p), nil
}

// observe hands c to onCall (Server.serve calls it).
func (x *chatTap) observe(c *call) {
	if x.onCall != nil {
		x.onCall(c)
	}
}

// event handles one chat stream chunk.
func (x *chatTap) event(data []byte) error {
	var c chatChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return errors.New("frontend: a chat chunk does not parse")
	}
	r := x.sink
	if c.Error != nil {
		return r.fail(c.Error)
	}
	for _, ch := range c.Choices {
		if d := ch.Delta; d != nil {
			if d.Reasoning != nil {
				if err := r.reasoning(*d.Reasoning); err != nil {
					return err
				}
			}
			if d.Content != nil {
				if err := r.content(*d.Content); err != nil {
					return err
				}
			}
			for _, tc := range d.ToolCalls {
				if err := r.call(tc); err != nil {
					return err
				}
			}
		}
		if ch.FinishReason != nil {
			r.finished(*ch.FinishReason)
		}
	}
	if c.Usage != nil {
		return r.end(c.Usage, c.PDServe)
	}
	return nil
}

// sse writes one event of a stream: its type and its data.
func (x *chatTap) sse(typ string, ev map[string]any) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("frontend: encode event: %w", err)
	}
	buf := make([]byte, 0, len(data)+len(typ)+20)
	buf = append(buf, "event: "...)
	buf = append(buf, typ...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := x.w.Write(buf); err != nil {
		return fmt.Errorf("frontend: write event: %w", err)
	}
	return x.rc.Flush()
}

// FlushError flushes the client's writer (streamed).
func (x *chatTap) FlushError() error {
	if x.err != nil {
		return x.err
	}
	if !x.stream || x.ws || x.status != http.StatusOK {
		return nil
	}
	return x.rc.Flush()
}

// Unwrap lets a ResponseController reach the client's writer (write
// deadlines).
func (x *chatTap) Unwrap() http.ResponseWriter { return x.w }

// respNames rewrites chat's parameter names in an error message as the
// Responses API names them (the param itself goes through respParam).
var respNames = strings.NewReplacer(
	"response_format.json_schema.", "text.format.",
	"response_format", "text.format",
	"max_completion_tokens", "max_output_tokens",
	"max_tokens", "max_output_tokens",
	"room for the messages", "room for the input",
)

// mapError names the parameter of a chat path's error, and the
// parameters its message names, as the Responses API does.
func mapError(e *apiError) {
	if e.Param != nil {
		e.Param = ptr(respParam(*e.Param))
	}
	e.Message = respNames.Replace(e.Message)
}

// whole feeds the sink the whole (not streamed) chat completion the chat
// path wrote.
func (x *chatTap) whole() error {
	var c completion
	var raw struct {
		Choices []struct {
			Message      *message `json:"message"`
			FinishReason *string  `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(x.body.Bytes(), &c); err != nil {
		return err
	}
	if err := json.Unmarshal(x.body.Bytes(), &raw); err != nil {
		return err
	}
	r := x.sink
	for _, ch := range raw.Choices {
		if m := ch.Message; m != nil {
			if m.Reasoning != nil {
				_ = r.reasoning(*m.Reasoning)
			}
			if m.Content != nil && (*m.Content != "" || len(m.ToolCalls) == 0) {
				_ = r.answer(*m.Content)
			}
			for i, tc := range m.ToolCalls {
				_ = r.call(toolCall{Index: i, ID: tc.ID, Type: tc.Type, Function: toolFunction(tc.Function)})
			}
		}
		if ch.FinishReason != nil {
			r.finished(*ch.FinishReason)
		}
	}
	return r.end(c.Usage, c.PDServe)
}

// respSink is a respRun as a chatSink.
type respSink struct {
	*respRun
	now    func() int64
	tokens func(string) int
	// onEnd is called with the final Response of a stream (completed or
	// incomplete) before its last event is sent.
	onEnd func(*respRun)
}

var _ chatSink = (*respSink)(nil)

func (x *respSink) finished(reason string) { x.finish = reason }

func (x *respSink) answer(s string) error {
	if s == "" {
		_, err := x.open(itemMessage, nil) // an empty answer is an empty message
		return err
	}
	return x.content(s)
}

func (x *respSink) fail(e *apiError) error {
	mapError(e)
	return x.respRun.fail(e)
}

func (x *respSink) end(u *usage, pd *pdserveSummary) error {
	return x.respRun.end(u, pd, x.now(), x.tokens, x.onEnd)
}
