package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Conversation is the first exchange of a ShareGPT conversation.
type Conversation struct {
	Prompt     string // first turn (the human's)
	Completion string // second turn (the model's)
}

type sharegptEntry struct {
	Conversations []struct {
		From  string `json:"from"`
		Value string `json:"value"`
	} `json:"conversations"`
}

// ParseShareGPT parses a ShareGPT JSON file (a list of objects with a
// "conversations" list of {"from", "value"} turns) and returns the first two
// turns of every conversation that has at least two, in file order. Errors
// wrap ErrMalformed and name the line.
func ParseShareGPT(data []byte) ([]Conversation, error) {
	var entries []sharegptEntry
	if err := json.Unmarshal(data, &entries); err != nil {
		return nil, fmt.Errorf("%w: sharegpt: %s", ErrMalformed, jsonErrAt(data, err))
	}
	out := make([]Conversation, 0, len(entries))
	for _, e := range entries {
		if len(e.Conversations) < 2 {
			continue
		}
		out = append(out, Conversation{Prompt: e.Conversations[0].Value, Completion: e.Conversations[1].Value})
	}
	return out, nil
}

// jsonErrAt describes a json error with the line (and column) it happened at.
func jsonErrAt(data []byte, err error) string {
	var off int64 = -1
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
	}
	if off < 0 || off > int64(len(data)) {
		return err.Error()
	}
	line := 1 + bytes.Count(data[:off], []byte("\n"))
	col := off - int64(bytes.LastIndexByte(data[:off], '\n'))
	return fmt.Sprintf("line %d, column %d: %v", line, col, err)
}

// ShareGPTOptions are vLLM's ShareGPT sampling parameters.
type ShareGPTOptions struct {
	// OutputLen, when > 0, replaces every completion's length.
	OutputLen int
}

// vLLM's ShareGPT filters, in tokens.
const (
	sharegptMinLen       = 4
	sharegptMaxPromptLen = 1024
	sharegptMaxTotalLen  = 2048
)

// ShareGPT samples n requests from conversations as vLLM does: shuffle with
// the seed, count tokens with the Synth's tokenizer, drop pairs whose prompt
// (or, without a fixed output length, completion) is shorter than 4 tokens,
// whose prompt exceeds 1024 tokens or whose total exceeds 2048; when fewer
// than n remain, sample the kept ones again with replacement (noted).
func ShareGPT(convs []Conversation, o ShareGPTOptions, n int, seed uint64, s Synth) (*Workload, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: number of prompts %d < 1", ErrBadOption, n)
	}
	if s.Format == Tokens && s.Tokenizer != Bytes {
		return nil, fmt.Errorf("%w: sharegpt with --prompt-format tokens needs --tokenizer bytes", ErrBadOption)
	}
	order := make([]int, len(convs))
	for i := range order {
		order[i] = i
	}
	rng := newRand(seed, streamShuffle)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })

	w := &Workload{Description: fmt.Sprintf("sharegpt (%d conversations, vLLM filters)", len(convs))}
	for _, k := range order {
		if len(w.Requests) == n {
			break
		}
		c := convs[k]
		pl := s.Tokenizer.Count(c.Prompt)
		ol := o.OutputLen
		if ol <= 0 {
			ol = s.Tokenizer.Count(c.Completion)
			if ol < sharegptMinLen {
				continue
			}
		}
		if pl < sharegptMinLen || pl > sharegptMaxPromptLen || pl+ol > sharegptMaxTotalLen {
			continue
		}
		w.Requests = append(w.Requests, Request{
			Index: len(w.Requests), PromptLen: pl, OutputLen: ol,
			recipe: &recipe{synth: s, text: c.Prompt, total: pl},
		})
	}
	kept := len(w.Requests)
	if kept == 0 {
		return nil, fmt.Errorf("%w: sharegpt: no conversation passes the length filters", ErrEmpty)
	}
	if kept < n {
		w.Notes = append(w.Notes, fmt.Sprintf("sharegpt: %d conversations pass the filters; %d more sampled with replacement", kept, n-kept))
		for len(w.Requests) < n {
			r := w.Requests[rng.IntN(kept)]
			r.Index = len(w.Requests)
			w.Requests = append(w.Requests, r)
		}
	}
	return w, nil
}
