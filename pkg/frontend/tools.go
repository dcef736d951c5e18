package frontend

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/chattmpl"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
)

// Tool choices.
const (
	choiceNone     = "none"
	choiceAuto     = "auto"
	choiceRequired = "required"
	choiceFunction = "function" // a named function: params.toolName
)

// jinjaTokenizer is a tokenizer that carries its model's Jinja chat
// template (llamacpp.Tokenizer: the GGUF's tokenizer.chat_template).
type jinjaTokenizer interface {
	ChatTemplate() string
	// TokenText is a token's text with special tokens written out.
	TokenText(id int32) string
	AddsBOS() bool
	BOS() int32
}

// toolsOf validates a request's tools: each {"type": "function",
// "function": {"name", "description", "parameters", "strict"}}.
func toolsOf(raw []json.RawMessage) ([]chattmpl.Tool, *apiError) {
	tools := make([]chattmpl.Tool, 0, len(raw))
	seen := map[string]bool{}
	for i, r := range raw {
		param := fmt.Sprintf("tools[%d]", i)
		var t struct {
			Type     *string         `json:"type"`
			Function json.RawMessage `json:"function"`
		}
		if err := json.Unmarshal(r, &t); err != nil || isAbsent(r) {
			return nil, badRequest(param, "invalid_type", "%s must be an object", param)
		}
		if t.Type == nil || *t.Type != "function" {
			return nil, unsupported(param+".type", `%s.type must be "function"`, param)
		}
		var fn struct {
			Name        *string         `json:"name"`
			Description *string         `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		}
		if err := json.Unmarshal(t.Function, &fn); err != nil || isAbsent(t.Function) {
			return nil, badRequest(param+".function", "invalid_type", "%s.function must be an object with name, description, parameters and strict", param)
		}
		if fn.Name == nil || !validSchemaName(*fn.Name) {
			return nil, badRequest(param+".function.name", "invalid_value", "%s.function.name must be 1 to 64 letters, digits, _ or -", param)
		}
		if seen[*fn.Name] {
			return nil, badRequest(param+".function.name", "invalid_value", "%s.function.name %q is given twice", param, *fn.Name)
		}
		seen[*fn.Name] = true
		params := fn.Parameters
		if isAbsent(params) {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		} else if !strings.HasPrefix(strings.TrimSpace(string(params)), "{") {
			return nil, badRequest(param+".function.parameters", "invalid_type", "%s.function.parameters must be a JSON Schema object", param)
		}
		tl := chattmpl.Tool{Name: *fn.Name, Parameters: params, Raw: r}
		if fn.Description != nil {
			tl.Description = *fn.Description
		}
		tools = append(tools, tl)
	}
	return tools, nil
}

// toolChoice validates tool_choice against the tools: "none", "auto"
// (the default with tools), "required", or {"type": "function",
// "function": {"name"}} naming one of them. It returns the choice and
// the function's name.
func toolChoice(raw json.RawMessage, tools []chattmpl.Tool) (string, string, *apiError) {
	if isAbsent(raw) {
		if len(tools) == 0 {
			return choiceNone, "", nil
		}
		return choiceAuto, "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		switch s {
		case choiceNone, choiceAuto, choiceRequired:
		default:
			return "", "", badRequest("tool_choice", "invalid_value", `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": …}}, got %q`, s)
		}
		if len(tools) == 0 && s == choiceRequired {
			return "", "", badRequest("tool_choice", "invalid_value", "tool_choice %q is only allowed when tools are specified", s)
		}
		if len(tools) == 0 {
			return choiceNone, "", nil
		}
		return s, "", nil
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
		return "", "", badRequest("tool_choice", "invalid_type", `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": …}}`)
	}
	for _, t := range tools {
		if t.Name == named.Function.Name {
			return choiceFunction, t.Name, nil
		}
	}
	return "", "", badRequest("tool_choice", "invalid_value", "tool_choice names function %q, which is not among the tools", named.Function.Name)
}

// toolCallsOf validates an assistant message's tool_calls: [{id, type
// "function", function: {name, arguments}}].
func toolCallsOf(raw json.RawMessage, i int) ([]chattmpl.ToolCall, *apiError) {
	param := fmt.Sprintf("messages[%d].tool_calls", i)
	var calls []struct {
		ID       string  `json:"id"`
		Type     *string `json:"type"`
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &calls); err != nil {
		return nil, badRequest(param, "invalid_type", "%s must be an array of {id, type, function: {name, arguments}}", param)
	}
	out := make([]chattmpl.ToolCall, len(calls))
	for j, c := range calls {
		if c.Type != nil && *c.Type != "function" || c.Function.Name == "" {
			return nil, badRequest(fmt.Sprintf("%s[%d]", param, j), "invalid_value", `%s[%d] must be of type "function" with a function name`, param, j)
		}
		args := "{}"
		if !isAbsent(c.Function.Arguments) {
			if err := json.Unmarshal(c.Function.Arguments, &args); err != nil {
				args = string(c.Function.Arguments) // an object, as some clients send
			}
		}
		out[j] = chattmpl.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: args}
	}
	return out, nil
}

// rendered is a chat rendered for the model, with what parsing its reply
// needs.
type rendered struct {
	text   string
	format chattmpl.Format
	// inThink: the prompt opened <think> (the reply starts in reasoning).
	inThink bool
}

