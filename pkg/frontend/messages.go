package frontend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// RouteMessages is Anthropic's Messages API.
const RouteMessages = "/v1/messages"

// messagesParams are the body parameters of POST /v1/messages that
// pdserve knows: Anthropic's MessageCreateParams. Any other field is a
// 400.
var messagesParams = paramSet("model", "messages", "max_tokens", "system", "stop_sequences", "stream",
	"temperature", "top_p", "top_k", "metadata", "tools", "tool_choice", "thinking", "service_tier",
	"container", "mcp_servers", "context_management", "cache_control", "diagnostics", "inference_geo",
	"output_config", "speed")

// messagesBody is the JSON body of POST /v1/messages.
type messagesBody struct {
	Model             *string           `json:"model"`
	Messages          json.RawMessage   `json:"messages"`
	MaxTokens         *int              `json:"max_tokens"`
	System            json.RawMessage   `json:"system"`
	StopSequences     []string          `json:"stop_sequences"`
	Stream            *bool             `json:"stream"`
	Temperature       *float64          `json:"temperature"`
	TopP              *float64          `json:"top_p"`
	TopK              *int              `json:"top_k"`
	Metadata          json.RawMessage   `json:"metadata"`
	Tools             []json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage   `json:"tool_choice"`
	Thinking          json.RawMessage   `json:"thinking"`
	ServiceTier       *string           `json:"service_tier"`
	Container         json.RawMessage   `json:"container"`
	MCPServers        json.RawMessage   `json:"mcp_servers"`
	ContextManagement json.RawMessage   `json:"context_management"`
	CacheControl      json.RawMessage   `json:"cache_control"`
	Diagnostics       json.RawMessage   `json:"diagnostics"`
	InferenceGeo      *string           `json:"inference_geo"`
	OutputConfig      json.RawMessage   `json:"output_config"`
	Speed             *string           `json:"speed"`
}

// msgRequest is a validated Messages API request: the chat body it
// becomes.
type msgRequest struct {
	stream bool
	model  string
	chat   []byte
}

// msgError is the 400 of the Messages API about param: its message
// names it, as Anthropic's do ("max_tokens: Field required").
func msgError(param, format string, a ...any) *apiError {
	return badRequest(param, "invalid_request_error", "%s", named(param, fmt.Sprintf(format, a...)))
}

// msgUnsupported is the 400 of a parameter pdserve cannot do as asked.
func msgUnsupported(param, format string, a ...any) *apiError {
	return unsupported(param, "%s", named(param, fmt.Sprintf(format, a...)))
}

// named returns msg led by "param: " unless it starts with param.
func named(param, msg string) string {
	if strings.HasPrefix(msg, param) {
		return msg
	}
	return param + ": " + msg
}

// parseMessages validates a Messages API body and turns it into a chat
// completions body. What chat checks itself (the model, tools' schemas,
// the stop strings' count, the context) is left to it.
func parseMessages(data []byte) (*msgRequest, *apiError) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil || fields == nil {
		return nil, badRequest("", "invalid_json", "The request body must be a JSON object.")
	}
	for k := range fields {
		if !messagesParams[k] {
			return nil, badRequest(k, "unknown_parameter", "%s: Extra inputs are not permitted", k)
		}
	}
	var b messagesBody
	if err := json.Unmarshal(data, &b); err != nil {
		var te *json.UnmarshalTypeError
		if asTypeError(err, &te) && te.Field != "" {
			return nil, msgError(te.Field, "wrong type: got %s", te.Value)
		}
		return nil, badRequest("", "invalid_json", "The request body is not valid JSON: %v", err)
	}
	if aerr := b.checkUnsupported(); aerr != nil {
		return nil, aerr
	}
	switch {
	case b.Model == nil || *b.Model == "":
		return nil, msgError("model", "Field required")
	case b.MaxTokens == nil:
		return nil, msgError("max_tokens", "Field required")
	case *b.MaxTokens == 0:
		return nil, msgUnsupported("max_tokens", "0 (pre-warming the prompt cache without a reply) is not supported; the router caches prompts' prefixes by itself")
	case *b.MaxTokens < 0:
		return nil, msgError("max_tokens", "must be at least 1, got %d", *b.MaxTokens)
	case b.Temperature != nil && (*b.Temperature < 0 || *b.Temperature > 1):
		return nil, msgError("temperature", "must be in [0, 1], got %g", *b.Temperature)
	case b.TopP != nil && (*b.TopP <= 0 || *b.TopP > 1):
		return nil, msgError("top_p", "must be in (0, 1], got %g", *b.TopP)
	}
	rq := &msgRequest{stream: b.Stream != nil && *b.Stream, model: *b.Model}
	chat := map[string]any{"model": *b.Model, "max_tokens": *b.MaxTokens}
	if b.Temperature != nil {
		chat["temperature"] = *b.Temperature
	}
	if b.TopP != nil {
		chat["top_p"] = *b.TopP
	}
	if b.StopSequences != nil {
		chat["stop"] = b.StopSequences
	}
	if rq.stream {
		chat["stream"] = true
		chat["stream_options"] = map[string]bool{"include_usage": true}
	}
	if user, aerr := msgMetadata(b.Metadata); aerr != nil {
		return nil, aerr
	} else if user != "" {
		chat["user"] = user
	}
	if b.Tools != nil {
		tools, aerr := msgTools(b.Tools)
		if aerr != nil {
			return nil, aerr
		}
		chat["tools"] = tools
	}
	if !isAbsent(b.ToolChoice) {
		tc, parallel, aerr := msgToolChoice(b.ToolChoice)
		if aerr != nil {
			return nil, aerr
		}
		chat["tool_choice"] = tc
		if !parallel && len(b.Tools) > 0 {
			chat["parallel_tool_calls"] = false
		}
	}
	var msgs []chatMsg
	if !isAbsent(b.System) {
		sys, aerr := msgText(b.System, "system")
		if aerr != nil {
			return nil, aerr
		}
		msgs = append(msgs, chatMsg{Role: "system", Content: sys})
	}
	turns, aerr := msgTurns(b.Messages)
	if aerr != nil {
		return nil, aerr
	}
	chat["messages"] = append(msgs, turns...)
	var err error
	if rq.chat, err = json.Marshal(chat); err != nil {
		return nil, msgError("messages", "cannot be encoded: %v", err)
	}
	return rq, nil
}

