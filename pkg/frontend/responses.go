package frontend

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// RouteResponses is OpenAI's Responses API.
const RouteResponses = "/v1/responses"

// Bounds of the Responses API's parameters, as OpenAI's reference sets
// them.
const (
	maxMetadataKeys     = 16
	maxMetadataKeyLen   = 64
	maxMetadataValueLen = 512
)

// responsesParams are the parameters of POST /v1/responses that pdserve
// knows: OpenAI's ResponseCreateParams. Any other field is a 400
// unknown_parameter.
var responsesParams = paramSet("model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
	"text", "max_output_tokens", "temperature", "top_p", "reasoning", "metadata", "store", "stream",
	"stream_options", "previous_response_id", "truncation", "user", "safety_identifier", "prompt_cache_key",
	"service_tier", "background", "include", "conversation", "prompt", "top_logprobs", "max_tool_calls",
	"context_management", "moderation", "prompt_cache_options", "prompt_cache_retention")

// responsesBody is the JSON body of POST /v1/responses (and of a
// WebSocket response.create event, less its type and stream_id).
type responsesBody struct {
	Model              *string           `json:"model"`
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions"`
	Tools              []json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	Text               json.RawMessage   `json:"text"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Temperature        *float64          `json:"temperature"`
	TopP               *float64          `json:"top_p"`
	Reasoning          json.RawMessage   `json:"reasoning"`
	Metadata           json.RawMessage   `json:"metadata"`
	Store              *bool             `json:"store"`
	Stream             *bool             `json:"stream"`
	StreamOptions      json.RawMessage   `json:"stream_options"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Truncation         *string           `json:"truncation"`
	User               *string           `json:"user"`
	SafetyIdentifier   *string           `json:"safety_identifier"`
	PromptCacheKey     *string           `json:"prompt_cache_key"`
	ServiceTier        *string           `json:"service_tier"`
	Background         *bool             `json:"background"`
	Include            []string          `json:"include"`
	Conversation       json.RawMessage   `json:"conversation"`
	Prompt             json.RawMessage   `json:"prompt"`
	TopLogprobs        *int              `json:"top_logprobs"`
	MaxToolCalls       *int              `json:"max_tool_calls"`
	ContextManagement  json.RawMessage   `json:"context_management"`
	Moderation         json.RawMessage   `json:"moderation"`
	PromptCacheOptions json.RawMessage   `json:"prompt_cache_options"`
	PromptCacheRet     *string           `json:"prompt_cache_retention"`
}

