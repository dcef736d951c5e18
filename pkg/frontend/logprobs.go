package frontend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/pdserve/pdserve/pkg/sampling"
)

// minLogprob stands for an impossible token (-Inf, which JSON cannot
// carry) and NaN, as OpenAI and vLLM send it.
const minLogprob = -9999.0

// lpValue returns v as sent: at least minLogprob.
func lpValue(v float32) float64 {
	f := float64(v)
	if !(f >= minLogprob) { // NaN too
		return minLogprob
	}
	return f
}

// completionToken returns a token's text in completions logprobs: its
// bytes when they are valid UTF-8, else vLLM's "bytes:\xNN…" form.
func completionToken(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return "bytes:" + hexEscape(b)
}

// chatToken returns a token's text in chat logprobs: its bytes when valid
// UTF-8, else each byte as \xNN (as OpenAI; "bytes" has the raw bytes).
func chatToken(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return hexEscape(b)
}

func hexEscape(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		fmt.Fprintf(&sb, `\x%02x`, c)
	}
	return sb.String()
}

// byteList returns b as JSON numbers (a []byte would encode as base64).
func byteList(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

// completionLogprobs is choice.logprobs of /v1/completions: parallel
// lists, one entry per token. With echo the prompt's tokens come first,
// the first of them with a null logprob and null alternatives.
type completionLogprobs struct {
	Tokens        []string   `json:"tokens"`
	TokenLogprobs []*float64 `json:"token_logprobs"`
	// TopLogprobs holds, per token, the asked number of most probable
	// tokens and the token itself (so up to logprobs+1 entries, as
	// OpenAI), most probable first.
	TopLogprobs []topMap `json:"top_logprobs"`
	// TextOffset is each token's offset in the choice's text, in
	// characters (a token that starts inside a character gets that
	// character's offset).
	TextOffset []int `json:"text_offset"`
}

// topMap is a {token: logprob} object whose keys keep their order (most
// probable first); a token text seen twice keeps its first entry. nil
// encodes as null.
type topMap []topEntry

type topEntry struct {
	token string
	lp    float64
}

// MarshalJSON implements json.Marshaler.
func (m topMap) MarshalJSON() ([]byte, error) {
	if m == nil {
		return []byte("null"), nil
	}
	var buf bytes.Buffer
	buf.WriteByte('{')
	seen := make(map[string]bool, len(m))
	for _, e := range m {
		if seen[e.token] {
			continue
		}
		if len(seen) > 0 {
			buf.WriteByte(',')
		}
		seen[e.token] = true
		k, err := json.Marshal(e.token)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(e.lp)
		if err != nil {
			return nil, err
		}
		buf.Write(k)
		buf.WriteByte(':')
		buf.Write(v)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// chatLogprobs is choice.logprobs of /v1/chat/completions.
type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
	Refusal *string            `json:"refusal"` // always null
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float64          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"` // exactly top_logprobs entries
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// logprobBuf collects a choice's logprob entries: all of them for a whole
// response, those not yet sent for a stream. Not safe for concurrent use.
type logprobBuf struct {
	chat   bool
	decode func(int32) []byte
	cmpl   completionLogprobs
	// content is chat's list.
	content []chatTokenLogprob
	n       int // entries held
}

// add appends token's entry at text offset off; lp nil is a token without
// a logprob (the first prompt token of an echo).
func (b *logprobBuf) add(token int32, lp *sampling.TokenLogprob, off int) {
	b.n++
	tb := b.decode(token)
	if b.chat {
		e := chatTokenLogprob{Token: chatToken(tb), Logprob: minLogprob, Bytes: byteList(tb), TopLogprobs: []chatTopLogprob{}}
		if lp != nil {
			e.Logprob = lpValue(lp.Logprob)
			for _, t := range lp.Top {
				bt := b.decode(t.Token)
				e.TopLogprobs = append(e.TopLogprobs, chatTopLogprob{Token: chatToken(bt), Logprob: lpValue(t.Logprob), Bytes: byteList(bt)})
			}
		}
		b.content = append(b.content, e)
		return
	}
	c := &b.cmpl
	c.Tokens = append(c.Tokens, completionToken(tb))
	c.TextOffset = append(c.TextOffset, off)
	if lp == nil {
		c.TokenLogprobs = append(c.TokenLogprobs, nil)
		c.TopLogprobs = append(c.TopLogprobs, nil)
		return
	}
	v := lpValue(lp.Logprob)
	c.TokenLogprobs = append(c.TokenLogprobs, &v)
	top := make(topMap, 0, len(lp.Top)+1)
	self := false
	for _, t := range lp.Top {
		self = self || t.Token == token
		top = append(top, topEntry{completionToken(b.decode(t.Token)), lpValue(t.Logprob)})
	}
	if !self {
		top = append(top, topEntry{c.Tokens[len(c.Tokens)-1], v})
	}
	c.TopLogprobs = append(c.TopLogprobs, top)
}

// take returns the entries held as choice.logprobs (never nil: an empty
// list when none) and empties b.
func (b *logprobBuf) take() any {
	b.n = 0
	if b.chat {
		out := &chatLogprobs{Content: b.content}
		if out.Content == nil {
			out.Content = []chatTokenLogprob{}
		}
		b.content = nil
		return out
	}
	out := b.cmpl
	b.cmpl = completionLogprobs{}
	if out.Tokens == nil {
		out = completionLogprobs{Tokens: []string{}, TokenLogprobs: []*float64{}, TopLogprobs: []topMap{}, TextOffset: []int{}}
	}
	return &out
}

// runeCounter gives the character offset of each token of a text built
// token by token. Not safe for concurrent use.
type runeCounter struct {
	runes int    // characters complete so far
	tail  []byte // bytes of an incomplete character at the end
}

// next returns the offset of a token of bytes b (that of the character it
// starts, or continues) and counts it.
func (r *runeCounter) next(b []byte) int {
	if len(r.tail) > 0 && len(b) > 0 && utf8.RuneStart(b[0]) {
		// b starts a character, so the tail never completes: its bytes
		// are characters of their own (each one U+FFFD). A b that
		// continues the tail's character shares its offset.
		r.runes += utf8.RuneCount(r.tail)
		r.tail = r.tail[:0]
	}
	off := r.runes
	r.tail = append(r.tail, b...)
	n := completeUTF8(r.tail)
	r.runes += utf8.RuneCount(r.tail[:n])
	r.tail = append(r.tail[:0], r.tail[n:]...)
	return off
}