// checkUnsupported refuses, naming it, each parameter pdserve cannot do
// as asked; their trivial values are accepted.
func (b *messagesBody) checkUnsupported() *apiError {
	switch {
	case b.TopK != nil:
		return msgUnsupported("top_k", "top_k is not supported: pdserve samples with temperature and top_p")
	case !isAbsent(b.Container):
		return msgUnsupported("container", "containers are not supported: pdserve runs no server tools")
	case !isAbsent(b.MCPServers):
		return msgUnsupported("mcp_servers", "MCP servers are not supported: pdserve runs no server tools")
	case !isAbsent(b.ContextManagement):
		return msgUnsupported("context_management", "context management is not supported: a conversation over the context is a 400")
	case !isAbsent(b.Diagnostics):
		return msgUnsupported("diagnostics", "diagnostics are not supported")
	case !isAbsent(b.OutputConfig):
		return msgUnsupported("output_config", "output_config is not supported; structured outputs are served on /v1/chat/completions and /v1/responses")
	case b.InferenceGeo != nil:
		return msgUnsupported("inference_geo", "inference_geo is not supported: pdserve serves where it runs")
	case b.Speed != nil && *b.Speed != "standard":
		return msgUnsupported("speed", `speed %q is not supported (only "standard")`, *b.Speed)
	case b.ServiceTier != nil && *b.ServiceTier != "auto" && *b.ServiceTier != "standard_only":
		return msgError("service_tier", `must be "auto" or "standard_only", got %q`, *b.ServiceTier)
	}
	if !isAbsent(b.CacheControl) {
		if aerr := msgCacheControl(b.CacheControl, "cache_control"); aerr != nil {
			return aerr
		}
	}
	if !isAbsent(b.Thinking) {
		var t struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(b.Thinking, &t); err != nil {
			return msgError("thinking", "must be an object {type}")
		}
		if t.Type != "disabled" {
			return msgUnsupported("thinking", `thinking %q is not supported: the model's reasoning is not steered (only "disabled"); a model that reasons returns thinking blocks`, t.Type)
		}
	}
	return nil
}

// msgCacheControl accepts {"type": "ephemeral", "ttl"?}: prompts'
// prefixes are cached by the router anyway, so a breakpoint changes
// nothing but is no error.
func msgCacheControl(raw json.RawMessage, param string) *apiError {
	var c struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &c); err != nil || c.Type != "ephemeral" {
		return msgError(param, `must be {"type": "ephemeral"}`)
	}
	return nil
}