// chatMsg is a chat completions message as the Responses API's items
// become: the body pdserve's chat path renders, and the conversation a
// stored response keeps for its continuation.
type chatMsg struct {
	Role       string         `json:"role"`
	Content    string         `json:"content"`
	Reasoning  string         `json:"reasoning_content,omitempty"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

// respRequest is a validated Responses API request: the chat body it
// becomes and what its Response object echoes.
type respRequest struct {
	stream bool
	store  bool
	// prevID is previous_response_id, "" when none; history the
	// conversation before this request (the previous response's, without
	// its instructions).
	prevID  string
	history []chatMsg
	// input are this request's messages (without instructions), items
	// its input items as the input_items route lists them.
	input []chatMsg
	items []json.RawMessage

	instructions *string
	maxOutput    *int
	temperature  float64
	topP         float64
	parallel     bool
	metadata     map[string]string
	toolChoice   json.RawMessage
	tools        []json.RawMessage
	textFormat   json.RawMessage
	truncation   string
	user         *string
	model        string
	// chat is the chat completions body.
	chat []byte
}

// parseResponses validates a Responses API body. prev loads the
// conversation of previous_response_id (nil: there is no store). The
// chat body holds everything the chat path checks itself (model, the
// sampling bounds, tools' schemas, the response format); what the
// Responses API has and chat lacks is checked here.
func parseResponses(data []byte, prev func(id string) ([]chatMsg, *apiError)) (*respRequest, *apiError) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil || fields == nil {
		return nil, badRequest("", "invalid_json", "The request body must be a JSON object.")
	}
	if aerr := checkKnown(fields, responsesParams, ""); aerr != nil {
		return nil, aerr
	}
	var b responsesBody
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, respTypeError(err)
	}
	rq := &respRequest{temperature: 1, topP: 1, parallel: true, truncation: "disabled", metadata: map[string]string{}}
	if aerr := b.checkUnsupported(); aerr != nil {
		return nil, aerr
	}
	rq.stream = b.Stream != nil && *b.Stream
	rq.store = b.Store == nil || *b.Store
	if !isAbsent(b.StreamOptions) && !rq.stream {
		return nil, badRequest("stream_options", "invalid_value", "stream_options is only allowed with stream: true")
	}
	if !isAbsent(b.StreamOptions) {
		var so map[string]json.RawMessage
		if err := json.Unmarshal(b.StreamOptions, &so); err != nil {
			return nil, badRequest("stream_options", "invalid_type", "stream_options must be an object")
		}
		for k, v := range so {
			if k != "include_obfuscation" {
				return nil, badRequest("stream_options."+k, "unknown_parameter", "Unrecognized request argument supplied: stream_options.%s", k)
			}
			var on bool
			if json.Unmarshal(v, &on) != nil || on {
				return nil, unsupported("stream_options.include_obfuscation", "stream_options.include_obfuscation must be false: pdserve does not pad its events")
			}
		}
	}
	if b.Truncation != nil {
		switch *b.Truncation {
		case "disabled":
		case "auto":
			return nil, unsupported("truncation", `truncation "auto" is not supported: a conversation over the context is a 400 (truncation "disabled")`)
		default:
			return nil, badRequest("truncation", "invalid_value", `truncation must be "auto" or "disabled", got %q`, *b.Truncation)
		}
	}
	if aerr := rq.parseMetadata(b.Metadata); aerr != nil {
		return nil, aerr
	}
	if b.Model != nil {
		rq.model = *b.Model
	}
	rq.instructions, rq.maxOutput, rq.user = b.Instructions, b.MaxOutputTokens, b.User
	if b.Temperature != nil {
		rq.temperature = *b.Temperature
	}
	if b.TopP != nil {
		rq.topP = *b.TopP
	}
	if b.ParallelToolCalls != nil {
		rq.parallel = *b.ParallelToolCalls
	}

	chat := map[string]any{"model": b.Model}
	if b.Model == nil {
		delete(chat, "model")
	}
	tools, aerr := respTools(b.Tools)
	if aerr != nil {
		return nil, aerr
	}
	rq.tools = b.Tools
	if rq.tools == nil {
		rq.tools = []json.RawMessage{}
	}
	if tools != nil {
		chat["tools"] = tools
	}
	rq.toolChoice = json.RawMessage(`"auto"`)
	if !isAbsent(b.ToolChoice) {
		tc, aerr := respToolChoice(b.ToolChoice)
		if aerr != nil {
			return nil, aerr
		}
		chat["tool_choice"] = tc
		rq.toolChoice = b.ToolChoice
	}
	if b.ParallelToolCalls != nil {
		chat["parallel_tool_calls"] = *b.ParallelToolCalls
	}
	rq.textFormat = json.RawMessage(`{"type":"text"}`)
	if !isAbsent(b.Text) {
		rf, aerr := respTextFormat(b.Text)
		if aerr != nil {
			return nil, aerr
		}
		if rf != nil {
			chat["response_format"] = rf.chat
			rq.textFormat = rf.echo
		}
	}
	if aerr := respReasoning(b.Reasoning); aerr != nil {
		return nil, aerr
	}
	for k, v := range map[string]any{"max_completion_tokens": b.MaxOutputTokens, "temperature": b.Temperature, "top_p": b.TopP,
		"user": b.User, "safety_identifier": b.SafetyIdentifier, "prompt_cache_key": b.PromptCacheKey, "service_tier": b.ServiceTier} {
		if !isNilPtr(v) {
			chat[k] = v
		}
	}
	if rq.stream {
		chat["stream"] = true
		chat["stream_options"] = map[string]bool{"include_usage": true}
	}

	if b.PreviousResponseID != nil && *b.PreviousResponseID != "" {
		if prev == nil {
			return nil, respNotFound("previous_response_id", *b.PreviousResponseID)
		}
		rq.prevID = *b.PreviousResponseID
		if rq.history, aerr = prev(rq.prevID); aerr != nil {
			return nil, aerr
		}
	}
	if rq.input, rq.items, aerr = respInput(b.Input); aerr != nil {
		return nil, aerr
	}
	var msgs []chatMsg
	if b.Instructions != nil && *b.Instructions != "" {
		msgs = append(msgs, chatMsg{Role: "system", Content: *b.Instructions})
	}
	msgs = append(msgs, rq.history...)
	msgs = append(msgs, rq.input...)
	chat["messages"] = msgs
	var err error
	if rq.chat, err = json.Marshal(chat); err != nil {
		return nil, badRequest("input", "invalid_value", "the request cannot be encoded: %v", err)
	}
	return rq, nil
}

func isNilPtr(v any) bool {
	switch p := v.(type) {
	case *int:
		return p == nil
	case *float64:
		return p == nil
	case *string:
		return p == nil
	}
	return v == nil
}

// respTypeError is the 400 of a parameter of the wrong JSON type.
func respTypeError(err error) *apiError {
	var te *json.UnmarshalTypeError
	if ok := asTypeError(err, &te); ok && te.Field != "" {
		return badRequest(te.Field, "invalid_type", "%s has the wrong type: got %s", te.Field, te.Value)
	}
	return badRequest("", "invalid_json", "The request body is not valid JSON: %v", err)
}

func asTypeError(err error, te **json.UnmarshalTypeError) bool {
	t, ok := err.(*json.UnmarshalTypeError)
	if ok {
		*te = t
	}
	return ok
}

// checkUnsupported refuses, naming it, each parameter pdserve cannot do
// as asked; their trivial values are accepted.
func (b *responsesBody) checkUnsupported() *apiError {
	switch {
	case b.Background != nil && *b.Background:
		return unsupported("background", "background is not supported: responses run while their request is open")
	case len(b.Include) > 0:
		return unsupported("include", "include is not supported: pdserve has no extra output to include (%s)", b.Include[0])
	case !isAbsent(b.Conversation):
		return unsupported("conversation", "conversation is not supported: continue with previous_response_id")
	case !isAbsent(b.Prompt):
		return unsupported("prompt", "prompt templates are not supported")
	case b.TopLogprobs != nil && *b.TopLogprobs != 0:
		return unsupported("top_logprobs", "top_logprobs is not supported on /v1/responses; use /v1/chat/completions")
	case b.MaxToolCalls != nil:
		return unsupported("max_tool_calls", "max_tool_calls is not supported: pdserve runs no built-in tools")
	case !isAbsent(b.ContextManagement):
		return unsupported("context_management", "context_management is not supported")
	case !isAbsent(b.Moderation):
		return unsupported("moderation", "moderation is not supported")
	case !isAbsent(b.PromptCacheOptions):
		return unsupported("prompt_cache_options", "prompt_cache_options is not supported: the router keeps prefixes by itself")
	case b.PromptCacheRet != nil && *b.PromptCacheRet != "in_memory":
		return unsupported("prompt_cache_retention", `prompt_cache_retention must be "in_memory": prefixes live in the workers' caches`)
	}
	return nil
}

