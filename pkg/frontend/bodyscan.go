package frontend

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"unicode/utf8"
)

// The bounds of a request body, checked before anything of it is
// decoded: scanBody reads the body once, without allocating, and counts
// the elements of every array and the members of every object against
// bodyLimits. A body over a bound is refused as soon as the scan reaches
// the element that exceeds it, so that what decoding then materializes is
// bounded by the served models' context length × the batch limit (token
// ids), not by the body's size: see "Memory per request" in the package
// doc.

// maxElems is the most elements of an array or members of an object of a
// body other than the prompt and the messages: far above what any
// parameter takes (stop takes 4, metadata 16).
const maxElems = 4096

// defaultMaxPrompts is the most prompts of a batched /v1/completions
// request when the server admits any number of requests at once
// (Options.MaxInFlight ≤ 0), as OpenAI's limit on a prompt array.
const defaultMaxPrompts = 2048

// bodyLimits bound the containers of a request body.
type bodyLimits struct {
	// promptIDs is the most token ids of one prompt (the longest context
	// of the served models); 0: no bound but the body's size.
	promptIDs int
	// prompts is the most prompts of a batch (> 0).
	prompts int
	// messages is the most chat messages (each renders to one token at
	// least: the longest context); 0: no bound but the body's size.
	messages int
}

// bodyLimits returns the bounds of a body for the models served now.
func (s *Server) bodyLimits(models []Model) bodyLimits {
	lim := bodyLimits{prompts: defaultMaxPrompts}
	if s.o.MaxInFlight > 0 {
		lim.prompts = s.o.MaxInFlight
	}
	for _, m := range models {
		if m.MaxModelLen <= 0 {
			// A model of unknown context: only the body bounds it.
			return bodyLimits{prompts: lim.prompts}
		}
		lim.promptIDs = max(lim.promptIDs, m.MaxModelLen)
	}
	lim.messages = lim.promptIDs
	return lim
}

// scanFrame is an open array or object of scanBody.
type scanFrame struct {
	obj     bool
	wantKey bool // an object expects a key next
	n       int  // elements or members so far
	max     int  // 0: no bound
	// kind says which bound applies: "prompt" (the top-level prompt, a
	// flat array of ids or a batch, decided by its first element),
	// "prompt ids" (a prompt of a batch), "messages", or "" (maxElems).
	kind string
}

// scanBody checks the element counts of data against lim and returns the
// 400 of the first container over its bound, nil otherwise. It stops
// without an error on malformed JSON: decoding reports that.
func scanBody(data []byte, lim bodyLimits) *apiError {
	var st []scanFrame
	key := "" // the member of the top-level object being read
	// value is called at the start of each value, c its first byte.
	value := func(c byte) *apiError {
		if len(st) == 0 {
			return nil
		}
		f := &st[len(st)-1]
		if f.obj {
			return nil // members are counted at their keys
		}
		if f.kind == "prompt" && f.n == 0 {
			if c == '[' || c == '"' {
				f.max, f.kind = lim.prompts, "prompts"
			} else {
				f.max, f.kind = lim.promptIDs, "prompt ids"
			}
		}
		f.n++
		if f.max > 0 && f.n > f.max {
			return scanOver(st, key)
		}
		return nil
	}
	for i := 0; i < len(data); {
		switch c := data[i]; c {
		case ' ', '\t', '\n', '\r', ':':
			i++
		case ',':
			if len(st) > 0 && st[len(st)-1].obj {
				st[len(st)-1].wantKey = true
			}
			i++
		case '"':
			j := stringEnd(data, i)
			if j < 0 {
				return nil
			}
			if top := len(st) - 1; top >= 0 && st[top].obj && st[top].wantKey {
				f := &st[top]
				f.wantKey = false
				f.n++
				if f.n > f.max {
					return scanOver(st, key)
				}
				if top == 0 {
					key = string(data[i+1 : j-1])
				}
			} else if aerr := value(c); aerr != nil {
				return aerr
			}
			i = j
		case '{', '[':
			if aerr := value(c); aerr != nil {
				return aerr
			}
			f := scanFrame{obj: c == '{', wantKey: c == '{', max: maxElems}
			switch {
			case len(st) == 1 && key == "prompt" && c == '[':
				f.kind, f.max = "prompt", 0 // decided by the first element
			case len(st) == 1 && key == "messages" && c == '[':
				f.kind, f.max = "messages", lim.messages
			case len(st) == 2 && st[1].kind == "prompts" && c == '[':
				f.kind, f.max = "prompt ids", lim.promptIDs
			}
			st = append(st, f)
			i++
		case '}', ']':
			if len(st) == 0 {
				return nil
			}
			st = st[:len(st)-1]
			i++
		default: // a number or a literal
			if aerr := value(c); aerr != nil {
				return aerr
			}
			j := i + 1
			for j < len(data) && !bytes.ContainsRune([]byte(" \t\n\r,]}:\"[{"), rune(data[j])) {
				j++
			}
			i = j
		}
	}
	return nil
}

// scanOver returns the 400 of the innermost frame of st, over its bound;
// key is the top-level member it is in.
func scanOver(st []scanFrame, key string) *apiError {
	f := st[len(st)-1]
	switch f.kind {
	case "prompt ids":
		which := "prompt"
		if len(st) > 2 {
			which = "prompt " + strconv.Itoa(st[1].n-1)
		}
		return badRequest("prompt", "context_length_exceeded",
			"This model's maximum context length is %d tokens. However, %s has more than %d tokens. Please reduce the length of the prompt.", f.max, which, f.max)
	case "prompts":
		return badRequest("prompt", "invalid_value", "more than %d prompts: the server admits %d requests at once", f.max, f.max)
	case "messages":
		return badRequest("messages", "context_length_exceeded",
			"This model's maximum context length is %d tokens. However, there are more than %d messages, each at least one token. Please reduce the number of messages.", f.max, f.max)
	}
	if len(st) == 1 {
		return badRequest("", "invalid_value", "The request body has more than %d parameters.", f.max)
	}
	return badRequest(key, "invalid_value", "%s has an array or object of more than %d elements", key, f.max)
}

