package frontend

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// FuzzParseRequest feeds arbitrary bodies to the request parser of either
// route (decoding, validation, tokenization, budgets and the context
// check). It must not panic; a request it takes must be one a Backend can
// serve; a refusal must be a 4xx or 503 with a message and no Go decoding
// text. The seed corpus is in testdata/fuzz/FuzzParseRequest.
func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"prompt":"hello","max_tokens":4,"logprobs":2,"echo":true,"n":2}`), false)
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":3}`), true)
	const maxLen, inFlight = 256, 8
	pol := config.Default()
	pol.Budgets.Default = 200
	s, err := New(Options{
		Backend: &fakeBackend{complete: echoText("x")}, Tokenizer: tokenizer.Bytes{}, Policy: pol,
		Models:      func() []Model { return []Model{{Name: "tiny", MaxModelLen: maxLen}, {Name: "open"}} },
		MaxInFlight: inFlight,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, chat bool) {
		tr := &budget.Trace{RequestID: "cmpl-fuzz"}
		pl, aerr := s.prepare(data, chat, client{}, tr)
		if aerr != nil {
			switch aerr.status {
			case http.StatusBadRequest, http.StatusNotFound:
			default:
				t.Fatalf("status %d: %+v", aerr.status, aerr)
			}
			if aerr.Message == "" || aerr.Type == "" {
				t.Fatalf("error without message or type: %+v", aerr)
			}
			for _, leak := range []string{"json: ", "Go struct", "Go value", "cannot unmarshal"} {
				if bytes.Contains([]byte(aerr.Message), []byte(leak)) && !bytes.Contains(data, []byte(leak)) {
					t.Fatalf("message %q holds decoding text %q", aerr.Message, leak)
				}
			}
			if _, err := json.Marshal(aerr); err != nil {
				t.Fatalf("error does not encode: %v", err)
			}
			return
		}
		if len(pl.reqs) < 1 || len(pl.reqs) > inFlight || len(pl.echo) != len(pl.reqs) || chat && len(pl.reqs) != 1 {
			t.Fatalf("%d requests, %d echoes (chat %v)", len(pl.reqs), len(pl.echo), chat)
		}
		for _, r := range pl.reqs {
			switch {
			case r.N < 1 || r.N > maxN:
				t.Fatalf("N %d", r.N)
			case r.MaxTokens < 1:
				t.Fatalf("MaxTokens %d", r.MaxTokens)
			case len(r.Prompt) < 1 || len(r.Prompt) > pol.Budgets.Default:
				t.Fatalf("prompt of %d tokens", len(r.Prompt))
			case r.Model == "tiny" && len(r.Prompt)+r.MaxTokens > maxLen:
				t.Fatalf("prompt %d + max_tokens %d over the context %d", len(r.Prompt), r.MaxTokens, maxLen)
			case r.Logprobs < -1 || r.Logprobs > maxLogprobs:
				t.Fatalf("Logprobs %d", r.Logprobs)
			case r.PromptLogprobs != -1 && r.PromptLogprobs != r.Logprobs:
				t.Fatalf("PromptLogprobs %d with Logprobs %d", r.PromptLogprobs, r.Logprobs)
			case !(r.Sampling.Temperature >= 0 && r.Sampling.Temperature <= 2), !(r.Sampling.TopP >= 0 && r.Sampling.TopP <= 1):
				t.Fatalf("sampling %+v", r.Sampling)
			case r.Trace == nil || r.ID == "":
				t.Fatalf("request without trace or id: %+v", r)
			}
			if p := r.Sampling.Penalties; p != nil && (p.Presence < -2 || p.Presence > 2 || p.Frequency < -2 || p.Frequency > 2 || p.Presence == 0 && p.Frequency == 0) {
				t.Fatalf("penalties %+v", *p)
			}
			for _, id := range r.Prompt {
				if id < 0 || int(id) >= tokenizer.Vocab {
					t.Fatalf("prompt token %d", id)
				}
			}
		}
	})
}
