package chattmpl

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
)

const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"
	callOpen   = "<tool_call>"
	callClose  = "</tool_call>"
)

// Delta is what a Parser makes of new output text: answer text, reasoning
// text, and tool calls completed (their ID empty: the caller names them).
type Delta struct {
	Content   string
	Reasoning string
	Calls     []ToolCall
	// Cut is the call the reply ended inside, from Cut only (the reply was
	// cut by its token limit): its name when the name was written whole,
	// else "", and its arguments' JSON text as far as it goes.
	Cut *ToolCall
}

func (d *Delta) add(o Delta) {
	d.Content += o.Content
	d.Reasoning += o.Reasoning
	d.Calls = append(d.Calls, o.Calls...)
	if o.Cut != nil {
		d.Cut = o.Cut
	}
}

// parser states
const (
	stStart     = iota // nothing decided yet: leading <think>, Llama 3's JSON
	stReasoning        // inside <think>…</think>
	stAnswer           // after </think>: like stStart without <think>
	stContent          // answer text (Hermes: <tool_call> blocks within)
	stCall             // inside <tool_call>…</tool_call>
	stJSON             // Llama 3: a reply that may be a JSON tool call, held to its end
)

// Parser splits a chat reply, as it streams, into reasoning (a leading
// <think>…</think>, as DeepSeek-R1 and Qwen3 write it), answer text, and
// tool calls of the model's format. It holds back text that may still
// turn out to be markup (a partial <think>, </think> or <tool_call>; a
// Llama 3 reply that starts with "{" until its end), so a client never
// sees text that later becomes reasoning or a call. Not safe for
// concurrent use.
type Parser struct {
	format Format
	tools  bool
	state  int
	// pending is the text received and not yet handed out.
	pending string
	// trim: drop the whitespace that starts pending (after a call).
	trim bool
}

// NewParser returns a parser of a reply in format f; tools: parse tool
// calls (the request offered tools and tool_choice is not "none");
// inThink: the prompt opened <think> already (the reply starts inside the
// reasoning, as DeepSeek-R1's template does).
func NewParser(f Format, tools, inThink bool) *Parser {
	p := &Parser{format: f, tools: tools}
	if inThink {
		p.state = stReasoning
	}
	return p
}

// OpensThink reports whether a rendered prompt ends inside <think> (its
// last markup, spaces aside, is an open <think>).
func OpensThink(prompt string) bool {
	return strings.HasSuffix(strings.TrimRight(prompt, " \t\r\n"), thinkOpen)
}

// Push adds text and returns what is now final.
func (p *Parser) Push(text string) Delta {
	p.pending += text
	var d Delta
	for p.step(&d, false) {
	}
	return d
}

// Flush returns whatever is held back: the reply ended. A tool call that
// does not parse is handed out as content, as it was written.
func (p *Parser) Flush() Delta { return p.flush(false) }

// Cut is Flush for a reply cut by its token limit: a tool call it ended
// inside is handed out as Delta.Cut, as far as it goes, as OpenAI hands
// out a call cut by max_tokens, instead of as content.
func (p *Parser) Cut() Delta { return p.flush(true) }

func (p *Parser) flush(cut bool) Delta {
	var d Delta
	for p.step(&d, true) {
	}
	switch p.state {
	case stStart, stAnswer, stContent:
		d.Content += p.pending
	case stReasoning:
		d.Reasoning += p.pending
	case stCall:
		body := p.pending
		if cut {
			body = body[:len(body)-heldPrefix(body, callClose)]
		}
		c, ok := parseCall(body, "arguments")
		switch {
		case ok:
			d.Calls = append(d.Calls, c)
		case cut:
			c := partialCall(body, "arguments")
			d.Cut = &c
		default:
			d.Content += callOpen + p.pending
		}
	case stJSON:
		calls, rest, ok := jsonCalls(p.pending)
		switch {
		case ok && rest == "":
			d.Calls = append(d.Calls, calls...)
		case ok && cut:
			c := partialCall(rest, "parameters")
			d.Calls, d.Cut = append(d.Calls, calls...), &c
		default:
			d.Content += p.pending
		}
	}
	p.pending = ""
	p.state = stContent
	return d
}

