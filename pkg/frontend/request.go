package frontend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/pdserve/pdserve/pkg/engine"
)

// completionBody is the JSON body of /v1/completions and
// /v1/chat/completions (the fields pdserve reads; others are ignored).
type completionBody struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`   // completions
	Messages            json.RawMessage `json:"messages"` // chat
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"` // chat alias
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	N                   *int            `json:"n"`
	BestOf              *int            `json:"best_of"`
	Echo                bool            `json:"echo"`
	Suffix              *string         `json:"suffix"`
	Logprobs            json.RawMessage `json:"logprobs"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	IgnoreEOS bool `json:"ignore_eos"`
	// ReturnTokenIDs adds the output token ids to each choice (vLLM's
	// return_token_ids extension).
	ReturnTokenIDs bool `json:"return_token_ids"`
}

// parseBody decodes body strictly enough to report type errors.
func parseBody(data []byte) (*completionBody, *apiError) {
	var b completionBody
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&b); err != nil {
		return nil, badRequest("", "invalid_json", "malformed JSON body: %v", err)
	}
	if dec.More() {
		return nil, badRequest("", "invalid_json", "malformed JSON body: data after the JSON object")
	}
	return &b, nil
}

// checkOptions rejects options pdserve does not support.
func (b *completionBody) checkOptions() *apiError {
	switch {
	case b.N != nil && *b.N != 1:
		return badRequest("n", "unsupported_value", "n must be 1 (got %d): pdserve returns one choice per request", *b.N)
	case b.BestOf != nil && *b.BestOf != 1:
		return badRequest("best_of", "unsupported_value", "best_of must be 1 (got %d)", *b.BestOf)
	case b.Echo:
		return badRequest("echo", "unsupported_value", "echo is not supported")
	case b.Suffix != nil && *b.Suffix != "":
		return badRequest("suffix", "unsupported_value", "suffix is not supported")
	case !isAbsent(b.Logprobs) && !bytes.Equal(bytes.TrimSpace(b.Logprobs), []byte("false")) && !bytes.Equal(bytes.TrimSpace(b.Logprobs), []byte("0")):
		return badRequest("logprobs", "unsupported_value", "logprobs are not supported")
	case b.StreamOptions != nil && !b.Stream:
		return badRequest("stream_options", "invalid_value", "stream_options is only allowed with stream: true")
	case b.Temperature != nil && (*b.Temperature < 0 || *b.Temperature > 2):
		return badRequest("temperature", "invalid_value", "temperature must be in [0, 2], got %v", *b.Temperature)
	case b.TopP != nil && (*b.TopP <= 0 || *b.TopP > 1):
		return badRequest("top_p", "invalid_value", "top_p must be in (0, 1], got %v", *b.TopP)
	}
	return nil
}

// maxStops is the most stop strings a request may give (as OpenAI).
const maxStops = 4

// stops returns the stop strings, dropping empty ones.
func (b *completionBody) stops() ([]string, *apiError) {
	if isAbsent(b.Stop) {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(b.Stop, &one); err == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(b.Stop, &many); err != nil {
		return nil, badRequest("stop", "invalid_type", "stop must be a string or an array of strings")
	}
	if len(many) > maxStops {
		return nil, badRequest("stop", "invalid_value", "at most %d stop strings are allowed, got %d", maxStops, len(many))
	}
	out := many[:0]
	for _, s := range many {
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

// promptTokens returns the tokens of a completions prompt: text is
// tokenized with encode, ids are checked against vocab.
func (b *completionBody) promptTokens(encode func(string) []int32, vocab int) ([]int32, *apiError) {
	if isAbsent(b.Prompt) {
		return nil, badRequest("prompt", "missing_prompt", "prompt is required")
	}
	var text string
	if err := json.Unmarshal(b.Prompt, &text); err == nil {
		return nonEmpty(encode(text))
	}
	var ids []int32
	if err := json.Unmarshal(b.Prompt, &ids); err == nil {
		return checkIDs(ids, vocab)
	}
	var texts []string
	if err := json.Unmarshal(b.Prompt, &texts); err == nil {
		if len(texts) != 1 {
			return nil, batchError(len(texts))
		}
		return nonEmpty(encode(texts[0]))
	}
	var idLists [][]int32
	if err := json.Unmarshal(b.Prompt, &idLists); err == nil {
		if len(idLists) != 1 {
			return nil, batchError(len(idLists))
		}
		return checkIDs(idLists[0], vocab)
	}
	return nil, badRequest("prompt", "invalid_type", "prompt must be a string or an array of token ids (int32)")
}

func batchError(n int) *apiError {
	return badRequest("prompt", "unsupported_value", "batched prompts are not supported (got %d prompts): send one prompt per request", n)
}

func nonEmpty(ids []int32) ([]int32, *apiError) {
	if len(ids) == 0 {
		return nil, badRequest("prompt", "empty_prompt", "prompt must not be empty")
	}
	return ids, nil
}

func checkIDs(ids []int32, vocab int) ([]int32, *apiError) {
	if len(ids) == 0 {
		return nil, badRequest("prompt", "empty_prompt", "prompt must not be empty")
	}
	for i, id := range ids {
		if id < 0 || int(id) >= vocab {
			return nil, badRequest("prompt", "invalid_token", "prompt token %d at index %d is outside the vocabulary [0, %d)", id, i, vocab)
		}
	}
	return ids, nil
}

// chatMessage is one message of a chat request.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// chatMessages returns the validated messages of a chat request, their
// content flattened to text.
func (b *completionBody) chatMessages() ([]engine.ChatMessage, *apiError) {
	if isAbsent(b.Messages) {
		return nil, badRequest("messages", "missing_messages", "messages is required")
	}
	var msgs []chatMessage
	if err := json.Unmarshal(b.Messages, &msgs); err != nil {
		return nil, badRequest("messages", "invalid_type", "messages must be an array of {role, content} objects: %v", err)
	}
	if len(msgs) == 0 {
		return nil, badRequest("messages", "empty_prompt", "messages must not be empty")
	}
	out := make([]engine.ChatMessage, len(msgs))
	for i, m := range msgs {
		if !chatRoles[m.Role] {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "invalid_value", "unknown role %q (want system, developer, user, assistant or tool)", m.Role)
		}
		content, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "invalid_type", "%v", err)
		}
		out[i] = engine.ChatMessage{Role: m.Role, Content: content}
	}
	return out, nil
}

// renderChat renders msgs with the tokenizer's own chat template when it
// has one (engine.ChatTemplater), else with the byte-level template of the
// package doc. A template that cannot render msgs is a 400 whose message
// holds none of the template's error text (the request log has it).
func renderChat(tok engine.Tokenizer, msgs []engine.ChatMessage) (string, *apiError) {
	if ct, ok := tok.(engine.ChatTemplater); ok {
		text, err := ct.ApplyChatTemplate(msgs)
		if err != nil {
			e := badRequest("messages", "chat_template_error", "the model's chat template cannot render these messages")
			e.cause = err
			return "", e
		}
		return text, nil
	}
	var sb strings.Builder
	for _, m := range msgs {
		sb.WriteString("<|" + m.Role + "|>\n")
		sb.WriteString(m.Content)
		sb.WriteString("\n")
	}
	sb.WriteString("<|assistant|>\n")
	return sb.String(), nil
}

// messageText returns a message's text content: a string, or the text
// parts of an array joined.
func messageText(raw json.RawMessage) (string, error) {
	if isAbsent(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("content must be a string or an array of text parts")
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part type %q is not supported (text only)", p.Type)
		}
		sb.WriteString(p.Text)
	}
	return sb.String(), nil
}

// isAbsent reports whether a raw field was missing or null.
func isAbsent(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}