func (rq *respRequest) parseMetadata(raw json.RawMessage) *apiError {
	if isAbsent(raw) {
		return nil
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		return badRequest("metadata", "invalid_type", "metadata must be an object of strings")
	}
	if len(m) > maxMetadataKeys {
		return badRequest("metadata", "invalid_value", "metadata has %d keys, more than %d", len(m), maxMetadataKeys)
	}
	for k, v := range m {
		if len(k) > maxMetadataKeyLen || len(v) > maxMetadataValueLen {
			return badRequest("metadata", "invalid_value", "metadata keys must be at most %d characters and values %d", maxMetadataKeyLen, maxMetadataValueLen)
		}
	}
	rq.metadata = m
	return nil
}

// respTools turns function tools {type, name, description, parameters,
// strict} into chat's tools; other tool types are refused.
func respTools(raw []json.RawMessage) ([]any, *apiError) {
	if raw == nil {
		return nil, nil
	}
	out := make([]any, 0, len(raw))
	for i, t := range raw {
		var f struct {
			Type        string          `json:"type"`
			Name        *string         `json:"name"`
			Description *string         `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		}
		param := fmt.Sprintf("tools[%d]", i)
		if err := json.Unmarshal(t, &f); err != nil {
			return nil, badRequest(param, "invalid_type", "%s must be a function tool {type, name, parameters}", param)
		}
		if f.Type != "function" {
			return nil, unsupported(param+".type", "%s.type %q is not supported: pdserve serves function tools only", param, f.Type)
		}
		if f.Name == nil {
			return nil, badRequest(param+".name", "missing_required_parameter", "%s.name is required", param)
		}
		fn := map[string]any{"name": *f.Name}
		if f.Description != nil {
			fn["description"] = *f.Description
		}
		if !isAbsent(f.Parameters) {
			fn["parameters"] = f.Parameters
		}
		if f.Strict != nil {
			fn["strict"] = *f.Strict
		}
		out = append(out, map[string]any{"type": "function", "function": fn})
	}
	return out, nil
}

// respToolChoice turns the Responses API's tool_choice into chat's.
func respToolChoice(raw json.RawMessage) (any, *apiError) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto", "required":
			return s, nil
		}
		return nil, badRequest("tool_choice", "invalid_value", `tool_choice must be "none", "auto", "required" or {"type": "function", "name"}, got %q`, s)
	}
	var o struct {
		Type string  `json:"type"`
		Name *string `json:"name"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, badRequest("tool_choice", "invalid_type", `tool_choice must be a string or {"type": "function", "name"}`)
	}
	if o.Type != "function" {
		return nil, unsupported("tool_choice.type", "tool_choice.type %q is not supported: pdserve serves function tools only", o.Type)
	}
	if o.Name == nil {
		return nil, badRequest("tool_choice.name", "missing_required_parameter", "tool_choice.name is required")
	}
	return map[string]any{"type": "function", "function": map[string]string{"name": *o.Name}}, nil
}

// textFormat is a text.format as chat's response_format and as the
// Response echoes it.
type textFormat struct {
	chat any
	echo json.RawMessage
}

// respTextFormat turns text {format, verbosity} into chat's
// response_format; nil for plain text.
func respTextFormat(raw json.RawMessage) (*textFormat, *apiError) {
	var t map[string]json.RawMessage
	if err := json.Unmarshal(raw, &t); err != nil || t == nil {
		return nil, badRequest("text", "invalid_type", "text must be an object {format}")
	}
	for k, v := range t {
		switch {
		case k == "format":
		case k == "verbosity":
			var s *string
			if json.Unmarshal(v, &s) != nil || s != nil && *s != "medium" {
				return nil, unsupported("text.verbosity", `text.verbosity is not supported: the model's length is not steered (only "medium")`)
			}
		default:
			return nil, badRequest("text."+k, "unknown_parameter", "Unrecognized request argument supplied: text.%s", k)
		}
	}
	if isAbsent(t["format"]) {
		return nil, nil
	}
	var f map[string]json.RawMessage
	if err := json.Unmarshal(t["format"], &f); err != nil || f == nil {
		return nil, badRequest("text.format", "invalid_type", "text.format must be an object {type}")
	}
	var typ string
	if err := json.Unmarshal(f["type"], &typ); err != nil {
		return nil, badRequest("text.format.type", "invalid_type", "text.format.type must be a string")
	}
	switch typ {
	case "text":
		return nil, nil
	case "json_object":
		return &textFormat{chat: map[string]string{"type": "json_object"}, echo: t["format"]}, nil
	case "json_schema":
		js := map[string]json.RawMessage{}
		for k, v := range f {
			switch k {
			case "type", "description":
			case "name", "schema", "strict":
				js[k] = v
			default:
				return nil, badRequest("text.format."+k, "unknown_parameter", "Unrecognized request argument supplied: text.format.%s", k)
			}
		}
		return &textFormat{chat: map[string]any{"type": "json_schema", "json_schema": js}, echo: t["format"]}, nil
	}
	return nil, badRequest("text.format.type", "invalid_value", `text.format.type must be "text", "json_object" or "json_schema", got %q`, typ)
}

// respReasoning accepts reasoning {effort, summary} only without a
// value that asks what pdserve cannot steer: the reasoning of a model
// that reasons is returned as reasoning items whatever it says.
func respReasoning(raw json.RawMessage) *apiError {
	if isAbsent(raw) {
		return nil
	}
	var r map[string]json.RawMessage
	if err := json.Unmarshal(raw, &r); err != nil || r == nil {
		return badRequest("reasoning", "invalid_type", "reasoning must be an object {effort, summary}")
	}
	for k, v := range r {
		switch k {
		case "effort", "summary", "generate_summary":
			if !isAbsent(v) {
				return unsupported("reasoning."+k, "reasoning.%s is not supported: the model's reasoning is not steered; a model that reasons returns reasoning items", k)
			}
		default:
			return badRequest("reasoning."+k, "unknown_parameter", "Unrecognized request argument supplied: reasoning.%s", k)
		}
	}
	return nil
}

// respInput turns input (a string, or a list of items: messages,
// function_call, function_call_output, reasoning) into chat messages,
// and returns the items as the input_items route lists them (each with
// an id).
func respInput(raw json.RawMessage) ([]chatMsg, []json.RawMessage, *apiError) {
	if isAbsent(raw) {
		return nil, nil, badRequest("input", "missing_required_parameter", "input is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		item, _ := json.Marshal(map[string]any{"id": "msg_" + newID(), "type": "message", "role": "user", "status": "completed",
			"content": []map[string]string{{"type": "input_text", "text": s}}})
		return []chatMsg{{Role: "user", Content: s}}, []json.RawMessage{item}, nil
	}
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, nil, badRequest("input", "invalid_type", "input must be a string or an array of input items")
	}
	if len(items) == 0 {
		return nil, nil, badRequest("input", "empty_prompt", "input must not be empty")
	}
	var msgs []chatMsg
	var out []json.RawMessage
	// lastAssistant returns the assistant message the calls and
	// reasoning of the items join (a new one when the last is not).
	lastAssistant := func() *chatMsg {
		if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
			return &msgs[n-1]
		}
		msgs = append(msgs, chatMsg{Role: "assistant"})
		return &msgs[len(msgs)-1]
	}
	for i, it := range items {
		param := fmt.Sprintf("input[%d]", i)
		if it == nil {
			return nil, nil, badRequest(param, "invalid_type", "%s must be an object", param)
		}
		typ := "message"
		if v, ok := it["type"]; ok {
			if err := json.Unmarshal(v, &typ); err != nil {
				return nil, nil, badRequest(param+".type", "invalid_type", "%s.type must be a string", param)
			}
		}
		str := func(name string, required bool) (string, *apiError) {
			var v string
			raw, ok := it[name]
			if !ok || isAbsent(raw) {
				if required {
					return "", badRequest(param+"."+name, "missing_required_parameter", "%s.%s is required", param, name)
				}
				return "", nil
			}
			if err := json.Unmarshal(raw, &v); err != nil {
				return "", badRequest(param+"."+name, "invalid_type", "%s.%s must be a string", param, name)
			}
			return v, nil
		}
		echo := map[string]any{}
		for k, v := range it {
			echo[k] = v
		}
		if _, ok := echo["id"]; !ok {
			prefix := map[string]string{"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}[typ]
			echo["id"] = prefix + newID()
		}
		if _, ok := echo["status"]; !ok && typ != "reasoning" {
			echo["status"] = "completed"
		}
		switch typ {
		case "message":
			role, aerr := str("role", true)
			if aerr != nil {
				return nil, nil, aerr
			}
			if !slices.Contains([]string{"user", "system", "developer", "assistant"}, role) {
				return nil, nil, badRequest(param+".role", "invalid_value", "%s.role must be user, system, developer or assistant, got %q", param, role)
			}
			text, aerr := respContent(it["content"], param+".content")
			if aerr != nil {
				return nil, nil, aerr
			}
			if role == "assistant" {
				if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" && msgs[n-1].Content == "" && len(msgs[n-1].ToolCalls) == 0 {
					msgs[n-1].Content = text // after its reasoning item
				} else {
					msgs = append(msgs, chatMsg{Role: role, Content: text})
				}
			} else {
				msgs = append(msgs, chatMsg{Role: role, Content: text})
			}
			if _, ok := it["type"]; !ok {
				echo["type"] = "message"
			}
			if s, ok := it["content"]; ok && json.Unmarshal(s, new(string)) == nil {
				kind := "input_text"
				if role == "assistant" {
					kind = "output_text"
				}
				echo["content"] = []map[string]string{{"type": kind, "text": text}}
			}
		case "function_call":
			name, aerr := str("name", true)
			if aerr != nil {
				return nil, nil, aerr
			}
			callID, aerr := str("call_id", true)
			if aerr != nil {
				return nil, nil, aerr
			}
			args, aerr := str("arguments", true)
			if aerr != nil {
				return nil, nil, aerr
			}
			a := lastAssistant()
			a.ToolCalls = append(a.ToolCalls, chatToolCall{ID: callID, Type: "function", Function: toolFunction{Name: name, Arguments: args}})
		case "function_call_output":
			callID, aerr := str("call_id", true)
			if aerr != nil {
				return nil, nil, aerr
			}
			text, aerr := respContent(it["output"], param+".output")
			if aerr != nil {
				return nil, nil, aerr
			}
			msgs = append(msgs, chatMsg{Role: "tool", Content: text, ToolCallID: callID})
		case "reasoning":
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if v, ok := it["content"]; ok && !isAbsent(v) {
				if err := json.Unmarshal(v, &parts); err != nil {
					return nil, nil, badRequest(param+".content", "invalid_type", "%s.content must be an array of {type: reasoning_text, text}", param)
				}
			}
			if v, ok := it["encrypted_content"]; ok && !isAbsent(v) {
				return nil, nil, unsupported(param+".encrypted_content", "%s.encrypted_content is not supported: pdserve returns its reasoning in the clear", param)
			}
			var b strings.Builder
			for _, p := range parts {
				b.WriteString(p.Text)
			}
			msgs = append(msgs, chatMsg{Role: "assistant", Reasoning: b.String()})
		default:
			return nil, nil, unsupported(param+".type", "input item type %q is not supported: pdserve takes messages, function_call, function_call_output and reasoning items", typ)
		}
		item, err := json.Marshal(echo)
		if err != nil {
			return nil, nil, badRequest(param, "invalid_value", "%s cannot be encoded", param)
		}
		out = append(out, item)
	}
	return msgs, out, nil
}

