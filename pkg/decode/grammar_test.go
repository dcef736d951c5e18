package decode

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/wire"
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

// overflowSchema is a schema within grammar.DefaultLimits whose matcher
// cannot go on once an object of it opens: an anyOf of three objects of
// 1,500 optional properties each holds 4,500 parse stacks after "{", over
// the matcher's bound, so its mask allows no token there.
func overflowSchema() string {
	var b strings.Builder
	b.WriteString(`{"anyOf":[`)
	for o := range 3 {
		if o > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"type":"object","properties":{`)
		for i := range 1500 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"o%dp%d":{"type":"null"}`, o, i)
		}
		b.WriteString(`}}`)
	}
	b.WriteString(`]}`)
	return b.String()
}

// A grammar that allows no token ends its request with an error, and the
// token sampled under the empty mask never reaches the caller (issue 39
// §1): at the first token (the colocated path: local prefill), and in the
// middle of the output, after tokens the grammar allowed were sent. On
// the old code the worker logged the refusal and streamed token 0 (a NUL
// byte) until max_tokens.
func TestGrammarAllowingNoTokenEndsTheRequest(t *testing.T) {
	first, err := grammar.FromSchema([]byte(overflowSchema()))
	if err != nil {
		t.Fatal(err)
	}
	later, err := grammar.FromSchema([]byte(`{"type":"object","properties":{"a":` + overflowSchema() + `},"required":["a"]}`))
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, smallOptions(), true)
	tok := newEngine(t).Tokenizer()
	for i, tc := range []struct {
		name, gbnf string
		n          int32
		minTokens  int // sent before the error
	}{
		{"first token", first, 1, 0},
		{"first token, n 3", first, 3, 0},
		{"after the object opened", later, 1, len(`{"a":`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: fmt.Sprint("none", i), PromptTokens: prompt(9, 3), MaxTokens: 64, N: tc.n, LocalPrefill: true,
				Sampling: &pdservev1.Sampling{Grammar: tc.gbnf, Temperature: 1, Seed: 7}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := collect(stream)
			if status.Code(err) != codes.FailedPrecondition || !wire.IsGrammarRefused(err) || !strings.Contains(err.Error(), "grammar allows no token") {
				t.Fatalf("after %q (finish %q): %v; want FailedPrecondition naming the grammar", tok.Decode(got.tokens), got.reason, err)
			}
			if len(got.tokens) < tc.minTokens {
				t.Errorf("%d tokens %q sent before the error, want at least %d", len(got.tokens), tok.Decode(got.tokens), tc.minTokens)
			}
			if tc.n == 1 {
				g, err := grammar.Parse(tc.gbnf, "root")
				if err != nil {
					t.Fatal(err)
				}
				m, err := g.Matcher()
				if err != nil {
					t.Fatal(err)
				}
				if err := m.Accept([]byte(tok.Decode(got.tokens))); err != nil {
					t.Errorf("tokens sent %q: %v", tok.Decode(got.tokens), err)
				}
			}
		})
	}
	checkFor(t, 5*time.Second, func() error {
		w.s.mu.Lock()
		defer w.s.mu.Unlock()
		if n := len(w.s.seqs); n != 0 {
			return fmt.Errorf("%d requests still held", n)
		}
		if free := w.s.freeBlocksLocked(); free != smallOptions().KVBlocks {
			return fmt.Errorf("%d of %d KV blocks free", free, smallOptions().KVBlocks)
		}
		return nil
	})
}
