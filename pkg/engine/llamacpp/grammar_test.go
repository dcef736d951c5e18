package llamacpp

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/grammar"
)

// grammarCases are the grammars both masks are compared on: JSON, a
// schema, and classes and literals beyond ASCII (characters that
// byte-level vocabularies split over several tokens).
func grammarCases(t testing.TB) map[string]string {
	t.Helper()
	schema, err := grammar.FromSchema([]byte(`{"type":"object","properties":{"city":{"enum":["Zürich","東京","São Paulo"]},"n":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"},"maxItems":2}},"required":["city","n"],"additionalProperties":false}`))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"json object": grammar.JSONObject,
		"schema":      schema,
		"cjk":         `root ::= "「" [一-龥ぁ-ん]{1,6} "」" | [А-я]+ "!"`,
		"negated":     `root ::= [^a-z\x00-\x1F]{1,4} ("." | "…")`,
	}
}

func loadVocab(t testing.TB, name string) *Model {
	t.Helper()
	lib, vocab := repotest.Llama(t)
	m, err := LoadModel(filepath.Join(vocab, name), LoadOptions{LibDir: lib, VocabOnly: true, CPUVariant: os.Getenv(envTestVariant)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestGrammarMatchesGoMask walks llama.cpp's grammar sampler and
// pkg/grammar's Go mask (the reference engine's, and the oracle) side by
// side over the bundled vocabularies: at every step both allow exactly
// the same tokens, end of generation included, and agree on
// completeness; the next token is drawn at random from those allowed
// (so walks stop inside characters split over tokens), and a token
// neither allows is refused by both with grammar.ErrRejected.
func TestGrammarMatchesGoMask(t *testing.T) {
	for _, vocab := range []string{"ggml-vocab-qwen2.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"} {
		m := loadVocab(t, vocab)
		v := grammar.NewVocab(m.Tokenizer())
		n := m.Tokenizer().Vocab()
		for name, gbnf := range grammarCases(t) {
			t.Run(vocab+"/"+name, func(t *testing.T) {
				c, err := m.NewGrammar(gbnf)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				g, err := v.Constrain(gbnf, nil)
				if err != nil {
					t.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(uint64(len(name)), uint64(n)))
				lc, lg := make([]float32, n), make([]float32, n)
				var text []byte
				for step := range 24 {
					clear(lc)
					clear(lg)
					c.Mask(lc)
					g.Mask(lg)
					var allowed, differ []int32
					for id := range int32(n) {
						ac, ag := !math.IsInf(float64(lc[id]), -1), !math.IsInf(float64(lg[id]), -1)
						if ac != ag {
							differ = append(differ, id)
						}
						if ag {
							allowed = append(allowed, id)
						}
					}
					if len(differ) > 0 {
						t.Fatalf("after %q (step %d): %d tokens differ, e.g. %s", text, step, len(differ), describe(m, differ, lc))
					}
					if c.Complete() != g.Complete() {
						t.Fatalf("after %q: complete llama.cpp %v, Go %v", text, c.Complete(), g.Complete())
					}
					if len(allowed) == 0 {
						t.Fatalf("after %q: no token allowed", text)
					}
					if step == 0 && len(allowed) == n {
						t.Fatalf("every token allowed at the start")
					}
					// A refused token: both refuse it and stay as they were.
					for id := range int32(n) {
						if math.IsInf(float64(lg[id]), -1) {
							ec, eg := c.Accept(id), g.Accept(id)
							if !errors.Is(ec, grammar.ErrRejected) || !errors.Is(eg, grammar.ErrRejected) {
								t.Fatalf("refused token %d: llama.cpp %v, Go %v; want ErrRejected", id, ec, eg)
							}
							break
						}
					}
					next := allowed[rng.IntN(len(allowed))]
					if slicesContains(m.Tokenizer().EOG(), next) {
						break
					}
					if err := c.Accept(next); err != nil {
						t.Fatalf("llama.cpp refused allowed token %d: %v", next, err)
					}
					if err := g.Accept(next); err != nil {
						t.Fatalf("Go refused allowed token %d: %v", next, err)
					}
					text = append(text, m.Tokenizer().DecodeToken(next)...)
				}
				t.Logf("walked %q", text)
			})
		}
	}
}

func describe(m *Model, ids []int32, lc []float32) string {
	s := ""
	for _, id := range ids[:min(len(ids), 5)] {
		s += fmt.Sprintf(" %d %q (llama.cpp allows %v);", id, m.Tokenizer().DecodeToken(id), !math.IsInf(float64(lc[id]), -1))
	}
	return s
}

func slicesContains(xs []int32, x int32) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// TestGrammarRefusals: grammars llama.cpp refuses, and the closed state.
func TestGrammarRefusals(t *testing.T) {
	m := loadVocab(t, "ggml-vocab-qwen2.gguf")
	for _, gbnf := range []string{"", "root ::= (", `root ::= root "a" | "a"`, "a ::= \"x\"", "root ::= \"a\x00\""} {
		if _, err := m.NewGrammar(gbnf); !errors.Is(err, ErrGrammar) {
			t.Errorf("NewGrammar(%q) = %v, want ErrGrammar", gbnf, err)
		}
	}
	g, err := m.NewGrammar(`root ::= "ok"`)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	g.Close()
	if err := g.Accept(m.Tokenizer().Encode("ok")...); !errors.Is(err, grammar.ErrRejected) {
		t.Errorf("Accept after Close: %v, want ErrRejected", err)
	}
	l := make([]float32, m.Tokenizer().Vocab())
	g.Mask(l)
	for id, x := range l {
		if !math.IsInf(float64(x), -1) {
			t.Fatalf("Mask after Close allows token %d", id)
		}
	}
}

// BenchmarkGrammarMask is one Mask over Qwen2's 151,936 tokens inside a
// JSON string (the widest state: most tokens allowed), by llama.cpp's
// grammar sampler and by the Go mask.
func BenchmarkGrammarMask(b *testing.B) {
	m := loadVocab(b, "ggml-vocab-qwen2.gguf")
	v := grammar.NewVocab(m.Tokenizer())
	prefix := m.Tokenizer().Encode(`{"name": "ab`)
	logits := make([]float32, m.Tokenizer().Vocab())
	c, err := m.NewGrammar(grammar.JSONObject)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Accept(prefix...); err != nil {
		b.Fatal(err)
	}
	g, err := v.Constrain(grammar.JSONObject, prefix)
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range []struct {
		name string
		mask func([]float32)
	}{{"llama.cpp", c.Mask}, {"go", g.Mask}} {
		b.Run(s.name, func(b *testing.B) {
			for b.Loop() {
				s.mask(logits)
			}
		})
	}
}