// respContent returns the text of a message's content: a string, or
// parts of type input_text, output_text (or text).
func respContent(raw json.RawMessage, param string) (string, *apiError) {
	if isAbsent(raw) {
		return "", badRequest(param, "missing_required_parameter", "%s is required", param)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest(param, "invalid_type", "%s must be a string or an array of content parts", param)
	}
	var b strings.Builder
	for i, p := range parts {
		var typ, text string
		_ = json.Unmarshal(p["type"], &typ)
		switch typ {
		case "input_text", "output_text", "text":
		case "refusal":
			if err := json.Unmarshal(p["refusal"], &text); err != nil {
				return "", badRequest(fmt.Sprintf("%s[%d].refusal", param, i), "invalid_type", "%s[%d].refusal must be a string", param, i)
			}
			b.WriteString(text)
			continue
		default:
			return "", unsupported(fmt.Sprintf("%s[%d].type", param, i), "content part type %q is not supported: pdserve serves text models", typ)
		}
		if err := json.Unmarshal(p["text"], &text); err != nil {
			return "", badRequest(fmt.Sprintf("%s[%d].text", param, i), "invalid_type", "%s[%d].text must be a string", param, i)
		}
		b.WriteString(text)
	}
	return b.String(), nil
}

// respNotFound is the 404 of a response id this key has no response of.
func respNotFound(param, id string) *apiError {
	return &apiError{status: http.StatusNotFound, Message: fmt.Sprintf("Response with id '%s' not found.", id),
		Type: "invalid_request_error", Param: ptr(param), Code: ptr("response_not_found")}
}

// respParam maps a chat parameter named in an error to the Responses
// API's.
func respParam(p string) string {
	switch {
	case p == "messages" || strings.HasPrefix(p, "messages["):
		return "input"
	case p == "max_completion_tokens" || p == "max_tokens":
		return "max_output_tokens"
	case p == "response_format" || strings.HasPrefix(p, "response_format."):
		return "text.format" + strings.TrimPrefix(strings.TrimPrefix(p, "response_format"), ".json_schema")
	case strings.HasPrefix(p, "tools["):
		return strings.Replace(p, ".function.", ".", 1)
	}
	return p
}
