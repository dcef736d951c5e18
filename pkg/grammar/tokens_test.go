package grammar_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/grammar"
)

// TestRefEngineConstrained decodes with the reference engine's random
// weights under a schema's grammar: whatever the weights choose, every
// token is allowed, and the output ends (its sentences are bounded) as
// JSON that holds the schema's values.
func TestRefEngineConstrained(t *testing.T) {
	e, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	gbnf, err := grammar.FromSchema([]byte(`{"type":"object","properties":{"color":{"enum":["red","green"]},"ok":{"type":"boolean"},"n":{"type":"null"}},"required":["color","ok"],"additionalProperties":false}`))
	if err != nil {
		t.Fatal(err)
	}
	g, err := grammar.Parse(gbnf, "root")
	if err != nil {
		t.Fatal(err)
	}
	tok := e.Tokenizer()
	for i, s := range []engine.Sampling{{}, {Temperature: 1.5, Seed: 7}, {Temperature: 1, TopP: 0.9, Seed: 3}} {
		seq := engine.SeqID(i + 1)
		mask, err := grammar.NewTokenMask(g, tok)
		if err != nil {
			t.Fatal(err)
		}
		s.Constraint = mask
		outs, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: tok.Encode("Answer in JSON:"), Last: true, Sampling: s}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var gen []int32
		next := outs[0].Token
		for step := 0; ; step++ {
			if step > 400 {
				t.Fatalf("sampling %+v: no end of generation after %d tokens: %q", s, step, tok.Decode(gen))
			}
			if err := mask.Accept(next); err != nil {
				t.Fatalf("sampling %+v: token %d chosen against the grammar: %v", s, next, err)
			}
			if next == tok.EOS() {
				break
			}
			gen = append(gen, next)
			outs, err = e.Decode(context.Background(), []engine.DecodeItem{{Seq: seq, Token: next, Sampling: s}})
			if err != nil {
				t.Fatal(err)
			}
			next = outs[0].Token
		}
		e.Free(seq)
		var got struct {
			Color string `json:"color"`
			OK    *bool  `json:"ok"`
		}
		text := tok.Decode(gen)
		if err := json.Unmarshal([]byte(text), &got); err != nil || (got.Color != "red" && got.Color != "green") || got.OK == nil {
			t.Errorf("sampling %+v: output %q does not hold the schema's values (%v)", s, text, err)
		}
	}
}

func TestTokenMaskAcceptRebuilds(t *testing.T) {
	e, err := ref.New(ref.Options{Preset: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	g, err := grammar.Parse(grammar.JSONObject, "root")
	if err != nil {
		t.Fatal(err)
	}
	tok := e.Tokenizer()
	m, _ := grammar.NewTokenMask(g, tok)
	if err := m.Accept(tok.EOS()); !errors.Is(err, grammar.ErrRejected) {
		t.Errorf("EOS first: %v, want ErrRejected", err)
	}
	if err := m.Accept(tok.Encode(`{"a": 1}`)...); err != nil || !m.Complete() {
		t.Fatalf("Accept(object) = %v, complete %v", err, m.Complete())
	}
	if err := m.Accept(tok.Encode(`x`)...); !errors.Is(err, grammar.ErrRejected) {
		t.Errorf("text after the object: %v, want ErrRejected", err)
	}
	logits := make([]float32, e.Spec().Vocab)
	m.Mask(logits)
	if logits[tok.EOS()] != 0 || logits[tok.Encode("x")[0]] == 0 {
		t.Errorf("complete object: EOS logit %v, x logit %v; want EOS allowed, x masked", logits[tok.EOS()], logits[tok.Encode("x")[0]])
	}
}

// logitFree is an engine that chooses tokens without logits.
type logitFree struct{ engine.Engine }

func (logitFree) LogitFree() {}

func TestForEngine(t *testing.T) {
	s, err := sim.New(sim.Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 0.001, PayloadScale: 0.01, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grammar.ForEngine(logitFree{s}).Constrain(grammar.JSONObject, nil); !errors.Is(err, grammar.ErrNoLogits) {
		t.Errorf("an engine without logits: %v, want ErrNoLogits", err)
	}
	if st, err := grammar.ForEngine(s).Constrain(grammar.JSONObject, nil); err != nil {
		t.Errorf("sim engine (it follows grammars): %v", err)
	} else {
		st.Close()
	}
	e, err := ref.New(ref.Options{Preset: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	src := grammar.ForEngine(e)
	st, err := src.Constrain(grammar.JSONObject, e.Tokenizer().Encode(`{"a"`))
	if err != nil {
		t.Fatalf("Constrain over a prefix: %v", err)
	}
	if _, ok := st.(*grammar.TokenMask); !ok {
		t.Errorf("ref engine: state %T, want the Go mask", st)
	}
	if _, err := src.Constrain(grammar.JSONObject, e.Tokenizer().Encode(`}`)); !errors.Is(err, grammar.ErrRejected) {
		t.Errorf("Constrain over a refused prefix: %v, want ErrRejected", err)
	}
	if _, err := src.Constrain(`root ::= (`, nil); !errors.Is(err, grammar.ErrSyntax) {
		t.Errorf("Constrain of a bad grammar: %v, want ErrSyntax", err)
	}
}
