package frontend

import (
	"encoding/json"
	"net/http"
	"strings"
)

// Content block types of a Message.
const (
	blockText     = "text"
	blockThinking = "thinking"
	blockToolUse  = "tool_use"
)

// msgBlock is one content block being built.
type msgBlock struct {
	kind string
	text strings.Builder // the text, the thinking, the tool input's JSON
	id   string          // tool_use
	name string          // tool_use
}

// json returns the block as a Message's content holds it; open: as
// content_block_start sends it (empty, input {}).
func (b *msgBlock) json(open bool) any {
	text := b.text.String()
	if open {
		text = ""
	}
	switch b.kind {
	case blockThinking:
		return map[string]any{"type": blockThinking, "thinking": text, "signature": ""}
	case blockToolUse:
		input := json.RawMessage("{}")
		if !open {
			input = partialObject(text)
		}
		return map[string]any{"type": blockToolUse, "id": b.id, "name": b.name, "input": input}
	}
	return map[string]any{"type": blockText, "text": text, "citations": nil}
}

// msgUsage is a Message's usage. InputTokens are the prompt's tokens not
// read from the prefix cache; CacheReadInputTokens those read (prefix
// hits), so that their sum is the prompt, as Anthropic counts.
type msgUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

// msgRun turns a chat completion of one choice into a Message and,
// streamed, into the Messages API's events. It is the chatSink of a
// Messages API request.
type msgRun struct {
	id    string
	model string
	// emit sends one event (nil: a whole message).
	emit func(typ string, ev map[string]any) error
	// c is the chat call (Server.serve hands it over before it runs):
	// the prompt's tokens, the stop string that matched.
	c *call

	blocks  []*msgBlock
	cur     *msgBlock
	calls   map[int]*msgBlock
	finish  string
	usage   msgUsage
	pd      *pdserveSummary
	stopSeq *string
}

var _ chatSink = (*msgRun)(nil)

func (r *msgRun) observe(c *call) {
	r.c = c
	r.usage.InputTokens = c.prompts[0].req.Trace.PromptTokens
}

func (r *msgRun) send(typ string, ev map[string]any) error {
	if r.emit == nil {
		return nil
	}
	ev["type"] = typ
	return r.emit(typ, ev)
}

// message returns the Message as it stands.
func (r *msgRun) message() map[string]any {
	content := make([]any, 0, len(r.blocks))
	for _, b := range r.blocks {
		content = append(content, b.json(false))
	}
	m := map[string]any{
		"id": r.id, "type": "message", "role": "assistant", "model": r.model, "content": content,
		"stop_reason": nil, "stop_sequence": r.stopSeq, "usage": r.usage,
	}
	if r.finish != "" {
		m["stop_reason"] = r.stopReason()
	}
	if r.pd != nil {
		m["pdserve"] = r.pd
	}
	return m
}

// stopReason is the Message's stop_reason of the chat finish reason.
func (r *msgRun) stopReason() string {
	switch {
	case r.finish == "length":
		return "max_tokens"
	case r.finish == "tool_calls":
		return "tool_use"
	case r.stopSeq != nil:
		return "stop_sequence"
	}
	return "end_turn"
}

// start sends message_start and a ping.
func (r *msgRun) start() error {
	if err := r.send("message_start", map[string]any{"message": r.message()}); err != nil {
		return err
	}
	return r.send("ping", map[string]any{})
}

// open closes the open block and opens b.
func (r *msgRun) open(b *msgBlock) error {
	if err := r.closeCur(); err != nil {
		return err
	}
	r.blocks = append(r.blocks, b)
	r.cur = b
	return r.send("content_block_start", map[string]any{"index": len(r.blocks) - 1, "content_block": b.json(true)})
}

func (r *msgRun) closeCur() error {
	if r.cur == nil {
		return nil
	}
	r.cur = nil
	return r.send("content_block_stop", map[string]any{"index": len(r.blocks) - 1})
}

// add appends s to the open block of kind (opening one if needed) and
// sends its delta.
func (r *msgRun) add(kind, s string) error {
	if s == "" {
		return nil
	}
	if r.cur == nil || r.cur.kind != kind {
		if err := r.open(&msgBlock{kind: kind}); err != nil {
			return err
		}
	}
	r.cur.text.WriteString(s)
	d := map[string]any{"type": "text_delta", "text": s}
	if kind == blockThinking {
		d = map[string]any{"type": "thinking_delta", "thinking": s}
	}
	return r.send("content_block_delta", map[string]any{"index": len(r.blocks) - 1, "delta": d})
}

func (r *msgRun) reasoning(s string) error { return r.add(blockThinking, s) }
func (r *msgRun) content(s string) error   { return r.add(blockText, s) }
func (r *msgRun) answer(s string) error    { return r.add(blockText, s) }