// chatTemplate returns the tokenizer's Jinja template compiled once, nil
// when it has none or the Jinja engine cannot compile it (a warning is
// logged once; llama_chat_apply_template renders instead).
func (s *Server) chatTemplate() *chattmpl.Template {
	s.tmplOnce.Do(func() {
		jt, ok := s.o.Tokenizer.(jinjaTokenizer)
		if !ok || jt.ChatTemplate() == "" {
			return
		}
		bos, eos := specialTexts(jt, s.o.Tokenizer)
		t, err := chattmpl.Compile(jt.ChatTemplate(), bos, eos)
		if err != nil {
			s.o.Logger.Warn("the model's chat template does not compile as Jinja: llama.cpp's built-in templates render chats (no tools)", zap.Error(err))
			return
		}
		s.tmpl, s.tmplBOS = t, bos
		if !jt.AddsBOS() {
			s.tmplBOS = ""
		}
	})
	return s.tmpl
}

// specialTexts are the texts of the BOS and EOS tokens of a tokenizer
// that writes special tokens out, the bos_token and eos_token of its
// template ("" for a token it has not).
func specialTexts(jt jinjaTokenizer, tok engine.Tokenizer) (bos, eos string) {
	if id := tok.EOS(); id >= 0 {
		eos = jt.TokenText(id)
	}
	if id := jt.BOS(); id >= 0 {
		bos = jt.TokenText(id)
	}
	return bos, eos
}

// compileOverride compiles Options.ChatTemplate as the template of every
// chat (chatTemplate then returns it): bos_token and eos_token are the
// tokenizer's where it writes special tokens out, else empty (the
// byte-level tokenizer has no text for them).
func (s *Server) compileOverride() error {
	var bos, eos string
	jt, ok := s.o.Tokenizer.(jinjaTokenizer)
	if ok {
		bos, eos = specialTexts(jt, s.o.Tokenizer)
	}
	t, err := chattmpl.Compile(s.o.ChatTemplate, bos, eos)
	if err != nil {
		return fmt.Errorf("frontend: chat template: %w", err)
	}
	s.tmplOnce.Do(func() {
		s.tmpl = t
		if ok && jt.AddsBOS() {
			s.tmplBOS = bos
		}
	})
	return nil
}

// renderChat renders p's messages (and its tools unless tool_choice is
// "none") with the model's Jinja template when the Jinja engine compiles
// it; else with the tokenizer's own template (engine.ChatTemplater,
// llama_chat_apply_template) or the byte-level template of the package
// doc, tools then described in Hermes' format (chattmpl.Generic). A
// template that cannot render the messages is a 400 whose message holds
// none of the template's error text (the request log has it).
func (s *Server) renderChat(p *params) (rendered, *apiError) {
	var tools []chattmpl.Tool
	if p.toolChoice != choiceNone {
		tools = p.tools
	}
	if t := s.chatTemplate(); t != nil {
		text, err := t.Render(p.msgs, tools, true)
		switch {
		case errors.Is(err, chattmpl.ErrUnknownFormat):
			return rendered{}, unsupported("tools", "tools are not supported for this model: its chat template writes tool calls in a format pdserve does not parse")
		case err != nil:
			e := badRequest("messages", "chat_template_error", "the model's chat template cannot render these messages")
			e.cause = err
			return rendered{}, e
		}
		// The tokenizer adds BOS itself: a template's bos_token would
		// double it (llama-server strips it likewise).
		if s.tmplBOS != "" {
			text = strings.TrimPrefix(text, s.tmplBOS)
		}
		return rendered{text: text, format: t.Format(), inThink: chattmpl.OpensThink(text)}, nil
	}
	msgs := p.msgs
	if len(tools) > 0 || hasToolTurns(msgs) {
		msgs = chattmpl.Generic(msgs, tools)
	}
	flat := make([]engine.ChatMessage, len(msgs))
	for i, m := range msgs {
		flat[i] = engine.ChatMessage{Role: m.Role, Content: m.Content}
	}
	text, aerr := renderFlat(s.o.Tokenizer, flat)
	return rendered{text: text, format: chattmpl.FormatHermes, inThink: chattmpl.OpensThink(text)}, aerr
}

// hasToolTurns reports whether msgs hold tool calls or tool results.
func hasToolTurns(msgs []chattmpl.Message) bool {
	for _, m := range msgs {
		if m.Role == "tool" || len(m.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// toolGrammar returns the grammar of tool_choice "required" or a named
// function in the model's format (one call when parallel_tool_calls is
// false), "" for other choices. A parameter schema pkg/grammar does not
// support is a 400 unsupported_value naming the tool and the keyword.
func toolGrammar(p *params, f chattmpl.Format) (string, *apiError) {
	var names []string
	switch p.toolChoice {
	case choiceRequired:
		for _, t := range p.tools {
			names = append(names, t.Name)
		}
	case choiceFunction:
		names = []string{p.toolName}
	default:
		return "", nil
	}
	g, err := chattmpl.Grammar(f, p.tools, names, p.parallel)
	if err == nil {
		// The tools' schemas together, and the call syntax around them.
		_, err = grammar.Check(g, grammar.Limits{})
	}
	var se *chattmpl.ToolSchemaError
	var u *grammar.UnsupportedError
	var le *grammar.LimitError
	switch {
	case errors.As(err, &le) && errors.As(err, &se):
		return "", schemaLimit("tools", "tools: function "+se.Tool+": parameters", le)
	case errors.As(err, &le):
		return "", schemaLimit("tools", "tools: the grammar of the tool calls", le)
	case errors.As(err, &u) && errors.As(err, &se):
		return "", unsupported("tools", "tools: function %s: parameters keyword %s at %q is not supported with tool_choice %q", se.Tool, u.Keyword, "#"+u.Path, p.toolChoice)
	case errors.As(err, &se):
		return "", badRequest("tools", "invalid_value", "tools: function %s: parameters must be a JSON Schema object", se.Tool)
	case err != nil:
		return "", unsupported("tool_choice", "tool_choice %q is not supported for this model's tool-call format", p.toolChoice)
	}
	return g, nil
}
