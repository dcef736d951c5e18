package chattmpl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Message is one chat message as the template sees it.
type Message struct {
	Role    string // system, developer, user, assistant or tool
	Content string
	// Name is the message's optional "name"; ToolCallID a tool message's
	// "tool_call_id".
	Name       string
	ToolCallID string
	// ToolCalls are an assistant message's calls.
	ToolCalls []ToolCall
	// Reasoning is an assistant message's reasoning_content, "" when none
	// (templates drop it from earlier turns or render it, as they do).
	Reasoning string
}

// ToolCall is one call of a function, as OpenAI's tool_calls carry it.
type ToolCall struct {
	ID   string
	Name string
	// Arguments is the JSON text of the arguments (OpenAI sends them as a
	// string).
	Arguments string
}

// Tool is one function a request offers.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON Schema of the arguments ({"type":"object"}
	// when the request gave none).
	Parameters json.RawMessage
	// Raw is the tool object as the request gave it ({"type":"function",
	// "function":{…}}), rendered into the template in its key order.
	Raw json.RawMessage
}

// Template is a compiled chat template. Safe for concurrent use.
type Template struct {
	t        *jinja.Template
	bos, eos string
	format   Format
	// toolAware: the template renders the tools itself (it references
	// "tools"); else Render describes them in a system message.
	toolAware bool
	thinks    bool
}

// Compile compiles a model's Jinja chat template; bos and eos are the
// texts of its BOS and EOS tokens (bos_token, eos_token). Errors: the
// template does not parse with the Jinja engine.
func Compile(src, bos, eos string) (*Template, error) {
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("chattmpl: compile: %w", err)
	}
	tm := &Template{t: t, bos: bos, eos: eos, format: detectFormat(src), toolAware: strings.Contains(src, "tools"), thinks: strings.Contains(src, thinkOpen)}
	return tm, nil
}

// Format returns the tool-call format of the template's model.
func (t *Template) Format() Format { return t.format }

// Thinks reports whether the template emits <think>…</think> (a reasoning
// model's template).
func (t *Template) Thinks() bool { return t.thinks }

// Render renders msgs and tools (none: nil) and, with addGeneration,
// opens the assistant's reply. A template that does not render tools
// itself gets them described in a system message in Hermes' format
// (Generic), and then sees tool calls and tool results as text. Errors:
// the template's own (raise_exception, an undefined operation) and a
// template with tools whose tool-call format is FormatUnknown.
func (t *Template) Render(msgs []Message, tools []Tool, addGeneration bool) (string, error) {
	if len(tools) > 0 && t.format == FormatUnknown {
		return "", ErrUnknownFormat
	}
	data := map[string]jinja.Value{
		"bos_token":             jinja.NewString(t.bos),
		"eos_token":             jinja.NewString(t.eos),
		"add_generation_prompt": jinja.NewBool(addGeneration),
	}
	if len(tools) > 0 && !t.toolAware {
		out, err := t.render(data, generic(msgs, tools, false), nil)
		if err != nil || strings.Contains(out, "<tools>") {
			return out, err
		}
		// The template dropped the system message (Phi-3's does): the
		// tools go before the first user message's text instead.
		return t.render(data, generic(msgs, tools, true), nil)
	}
	return t.render(data, msgs, tools)
}

func (t *Template) render(data map[string]jinja.Value, msgs []Message, tools []Tool) (string, error) {
	mv := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		v, err := messageValue(m)
		if err != nil {
			return "", err
		}
		mv[i] = v
	}
	data["messages"] = jinja.NewList(mv)
	if len(tools) > 0 {
		tv := make([]jinja.Value, len(tools))
		for i, tl := range tools {
			v, err := jsonValue(tl.Raw)
			if err != nil {
				return "", fmt.Errorf("chattmpl: tool %s: %w", tl.Name, err)
			}
			tv[i] = v
		}
		data["tools"] = jinja.NewList(tv)
	}
	out, err := t.t.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("chattmpl: render: %w", err)
	}
	return out, nil
}

// ErrUnknownFormat: the template renders tools in a format pdserve does
// not parse.
var ErrUnknownFormat = errors.New("chattmpl: the chat template's tool-call format is not supported")

// messageValue is m as templates expect it: role, content, and
// tool_calls ({id, type, function: {name, arguments}}, arguments an
// object when they are a JSON object, as vLLM and HF templates expect),
// tool_call_id and name when set.
func messageValue(m Message) (jinja.Value, error) {
	v := jinja.NewDict()
	d := v.AsDict()
	d.Set("role", jinja.NewString(m.Role))
	d.Set("content", jinja.NewString(m.Content))
	if m.Name != "" {
		d.Set("name", jinja.NewString(m.Name))
	}
	if m.ToolCallID != "" {
		d.Set("tool_call_id", jinja.NewString(m.ToolCallID))
	}
	if m.Reasoning != "" {
		d.Set("reasoning_content", jinja.NewString(m.Reasoning))
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			args, err := jsonValue(json.RawMessage(c.Arguments))
			if err != nil || !args.IsDict() {
				args = jinja.NewString(c.Arguments)
			}
			fn := jinja.NewDict()
			fn.AsDict().Set("name", jinja.NewString(c.Name))
			fn.AsDict().Set("arguments", args)
			cv := jinja.NewDict()
			cv.AsDict().Set("id", jinja.NewString(c.ID))
			cv.AsDict().Set("type", jinja.NewString("function"))
			cv.AsDict().Set("function", fn)
			calls[i] = cv
		}
		d.Set("tool_calls", jinja.NewList(calls))
	}
	return v, nil
}

// jsonValue decodes a JSON text into a template value, objects keeping
// their key order (as Python's json does), integers as integers.
func jsonValue(raw json.RawMessage) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return jinja.Undefined(), errors.New("chattmpl: trailing data after JSON value")
	}
	return v, nil
}

// maxDepth bounds the nesting of a JSON value decoded for a template.
const maxDepth = 256

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxDepth {
		return jinja.Undefined(), errors.New("chattmpl: JSON nested too deeply")
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			v := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				k, _ := kt.(string)
				e, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				v.AsDict().Set(k, e)
			}
			_, err := dec.Token() // '}'
			return v, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				e, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, e)
			}
			_, err := dec.Token() // ']'
			return jinja.NewList(items), err
		}
		return jinja.Undefined(), errors.New("chattmpl: unexpected delimiter")
	default:
		return jinja.FromGoValue(t), nil
	}
}