// step makes one transition on pending and reports whether another may
// follow. end: no more text comes.
func (p *Parser) step(d *Delta, end bool) bool {
	if p.trim {
		p.pending = strings.TrimLeft(p.pending, " \t\r\n")
		if p.pending == "" {
			return false
		}
		p.trim = false
	}
	switch p.state {
	case stStart, stAnswer:
		s := strings.TrimLeft(p.pending, " \t\r\n")
		switch {
		case s == "" && !end:
			return false // only whitespace yet: it may lead a call
		case p.state == stStart && strings.HasPrefix(s, thinkOpen):
			p.pending, p.state = s[len(thinkOpen):], stReasoning
		case p.state == stStart && strings.HasPrefix(thinkOpen, s) && !end:
			return false
		case p.tools && p.format == FormatHermes && strings.HasPrefix(callOpen, s) && !end:
			return false
		case p.tools && p.format == FormatLlama3 && strings.HasPrefix(s, "{"):
			p.pending, p.state = s, stJSON
			return false
		case p.tools && p.format == FormatHermes && strings.HasPrefix(s, callOpen):
			p.pending, p.state = s, stContent
		default:
			p.state = stContent
		}
		return true
	case stReasoning:
		if i := strings.Index(p.pending, thinkClose); i >= 0 {
			d.Reasoning += p.pending[:i]
			p.pending, p.state = p.pending[i+len(thinkClose):], stAnswer
			return true
		}
		n := len(p.pending) - heldPrefix(p.pending, thinkClose)
		d.Reasoning += p.pending[:n]
		p.pending = p.pending[n:]
		return false
	case stContent:
		if !p.tools || p.format != FormatHermes {
			d.Content += p.pending
			p.pending = ""
			return false
		}
		if i := strings.Index(p.pending, callOpen); i >= 0 {
			d.Content += p.pending[:i]
			p.pending, p.state = p.pending[i+len(callOpen):], stCall
			return true
		}
		n := len(p.pending) - heldPrefix(p.pending, callOpen)
		d.Content += p.pending[:n]
		p.pending = p.pending[n:]
		return false
	case stCall:
		i := strings.Index(p.pending, callClose)
		if i < 0 {
			return false
		}
		body := p.pending[:i]
		if c, ok := parseCall(body, "arguments"); ok {
			d.Calls = append(d.Calls, c)
			p.trim = true
		} else {
			d.Content += callOpen + body + callClose
		}
		p.pending, p.state = p.pending[i+len(callClose):], stContent
		return true
	}
	return false // stJSON: held to the end
}

// heldPrefix returns the length of the longest suffix of s that is a
// proper prefix of tag.
func heldPrefix(s, tag string) int {
	for k := min(len(tag)-1, len(s)); k > 0; k-- {
		if strings.HasSuffix(s, tag[:k]) {
			return k
		}
	}
	return 0
}

// parseCall parses one call's JSON, {"name": …, argsKey: {…}} (Hermes:
// "arguments"; Llama 3: "parameters", or "arguments"). The arguments
// become compact JSON text; a string of JSON is taken as that text.
func parseCall(text, argsKey string) (ToolCall, bool) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(strings.TrimSpace(text)), &obj); err != nil {
		return ToolCall{}, false
	}
	return callOf(obj, argsKey)
}

func callOf(obj map[string]json.RawMessage, argsKey string) (ToolCall, bool) {
	var name string
	if err := json.Unmarshal(obj["name"], &name); err != nil || name == "" {
		return ToolCall{}, false
	}
	raw, ok := obj[argsKey]
	if !ok {
		raw, ok = obj["arguments"]
	}
	args := "{}"
	if ok {
		var s string
		var buf bytes.Buffer
		switch {
		case json.Unmarshal(raw, &s) == nil:
			args = s
		case json.Compact(&buf, raw) == nil && bytes.HasPrefix(buf.Bytes(), []byte("{")):
			args = buf.String()
		default:
			return ToolCall{}, false
		}
	}
	return ToolCall{Name: name, Arguments: args}, true
}

// jsonCalls parses a Llama 3 reply that is one or more JSON calls
// ({"name", "parameters"}), separated by ";" or whitespace. ok: the
// reply is calls, rest "" when all of them are whole; else rest is the
// text of the last, which does not end (a reply cut inside it). A reply
// with anything else is not calls.
func jsonCalls(text string) (calls []ToolCall, rest string, ok bool) {
	rest = text
	for {
		rest = strings.TrimLeft(rest, " \t\r\n")
		if len(calls) > 0 && strings.HasPrefix(rest, ";") {
			rest = strings.TrimLeft(rest[1:], " \t\r\n")
		}
		if rest == "" {
			break
		}
		dec := json.NewDecoder(strings.NewReader(rest))
		var obj map[string]json.RawMessage
		if err := dec.Decode(&obj); err != nil {
			var se *json.SyntaxError
			if errors.As(err, &se) || !strings.HasPrefix(rest, "{") {
				return nil, "", false
			}
			return calls, rest, true // io.ErrUnexpectedEOF: it does not end
		}
		c, ok := callOf(obj, "parameters")
		if !ok {
			return nil, "", false
		}
		calls = append(calls, c)
		rest = rest[dec.InputOffset():]
	}
	return calls, "", len(calls) > 0
}

// partialCall reads what a call's JSON that does not end, {"name": …,
// argsKey: {…, holds: the name when its string is whole, and the text of
// the arguments as far as they go (compact JSON when they are whole).
func partialCall(text, argsKey string) ToolCall {
	var c ToolCall
	dec := json.NewDecoder(strings.NewReader(text))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return c
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return c
		}
		key, _ := t.(string)
		args := key == argsKey || key == "arguments"
		off := dec.InputOffset()
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if args {
				rest := strings.TrimLeft(text[off:], " \t\r\n")
				c.Arguments = strings.TrimLeft(strings.TrimPrefix(rest, ":"), " \t\r\n")
			}
			return c
		}
		switch {
		case key == "name":
			_ = json.Unmarshal(raw, &c.Name)
		case args:
			var buf bytes.Buffer
			if json.Compact(&buf, raw) == nil {
				c.Arguments = buf.String()
			}
		}
	}
	return c
}