// msgMetadata returns metadata.user_id ("" when none).
func msgMetadata(raw json.RawMessage) (string, *apiError) {
	if isAbsent(raw) {
		return "", nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return "", msgError("metadata", "must be an object {user_id}")
	}
	var user *string
	for k, v := range m {
		if k != "user_id" {
			return "", badRequest("metadata."+k, "unknown_parameter", "metadata.%s: Extra inputs are not permitted", k)
		}
		if err := json.Unmarshal(v, &user); err != nil {
			return "", msgError("metadata.user_id", "must be a string")
		}
	}
	if user == nil {
		return "", nil
	}
	if len(*user) > 256 {
		return "", msgError("metadata.user_id", "must be at most 256 characters")
	}
	return *user, nil
}

// msgTools turns client tools {name, description, input_schema} into
// chat's function tools; server tools (a type other than "custom") are
// refused.
func msgTools(raw []json.RawMessage) ([]any, *apiError) {
	out := make([]any, 0, len(raw))
	for i, t := range raw {
		param := fmt.Sprintf("tools.%d", i)
		var f map[string]json.RawMessage
		if err := json.Unmarshal(t, &f); err != nil || f == nil {
			return nil, msgError(param, "must be an object {name, description, input_schema}")
		}
		fn := map[string]any{}
		for k, v := range f {
			switch k {
			case "type":
				var typ string
				if json.Unmarshal(v, &typ) != nil || typ != "custom" {
					return nil, msgUnsupported(param+".type", "tool type %s is not supported: pdserve serves client tools only", v)
				}
			case "name":
				var name string
				if json.Unmarshal(v, &name) != nil {
					return nil, msgError(param+".name", "must be a string")
				}
				fn["name"] = name
			case "description":
				var d string
				if json.Unmarshal(v, &d) != nil {
					return nil, msgError(param+".description", "must be a string")
				}
				fn["description"] = d
			case "input_schema":
				fn["parameters"] = v
			case "strict":
				var strict bool
				if json.Unmarshal(v, &strict) != nil {
					return nil, msgError(param+".strict", "must be a boolean")
				}
				fn["strict"] = strict
			case "cache_control":
				if aerr := msgCacheControl(v, param+".cache_control"); aerr != nil {
					return nil, aerr
				}
			default:
				return nil, msgUnsupported(param+"."+k, "%s is not supported on tools", k)
			}
		}
		if _, ok := fn["name"]; !ok {
			return nil, msgError(param+".name", "Field required")
		}
		if _, ok := fn["parameters"]; !ok {
			return nil, msgError(param+".input_schema", "Field required")
		}
		out = append(out, map[string]any{"type": "function", "function": fn})
	}
	return out, nil
}

// msgToolChoice turns tool_choice {type auto|any|tool|none, name,
// disable_parallel_tool_use} into chat's, and whether calls may be
// parallel.
func msgToolChoice(raw json.RawMessage) (any, bool, *apiError) {
	var c struct {
		Type    string  `json:"type"`
		Name    *string `json:"name"`
		Disable *bool   `json:"disable_parallel_tool_use"`
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, false, msgError("tool_choice", "must be an object {type}")
	}
	for k := range fields {
		switch k {
		case "type", "name", "disable_parallel_tool_use":
		default:
			return nil, false, badRequest("tool_choice."+k, "unknown_parameter", "tool_choice.%s: Extra inputs are not permitted", k)
		}
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, false, msgError("tool_choice", "must be an object {type, name, disable_parallel_tool_use}")
	}
	parallel := c.Disable == nil || !*c.Disable
	switch c.Type {
	case "auto":
		return "auto", parallel, nil
	case "any":
		return "required", parallel, nil
	case "none":
		return "none", parallel, nil
	case "tool":
		if c.Name == nil {
			return nil, false, msgError("tool_choice.name", "Field required")
		}
		return map[string]any{"type": "function", "function": map[string]string{"name": *c.Name}}, parallel, nil
	}
	return nil, false, msgError("tool_choice.type", `must be "auto", "any", "tool" or "none", got %q`, c.Type)
}

// msgText returns the text of a system prompt or a tool result: a string
// or text blocks.
func msgText(raw json.RawMessage, param string) (string, *apiError) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", msgError(param, "must be a string or an array of text blocks")
	}
	var b strings.Builder
	for i, bl := range blocks {
		p := fmt.Sprintf("%s.%d", param, i)
		var typ string
		_ = json.Unmarshal(bl["type"], &typ)
		if typ != "text" {
			return "", msgUnsupported(p+".type", "block type %q is not supported here: pdserve serves text models", typ)
		}
		text, aerr := msgBlockText(bl, p)
		if aerr != nil {
			return "", aerr
		}
		b.WriteString(text)
	}
	return b.String(), nil
}