// call opens a tool_use block at a call's head and sends its arguments
// as input_json_delta.
func (r *msgRun) call(tc toolCall) error {
	if r.calls == nil {
		r.calls = map[int]*msgBlock{}
	}
	b := r.calls[tc.Index]
	if b == nil || tc.ID != "" {
		b = &msgBlock{kind: blockToolUse, id: "toolu_" + strings.TrimPrefix(tc.ID, "call_"), name: tc.Function.Name}
		if err := r.open(b); err != nil {
			return err
		}
		r.calls[tc.Index] = b
	}
	if tc.Function.Arguments == "" {
		return nil
	}
	b.text.WriteString(tc.Function.Arguments)
	return r.send("content_block_delta", map[string]any{"index": len(r.blocks) - 1, "delta": map[string]any{"type": "input_json_delta", "partial_json": tc.Function.Arguments}})
}

func (r *msgRun) finished(reason string) { r.finish = reason }

// end closes the open block and sends message_delta (the stop reason,
// the usage, the pdserve budget) and message_stop.
func (r *msgRun) end(u *usage, pd *pdserveSummary) error {
	if err := r.closeCur(); err != nil {
		return err
	}
	if r.finish == "" {
		r.finish = "stop"
	}
	if r.c != nil && r.finish == "stop" {
		if ch := r.c.prompts[0].choices[0]; ch.text.matched != "" {
			stop := ch.text.matched
			r.stopSeq = &stop
		}
	}
	if u != nil {
		cached := 0
		if pd != nil {
			cached = min(u.PromptTokens, max(pd.PrefixHitTokens, pd.DecodePrefixHitTokens))
		}
		r.usage = msgUsage{InputTokens: u.PromptTokens - cached, CacheReadInputTokens: cached, OutputTokens: u.CompletionTokens}
	}
	r.pd = pd
	ev := map[string]any{"delta": map[string]any{"stop_reason": r.stopReason(), "stop_sequence": r.stopSeq}, "usage": r.usage}
	if pd != nil {
		ev["pdserve"] = pd
	}
	if err := r.send("message_delta", ev); err != nil {
		return err
	}
	return r.send("message_stop", map[string]any{})
}

// fail ends a stream with an error event, as Anthropic's.
func (r *msgRun) fail(e *apiError) error {
	if e.status == 0 {
		e.status = http.StatusInternalServerError
		if e.Code != nil && *e.Code == "overloaded" {
			e.status = http.StatusTooManyRequests
		}
	}
	code := ""
	if e.Code != nil {
		code = *e.Code
	}
	typ, _ := msgErrorType(e.status, code)
	return r.send("error", map[string]any{"error": map[string]string{"type": typ, "message": e.Message}})
}

// partialObject returns the JSON object of text, the arguments of a tool
// call: as they are when whole; when cut short (max_tokens), closed where
// they were cut (the last member that is whole kept); {} when no prefix
// of it is an object.
func partialObject(text string) json.RawMessage {
	text = strings.TrimSpace(text)
	if strings.HasPrefix(text, "{") && json.Valid([]byte(text)) {
		return json.RawMessage(text)
	}
	// Scan, noting each point where the text so far can end and the
	// closers of the containers open there; then try them from the last.
	type point struct {
		i       int
		extra   string
		closers string
	}
	var points []point
	var stack []byte
	inString, escaped, key := false, false, false
	note := func(i int, extra string) {
		c := make([]byte, len(stack))
		for j := range stack {
			c[j] = stack[len(stack)-1-j]
		}
		points = append(points, point{i, extra, string(c)})
	}
scan:
	for i := 0; i < len(text); i++ {
		ch := text[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case ch == '\\':
				escaped = true
			case ch == '"':
				inString = false
				if !key {
					note(i+1, "")
				}
			}
			continue
		}
		switch ch {
		case '"':
			inString = true
			key = len(stack) > 0 && stack[len(stack)-1] == '}' && expectsKey(text[:i])
		case '{':
			stack = append(stack, '}')
			note(i+1, "")
		case '[':
			stack = append(stack, ']')
			note(i+1, "")
		case '}', ']':
			if len(stack) == 0 {
				break scan
			}
			stack = stack[:len(stack)-1]
			note(i+1, "")
		case ',':
			note(i, "")
		}
	}
	switch {
	case inString && !key:
		note(len(text), `"`) // a string value cut: as far as it goes
	case !inString:
		note(len(text), "") // a number or literal that may be whole
	}
	for k := len(points) - 1; k >= 0; k-- {
		p := points[k]
		s := strings.TrimRight(text[:p.i], " \t\r\n,") + p.extra + p.closers
		if strings.HasPrefix(s, "{") && json.Valid([]byte(s)) {
			return json.RawMessage(s)
		}
	}
	return json.RawMessage("{}")
}

// expectsKey reports whether a string that starts after prefix, inside
// an object, is a key: the last token before it is "{" or ",".
func expectsKey(prefix string) bool {
	p := strings.TrimRight(prefix, " \t\r\n")
	return strings.HasSuffix(p, "{") || strings.HasSuffix(p, ",")
}