// stringEnd returns the index after the closing quote of the JSON string
// that opens at data[i], or -1 when it does not close.
func stringEnd(data []byte, i int) int {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// promptJSON is the prompt of a /v1/completions body, decoded straight
// into promptIns: token ids go into []int32 of the exact length, with no
// copy of the raw JSON nor an intermediate value per id. scanBody has
// bounded the counts before. Its UnmarshalJSON never fails: a prompt of
// none of the accepted shapes leaves err set.
type promptJSON struct {
	present bool // given and not null
	prompts []promptIn
	err     *apiError
}

// UnmarshalJSON implements json.Unmarshaler; data is valid JSON.
func (p *promptJSON) UnmarshalJSON(data []byte) error {
	*p = promptJSON{}
	if isAbsent(data) {
		return nil
	}
	p.present = true
	p.prompts, p.err = decodePrompts(bytes.TrimSpace(data))
	return nil
}

// decodePrompts decodes a prompt: a string, an array of token ids, or an
// array of strings or of token-id arrays (one prompt each). Token ids are
// checked against the vocabulary later.
func decodePrompts(data []byte) ([]promptIn, *apiError) {
	switch data[0] {
	case '"':
		var text string
		if err := jsonUnmarshalString(data, &text); err != nil {
			return nil, promptTypeError()
		}
		return []promptIn{{text: text}}, nil
	case '[':
	default:
		return nil, promptTypeError()
	}
	i := skipSpace(data, 1)
	if i < len(data) && data[i] == ']' {
		return nil, badRequest("prompt", "empty_prompt", "prompt must not be empty")
	}
	if i >= len(data) {
		return nil, promptTypeError()
	}
	if data[i] != '"' && data[i] != '[' {
		ids, _, aerr := decodeIDs(data, 0)
		if aerr != nil {
			return nil, aerr
		}
		return []promptIn{{ids: ids, isIDs: true}}, nil
	}
	batchOf := data[i]
	var out []promptIn
	for {
		i = skipSpace(data, i)
		if i >= len(data) || data[i] != batchOf {
			return nil, promptTypeError() // a batch mixes texts and token ids, or holds something else
		}
		if batchOf == '"' {
			j := stringEnd(data, i)
			if j < 0 {
				return nil, promptTypeError()
			}
			var text string
			if err := jsonUnmarshalString(data[i:j], &text); err != nil {
				return nil, promptTypeError()
			}
			out = append(out, promptIn{text: text})
			i = j
		} else {
			ids, j, aerr := decodeIDs(data, i)
			if aerr != nil {
				return nil, aerr
			}
			out = append(out, promptIn{ids: ids, isIDs: true})
			i = j
		}
		i = skipSpace(data, i)
		if i >= len(data) {
			return nil, promptTypeError()
		}
		switch data[i] {
		case ',':
			i++
		case ']':
			return out, nil
		default:
			return nil, promptTypeError()
		}
	}
}

// decodeIDs decodes the array of token ids that opens at data[i] and
// returns it and the index after its closing bracket. Each id is an
// integer in [0, 2³¹−1]; the vocabulary is checked later.
func decodeIDs(data []byte, i int) ([]int32, int, *apiError) {
	// Count the elements first, to allocate the slice once.
	n, end := 1, -1
	for j := i + 1; j < len(data); j++ {
		if c := data[j]; c == ',' {
			n++
		} else if c == ']' {
			end = j
			break
		} else if c == '[' || c == '{' || c == '"' {
			return nil, 0, promptTypeError()
		}
	}
	if end < 0 {
		return nil, 0, promptTypeError()
	}
	if len(bytes.TrimSpace(data[i+1:end])) == 0 {
		return []int32{}, end + 1, nil
	}
	out := make([]int32, 0, n)
	for j := i + 1; j < end; {
		j = skipSpace(data, j)
		k := j
		for k < end && data[k] != ',' && data[k] != ' ' && data[k] != '\t' && data[k] != '\n' && data[k] != '\r' {
			k++
		}
		tok := data[j:k]
		v, err := strconv.ParseInt(string(tok), 10, 64)
		switch {
		case err != nil && !isIntLiteral(tok):
			return nil, 0, promptTypeError() // null, a fraction, an exponent, not a number
		case err != nil || v < 0 || v > math.MaxInt32:
			return nil, 0, badRequest("prompt", "invalid_token", "prompt token %s at index %d is outside the vocabulary", tok, len(out))
		}
		out = append(out, int32(v))
		j = skipSpace(data, k)
		if j < end {
			if data[j] != ',' {
				return nil, 0, promptTypeError()
			}
			j++
		}
	}
	return out, end + 1, nil
}

// isIntLiteral reports whether tok is a JSON integer (out of int64's
// range or not).
func isIntLiteral(tok []byte) bool {
	if len(tok) > 0 && tok[0] == '-' {
		tok = tok[1:]
	}
	if len(tok) == 0 {
		return false
	}
	for _, c := range tok {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// jsonUnmarshalString decodes the JSON string data into s.
func jsonUnmarshalString(data []byte, s *string) error {
	if len(data) < 2 || data[0] != '"' {
		return errors.New("not a string")
	}
	if in := data[1 : len(data)-1]; bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
		*s = string(in) // no escapes: the common case, one copy
		return nil
	}
	return json.Unmarshal(data, s)
}
