package sim

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// TestGrammarIsFollowed: under a grammar (a JSON Schema's), the engine's
// tokens are ones the grammar allows and end with EOS once it is
// complete, the same for the same prompt; so structured output and
// forced tool calls run on the performance model. It fails on an engine
// that ignores Sampling.Constraint (its text bytes are not JSON, and it
// never ends with EOS).
func TestGrammarIsFollowed(t *testing.T) {
	e, _ := newSim(t, Options{})
	g, err := grammar.FromSchema([]byte(`{"type":"object","properties":{"op":{"enum":["read","list","grep"]},"ok":{"type":"boolean"}},"required":["op","ok"],"additionalProperties":false}`))
	if err != nil {
		t.Fatal(err)
	}
	src := grammar.ForEngine(e)
	gen := func(seq engine.SeqID, prompt string) string {
		st, err := src.Constrain(g, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		s := engine.Sampling{Constraint: st}
		outs, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: tokenizer.Bytes{}.Encode(prompt), Last: true, Sampling: s}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Free(seq)
		var out []int32
		for tok := outs[0].Token; ; {
			if err := st.Accept(tok); err != nil {
				t.Fatalf("after %q: token %d refused: %v", tokenizer.Bytes{}.Decode(out), tok, err)
			}
			if tok == (tokenizer.Bytes{}).EOS() {
				return tokenizer.Bytes{}.Decode(out)
			}
			out = append(out, tok)
			if len(out) > 300 {
				t.Fatalf("no EOS after %q", tokenizer.Bytes{}.Decode(out))
			}
			d, err := e.Decode(context.Background(), []engine.DecodeItem{{Seq: seq, Token: tok, Sampling: s}})
			if err != nil {
				t.Fatal(err)
			}
			tok = d[0].Token
		}
	}
	for i, p := range []string{"call a tool", "another prompt", "a third one"} {
		a := gen(engine.SeqID(2*i+1), p)
		var v struct {
			Op string `json:"op"`
			OK *bool  `json:"ok"`
		}
		if err := json.Unmarshal([]byte(a), &v); err != nil || v.Op == "" || v.OK == nil {
			t.Errorf("%q: output %q does not match the schema (%v)", p, a, err)
		}
		if b := gen(engine.SeqID(2*i+2), p); a != b {
			t.Errorf("%q: %q then %q", p, a, b)
		}
	}
}
