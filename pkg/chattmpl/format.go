package chattmpl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/pdserve/pdserve/pkg/grammar"
)

// Format is a model's tool-call syntax.
type Format int

const (
	// FormatHermes: each call is <tool_call>\n{"name": …, "arguments":
	// {…}}\n</tool_call> (Hermes, Qwen 2.5 and 3). Templates that do not
	// render tools get them described in this format (Generic).
	FormatHermes Format = iota
	// FormatLlama3: the reply is a JSON object {"name": …, "parameters":
	// {…}} (Llama 3.1–3.3's JSON tool calling).
	FormatLlama3
	// FormatUnknown: the template renders tools in a syntax pdserve does
	// not parse (gemma 4's <|tool_call>call:…, Mistral's [TOOL_CALLS], …).
	FormatUnknown
)

func (f Format) String() string {
	switch f {
	case FormatHermes:
		return "hermes"
	case FormatLlama3:
		return "llama3-json"
	}
	return "unknown"
}

// detectFormat chooses the tool-call format from a template's text.
func detectFormat(src string) Format {
	switch {
	case strings.Contains(src, "<tool_call>"):
		return FormatHermes
	case strings.Contains(src, "<|start_header_id|>") && strings.Contains(src, `"parameters"`):
		return FormatLlama3
	case strings.Contains(src, "tools"):
		return FormatUnknown
	}
	return FormatHermes // Generic describes tools in Hermes' format
}

// Generic rewrites msgs for a template that knows no tools, as Qwen 2.5's
// template renders them: the tools are described, in Hermes' format,
// after the first system message's content (or in a system message of
// their own), an assistant's tool calls become <tool_call> blocks of its
// content, and tool results become user messages of <tool_response>
// blocks. Roles stay those of msgs otherwise. Without tools, only the
// history's calls and results are rewritten.
func Generic(msgs []Message, tools []Tool) []Message { return generic(msgs, tools, false) }

// generic is Generic; inUser puts the tools' description before the
// first user message's content instead, for templates that drop system
// messages (Phi-3's).
func generic(msgs []Message, tools []Tool, inUser bool) []Message {
	var sys strings.Builder
	sys.WriteString("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>")
	for _, t := range tools {
		sys.WriteString("\n")
		sys.Write(compactJSON(t.Raw))
	}
	sys.WriteString("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
	out := make([]Message, 0, len(msgs)+1)
	if len(tools) == 0 {
		sys.Reset() // only the history's calls and results become text
	} else if inUser {
		sys.WriteString("\n\n")
	} else if len(msgs) > 0 && (msgs[0].Role == "system" || msgs[0].Role == "developer") {
		m := msgs[0]
		m.Content += "\n\n" + sys.String()
		out = append(out, m)
		msgs = msgs[1:]
	} else if len(tools) > 0 {
		out = append(out, Message{Role: "system", Content: sys.String()})
	}
	for i := 0; i < len(msgs); i++ {
		m := msgs[i]
		switch {
		case m.Role == "assistant" && len(m.ToolCalls) > 0:
			var sb strings.Builder
			sb.WriteString(m.Content)
			for _, c := range m.ToolCalls {
				if sb.Len() > 0 {
					sb.WriteString("\n")
				}
				fmt.Fprintf(&sb, "<tool_call>\n{\"name\": %s, \"arguments\": %s}\n</tool_call>", quote(c.Name), argsText(c.Arguments))
			}
			out = append(out, Message{Role: "assistant", Content: sb.String()})
		case m.Role == "tool":
			// Consecutive tool results go into one user message.
			var sb strings.Builder
			for ; i < len(msgs) && msgs[i].Role == "tool"; i++ {
				if sb.Len() > 0 {
					sb.WriteString("\n")
				}
				sb.WriteString("<tool_response>\n" + msgs[i].Content + "\n</tool_response>")
			}
			i--
			out = append(out, Message{Role: "user", Content: sb.String()})
		case inUser && m.Role == "user" && sys.Len() > 0:
			out = append(out, Message{Role: m.Role, Content: sys.String() + m.Content, Name: m.Name})
			sys.Reset()
		default:
			out = append(out, Message{Role: m.Role, Content: m.Content, Name: m.Name})
		}
	}
	return out
}

// argsText is a call's arguments as JSON: compact when they are JSON, a
// JSON string of them otherwise.
func argsText(args string) string {
	if json.Valid([]byte(args)) {
		return string(compactJSON([]byte(args)))
	}
	return quote(args)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// compactJSON returns raw with Python json.dumps' separators (", ", ": ")
// and key order kept; raw as it is when it is not JSON.
func compactJSON(raw []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return raw
	}
	return pySeparators(buf.Bytes())
}

// pySeparators rewrites compact JSON with ", " and ": " between tokens
// (outside strings), as Python's json.dumps writes by default.
func pySeparators(b []byte) []byte {
	out := make([]byte, 0, len(b)+len(b)/8)
	inStr, esc := false, false
	for _, c := range b {
		out = append(out, c)
		switch {
		case inStr && esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case !inStr && (c == ',' || c == ':'):
			out = append(out, ' ')
		}
	}
	return out
}

// Grammar returns the GBNF grammar of tool calls for tool_choice
// "required" (names: every tool's) or a named function (names: that one),
// in the format f: Hermes' <tool_call> blocks, one or (parallel) more
// separated by a newline; Llama 3's JSON object, always one. Each call's
// arguments follow its tool's parameter schema (pkg/grammar). Errors: a
// schema keyword pkg/grammar does not support (*grammar.UnsupportedError
// wrapped with the tool's name), a name not among tools, FormatUnknown.
func Grammar(f Format, tools []Tool, names []string, parallel bool) (string, error) {
	var set grammar.SchemaSet
	var alts []string
	for _, name := range names {
		i := indexTool(tools, name)
		if i < 0 {
			return "", fmt.Errorf("chattmpl: no tool %q", name)
		}
		args, err := set.Add(tools[i].Parameters)
		if err != nil {
			return "", &ToolSchemaError{Tool: name, Err: err}
		}
		switch f {
		case FormatHermes:
			alts = append(alts, grammar.Literal(`{"name": `+quote(name)+`, "arguments": `)+" "+args+` "}"`)
		case FormatLlama3:
			alts = append(alts, grammar.Literal(`{"name": `+quote(name)+`, "parameters": `)+" "+args+` "}"`)
		default:
			return "", ErrUnknownFormat
		}
	}
	var root string
	switch f {
	case FormatHermes:
		root = "root ::= tool-call"
		if parallel {
			root += ` ( "\n" tool-call )*`
		}
		root += "\n" + `tool-call ::= "<tool_call>\n" ( ` + strings.Join(alts, " | ") + ` ) "\n</tool_call>"` + "\n"
	case FormatLlama3:
		root = "root ::= " + strings.Join(alts, " | ") + "\n"
	}
	return set.Rules() + root, nil
}

// ToolSchemaError is a tool's parameter schema that no grammar can be
// built from; Err is the *grammar.UnsupportedError, or the schema's
// syntax error.
type ToolSchemaError struct {
	Tool string
	Err  error
}

func (e *ToolSchemaError) Error() string {
	return fmt.Sprintf("chattmpl: tool %s: %v", e.Tool, e.Err)
}

func (e *ToolSchemaError) Unwrap() error { return e.Err }

func indexTool(tools []Tool, name string) int {
	for i, t := range tools {
		if t.Name == name {
			return i
		}
	}
	return -1
}
