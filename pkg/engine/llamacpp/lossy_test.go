package llamacpp

import (
	"context"
	"slices"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// Lossy codecs on llama.cpp's f16 KV, against the lossless transfer:
// greedy-token agreement over genTokens tokens and the largest logit
// difference at the first decode step, with the bounds found on these
// random-weight models (so they say nothing about a trained model's
// quality; they catch a codec that breaks the KV). Measured here: int8
// moved the first-step logits by at most 0.012 and fp8 by 0.05, and both
// kept all 24 greedy tokens; the bounds leave about 4× room.
func TestLossyCodecs(t *testing.T) {
	bounds := map[string]struct {
		maxLogit float64 // largest |Δlogit| at the first step
		minAgree float64 // fraction of greedy tokens equal to lossless
	}{
		"int8": {maxLogit: 0.05, minAgree: 0.9},
		"fp8":  {maxLogit: 0.2, minAgree: 0.75},
	}
	for _, model := range []string{"llama-f32", "qwen2-f16"} {
		t.Run(model, func(t *testing.T) {
			a := newTestEngine(t, model, nil)
			tok := a.Tokenizer()
			prompts := [][]int32{tok.Encode("The quick brown fox jumps over the lazy dog"), tok.Encode("Grüße aus Köln — 世界")}
			firsts := prefillMix(t, a, prompts, 0)
			raw := exportAll(t, a, prompts)
			run := func(c codec.Codec) ([][]int32, [][]float32) {
				b := newTestEngine(t, model, nil)
				transfer(t, b, raw, c, false)
				return decodeFree(t, b, firsts, genTokens-1)
			}
			none, _ := codec.ByName("none")
			wantToks, wantLogits := run(none)
			for name, bd := range bounds {
				c, err := codec.ByName(name)
				if err != nil {
					t.Fatal(err)
				}
				toks, logits := run(c)
				agree, total, worst := 0, 0, 0.0
				for i := range prompts {
					for j := range toks[i] {
						total++
						if toks[i][j] == wantToks[i][j] {
							agree++
						} else {
							break // after a divergence the sequences differ anyway
						}
					}
					worst = max(worst, maxDiff(wantLogits[i], logits[i]))
				}
				frac := float64(agree) / float64(total)
				t.Logf("%s: greedy agreement %d/%d (%.2f, counted to the first divergence), largest first-step logit difference %.4f", name, agree, total, frac, worst)
				if frac < bd.minAgree {
					t.Errorf("%s: greedy agreement %.2f < %.2f", name, frac, bd.minAgree)
				}
				if worst > bd.maxLogit {
					t.Errorf("%s: logit difference %.4f > %.4f", name, worst, bd.maxLogit)
				}
				if worst == 0 {
					t.Errorf("%s: logits unchanged: the lossy codec did not reach the KV", name)
				}
			}
		})
	}
}

// decodeFree decodes seqs 1…n together for steps greedy steps, each fed
// its own last token, starting from the greedy tokens of firsts (the
// prefill's logits), and returns each sequence's tokens (the first
// included) and the logits of its first decode step.
func decodeFree(t *testing.T, e *Engine, firsts [][]float32, steps int) ([][]int32, [][]float32) {
	t.Helper()
	n := len(firsts)
	toks := make([][]int32, n)
	logits := make([][]float32, n)
	for i := range n {
		toks[i] = []int32{argmax(firsts[i])}
	}
	for s := range steps {
		items := make([]engine.DecodeItem, n)
		for i := range n {
			items[i] = engine.DecodeItem{Seq: engine.SeqID(i + 1), Token: toks[i][len(toks[i])-1]}
		}
		outs, err := e.Decode(context.Background(), items)
		if err != nil {
			t.Fatalf("decode step %d: %v", s, err)
		}
		for i, o := range outs {
			toks[i] = append(toks[i], o.Token)
			if s == 0 {
				logits[i] = slices.Clone(o.Logits)
			}
		}
	}
	return toks, logits
}
