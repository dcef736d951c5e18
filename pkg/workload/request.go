package workload

import (
	"errors"
	"time"
)

// Request is one request of a workload. Its prompt content is built on
// demand by Body, so a long trace costs memory for its lengths only.
type Request struct {
	// Index is the request's position in the workload, from 0.
	Index int
	// PromptLen is the prompt length in tokens, as counted by the
	// workload's tokenizer (exact for byte-level servers and token-id
	// prompts, an approximation for text on other tokenizers).
	PromptLen int
	// OutputLen is the number of output tokens asked for (max_tokens),
	// ≥ 1. It is the exact output length when the server honours
	// ignore_eos.
	OutputLen int
	// Arrival is the request's offset from the first request of the trace
	// it came from, ≥ 0; meaningful only when the Workload has
	// Timestamps.
	Arrival time.Duration

	recipe *recipe
}

// recipe says how to build a request's prompt. Shared parts are read only.
type recipe struct {
	synth     Synth
	seed      uint64
	text      string  // real text (ShareGPT); else synthesised
	prefix    *Prompt // shared prefix, may be nil
	hashIDs   []int64 // Mooncake blocks, in order
	blockSize int
	total     int // tokens in all
}

// Body returns the request's prompt: text when the workload's format is
// text, else token ids (one of the two is empty). The result is the same on
// every call; it is freshly allocated and owned by the caller. Safe for
// concurrent use.
func (r *Request) Body() (prompt string, ids []int32) {
	rc := r.recipe
	if rc == nil {
		return "", nil
	}
	var p Prompt
	if rc.text != "" {
		// AppendText only fails for a format checked at load time.
		_ = rc.synth.AppendText(&p, rc.text)
		return rc.synth.body(&p)
	}
	if rc.prefix != nil {
		p = rc.prefix.clone()
	}
	for _, h := range rc.hashIDs {
		if p.Len() >= rc.total {
			break
		}
		rc.synth.Append(&p, blockRand(rc.seed, h), min(rc.blockSize, rc.total-p.Len()))
	}
	rc.synth.Append(&p, newRand(rc.seed^streamContent, uint64(r.Index)), rc.total-p.Len())
	return rc.synth.body(&p)
}

// Workload is an ordered list of requests and where they came from.
type Workload struct {
	// Requests in send order. For traces, Arrival is non-decreasing.
	Requests []Request
	// Timestamps reports whether the requests carry trace arrival offsets
	// (Azure and Mooncake traces) that can be replayed.
	Timestamps bool
	// Description says what the workload is, for reports, e.g.
	// "random in=1024±0% out=128±0% prefix=0".
	Description string
	// Notes lists adjustments the loader made (rows clamped, requests
	// oversampled), for reports.
	Notes []string
}

// Errors returned by the loaders, wrapped with detail; match with errors.Is.
var (
	// ErrMalformed reports input that does not parse; the message names the
	// line.
	ErrMalformed = errors.New("workload: malformed input")
	// ErrEmpty reports a source that yields no usable request.
	ErrEmpty = errors.New("workload: no usable request")
	// ErrBadOption reports an invalid option value.
	ErrBadOption = errors.New("workload: bad option")
)

// WithContentSeed returns a copy of w whose synthesised prompt content is
// drawn from seed instead of the seed w was loaded with: the same lengths,
// arrivals and shared prefix (the random and dist datasets' prefix keeps
// its content), other words or token ids everywhere else, Mooncake hash
// blocks included (requests that share a block within w still share it).
// Real text (ShareGPT) is unchanged. w is not modified; the copy shares
// its read-only parts.
func (w *Workload) WithContentSeed(seed uint64) *Workload {
	c := *w
	c.Requests = make([]Request, len(w.Requests))
	for i, r := range w.Requests {
		if r.recipe != nil && r.recipe.text == "" {
			rc := *r.recipe
			rc.seed = seed
			r.recipe = &rc
		}
		c.Requests[i] = r
	}
	return &c
}

// SharedPrefixLen returns the tokens of the prefix every prompt of w
// starts with by construction (the random and dist datasets' prefix), 0
// when none.
func (w *Workload) SharedPrefixLen() int {
	if len(w.Requests) == 0 || w.Requests[0].recipe == nil || w.Requests[0].recipe.prefix == nil {
		return 0
	}
	return w.Requests[0].recipe.prefix.Len()
}

// TotalPromptTokens returns the sum of PromptLen over the requests.
func (w *Workload) TotalPromptTokens() int {
	n := 0
	for _, r := range w.Requests {
		n += r.PromptLen
	}
	return n
}
