package decode

import (
	"encoding/json"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grammar"
)

// A grammar in the request's sampling constrains every token the worker
// samples, the locally prefilled first one included, from the state after
// the tokens generated before (accept): random weights then end with JSON
// holding the schema's values. Grammars that do not parse, or that refuse
// the generated tokens, are InvalidArgument.
func TestGrammarConstrainsGeneration(t *testing.T) {
	gbnf, err := grammar.FromSchema([]byte(`{"type":"object","properties":{"c":{"enum":["red","green"]}},"required":["c"]}`))
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, smallOptions(), true)
	tok := newEngine(t).Tokenizer()
	p := prompt(9, 3)
	for i, tc := range []struct {
		name      string
		sampling  *pdservev1.Sampling
		generated string
	}{
		{"greedy", &pdservev1.Sampling{Grammar: gbnf}, ""},
		{"sampled", &pdservev1.Sampling{Grammar: gbnf, Temperature: 1.5, Seed: 5}, ""},
		{"after generated tokens", &pdservev1.Sampling{Grammar: gbnf, Temperature: 1, Seed: 2}, `{"c": "g`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			gen := tok.Encode(tc.generated)
			stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: fmt.Sprint("g", i), PromptTokens: p, MaxTokens: 200, LocalPrefill: true, Sampling: tc.sampling, GeneratedTokens: gen})
			if err != nil {
				t.Fatal(err)
			}
			got, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}
			if got.reason != FinishStop {
				t.Fatalf("finish %q after %d tokens, want stop (the grammar's sentences are short)", got.reason, len(got.tokens))
			}
			text := tc.generated + tok.Decode(got.tokens)
			var v struct{ C string }
			if err := json.Unmarshal([]byte(text), &v); err != nil || (v.C != "red" && v.C != "green") || (tc.generated != "" && v.C != "green") {
				t.Errorf("output %q: %+v, %v; want an object with c red or green (green after %q)", text, v, err, tc.generated)
			}
		})
	}
	for i, tc := range []struct {
		name, gbnf, generated string
	}{
		{"grammar does not parse", `root ::= (`, ""},
		{"generated tokens the grammar refuses", gbnf, `[1]`},
	} {
		ctx := testCtx(t)
		stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: fmt.Sprint("bad", i), PromptTokens: p, MaxTokens: 20, LocalPrefill: true, Sampling: &pdservev1.Sampling{Grammar: tc.gbnf}, GeneratedTokens: tok.Encode(tc.generated)})
		if err == nil {
			_, err = collect(stream)
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		}
	}
}