// msgBlockText returns the text of a text block, checking its other
// fields.
func msgBlockText(bl map[string]json.RawMessage, param string) (string, *apiError) {
	var text string
	if err := json.Unmarshal(bl["text"], &text); err != nil {
		return "", msgError(param+".text", "must be a string")
	}
	for k, v := range bl {
		switch k {
		case "type", "text":
		case "cache_control":
			if !isAbsent(v) {
				if aerr := msgCacheControl(v, param+".cache_control"); aerr != nil {
					return "", aerr
				}
			}
		case "citations":
			if !isAbsent(v) && string(v) != "[]" {
				return "", msgUnsupported(param+".citations", "citations are not supported")
			}
		default:
			return "", badRequest(param+"."+k, "unknown_parameter", "%s.%s: Extra inputs are not permitted", param, k)
		}
	}
	return text, nil
}

// msgTurns turns the messages into chat messages: a user turn's text
// blocks into a user message and its tool_result blocks into tool
// messages, in their order; an assistant turn's text, thinking and
// tool_use blocks into one assistant message (content, reasoning, tool
// calls).
func msgTurns(raw json.RawMessage) ([]chatMsg, *apiError) {
	if isAbsent(raw) {
		return nil, msgError("messages", "Field required")
	}
	var turns []struct {
		Role    *string         `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &turns); err != nil {
		return nil, msgError("messages", "must be an array of {role, content}")
	}
	if len(turns) == 0 {
		return nil, msgError("messages", "at least one message is required")
	}
	var out []chatMsg
	for i, t := range turns {
		param := fmt.Sprintf("messages.%d", i)
		if t.Role == nil || *t.Role != "user" && *t.Role != "assistant" {
			return nil, msgError(param+".role", `must be "user" or "assistant"`)
		}
		role := *t.Role
		if isAbsent(t.Content) {
			return nil, msgError(param+".content", "Field required")
		}
		var s string
		if json.Unmarshal(t.Content, &s) == nil {
			out = append(out, chatMsg{Role: role, Content: s})
			continue
		}
		var blocks []map[string]json.RawMessage
		if err := json.Unmarshal(t.Content, &blocks); err != nil {
			return nil, msgError(param+".content", "must be a string or an array of content blocks")
		}
		cur := chatMsg{Role: role}
		open := false // cur holds something of this turn
		for j, bl := range blocks {
			p := fmt.Sprintf("%s.content.%d", param, j)
			if bl == nil {
				return nil, msgError(p, "must be an object")
			}
			var typ string
			_ = json.Unmarshal(bl["type"], &typ)
			switch {
			case typ == "text":
				text, aerr := msgBlockText(bl, p)
				if aerr != nil {
					return nil, aerr
				}
				cur.Content += text
				open = true
			case typ == "thinking" && role == "assistant":
				var th string
				if err := json.Unmarshal(bl["thinking"], &th); err != nil {
					return nil, msgError(p+".thinking", "must be a string")
				}
				cur.Reasoning += th
				open = true
			case typ == "tool_use" && role == "assistant":
				var u struct {
					ID    string          `json:"id"`
					Name  string          `json:"name"`
					Input json.RawMessage `json:"input"`
				}
				if err := json.Unmarshal(mustJSONMap(bl), &u); err != nil || u.ID == "" || u.Name == "" {
					return nil, msgError(p, "a tool_use block must have an id, a name and an input object")
				}
				var args bytes.Buffer
				if err := json.Compact(&args, u.Input); err != nil || !bytes.HasPrefix(args.Bytes(), []byte("{")) {
					return nil, msgError(p+".input", "must be an object")
				}
				cur.ToolCalls = append(cur.ToolCalls, chatToolCall{ID: u.ID, Type: "function", Function: toolFunction{Name: u.Name, Arguments: args.String()}})
				open = true
			case typ == "tool_result" && role == "user":
				var r struct {
					ToolUseID string          `json:"tool_use_id"`
					Content   json.RawMessage `json:"content"`
					IsError   bool            `json:"is_error"`
				}
				if err := json.Unmarshal(mustJSONMap(bl), &r); err != nil || r.ToolUseID == "" {
					return nil, msgError(p+".tool_use_id", "Field required")
				}
				var text string
				if !isAbsent(r.Content) {
					var aerr *apiError
					if text, aerr = msgText(r.Content, p+".content"); aerr != nil {
						return nil, aerr
					}
				}
				if r.IsError {
					// Chat has no error flag: the template sees it said.
					text = "Error: " + text
				}
				if open {
					out = append(out, cur)
					cur, open = chatMsg{Role: role}, false
				}
				out = append(out, chatMsg{Role: "tool", Content: text, ToolCallID: r.ToolUseID})
			case typ == "redacted_thinking":
				return nil, msgUnsupported(p+".type", "redacted_thinking blocks are not supported: pdserve's thinking is in the clear")
			default:
				return nil, msgUnsupported(p+".type", "content block type %q is not supported in a %s message: pdserve serves text models with client tools", typ, role)
			}
		}
		if open || len(blocks) == 0 {
			out = append(out, cur)
		}
	}
	return out, nil
}

func mustJSONMap(m map[string]json.RawMessage) []byte {
	b, _ := json.Marshal(m) // raw messages that parsed: cannot fail
	return b
}

// msgParam maps a chat parameter named in an error to the Messages
// API's.
func msgParam(p string) string {
	switch {
	case p == "messages" || strings.HasPrefix(p, "messages["):
		return "messages"
	case p == "max_completion_tokens" || p == "max_tokens":
		return "max_tokens"
	case p == "stop":
		return "stop_sequences"
	case strings.HasPrefix(p, "tools["):
		p = strings.Replace(strings.Replace(p, "[", ".", 1), "]", "", 1)
		p = strings.Replace(p, ".function.parameters", ".input_schema", 1)
		return strings.Replace(p, ".function.", ".", 1)
	}
	return p
}

// msgErrorType is Anthropic's error type and status of a chat path's
// error of status and code.
func msgErrorType(status int, code string) (string, int) {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error", status
	case status == http.StatusForbidden:
		return "permission_error", status
	case status == http.StatusNotFound:
		return "not_found_error", status
	case status == http.StatusRequestEntityTooLarge:
		return "request_too_large", status
	case status == http.StatusRequestTimeout:
		return "timeout_error", status
	case status == http.StatusTooManyRequests && code == "rate_limit_exceeded":
		return "rate_limit_error", status
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable:
		// A full server, no worker now: Anthropic's 529.
		return "overloaded_error", 529
	case status < 500:
		return "invalid_request_error", status
	}
	return "api_error", status
}

// msgErrorBody is an error as Anthropic's API sends it.
func msgErrorBody(e *apiError, requestID string) ([]byte, int) {
	code := ""
	if e.Code != nil {
		code = *e.Code
	}
	typ, status := msgErrorType(e.status, code)
	msg := e.Message
	if e.Param != nil {
		if p := msgParam(*e.Param); !strings.Contains(msg, p) {
			msg = p + ": " + msg // name the parameter, as Anthropic does
		}
	}
	body, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}, "request_id": requestID})
	return body, status
}

// writeMsgError writes e as the Messages API's error response.
func (s *Server) writeMsgError(w http.ResponseWriter, e *apiError, requestID string) {
	body, status := msgErrorBody(e, requestID)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if (status == http.StatusTooManyRequests || status == 529) && !e.noRetry && h.Get("Retry-After") == "" {
		ra := s.o.RetryAfter
		if e.retryAfter > 0 {
			ra = e.retryAfter
		}
		h.Set("Retry-After", strconv.Itoa(max(1, int((ra+999_999_999)/1_000_000_000))))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// messages serves POST /v1/messages on the chat path: the body becomes a
// chat body (parseMessages), the chat reply a Message, or, streamed, its
// chunks the Messages API's events (msgRun).
func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	id := "msg_" + newID()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.writeMsgError(w, &apiError{status: http.StatusMethodNotAllowed, Message: r.Method + " not allowed on " + r.URL.Path + "; use POST"}, id)
		return
	}
	w.Header().Set("request-id", id)
	tap := &chatTap{w: w, rc: http.NewResponseController(w)}
	run := &msgRun{id: id}
	tap.sink, tap.onCall = run, run.observe
	transform := func(data []byte, _ client) ([]byte, *apiError) {
		rq, aerr := parseMessages(data)
		if aerr != nil {
			return nil, aerr
		}
		run.model = rq.model
		if rq.stream {
			tap.stream, run.emit = true, tap.sse
		}
		return rq.chat, nil
	}
	s.serve(tap, r, true, id, transform)
	switch {
	case tap.status == 0:
		return // the client went away
	case tap.status != http.StatusOK:
		var body struct {
			Error *apiError `json:"error"`
		}
		if err := json.Unmarshal(tap.body.Bytes(), &body); err != nil || body.Error == nil {
			body.Error = &apiError{Message: strings.TrimSpace(tap.body.String())}
		}
		body.Error.status = tap.status
		s.writeMsgError(w, body.Error, id)
	case !tap.stream:
		if err := tap.whole(); err != nil {
			s.writeMsgError(w, &apiError{status: http.StatusInternalServerError, Message: "The message could not be built."}, id)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(run.message())
	}
}
