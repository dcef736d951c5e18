package llamacpp

import (
	"bytes"
	"context"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// logitTol is the largest logit difference allowed between the same
// sequence computed in different batch shapes (alone, batched with others,
// chunked, imported). Found on these random-weight models: llama.cpp's
// results depend slightly on the shape of the batch (matmul blocking,
// flash-attention tiling over the unified cache), in the 1e-5 range for
// f32 weights; 1e-3 leaves room while still catching any real mistake
// (a wrong position or a shifted row moves logits by O(1)).
const logitTol = 1e-3

// equivCase is a batch mix: prompts prefilled together in chunks of
// chunk tokens on engine A.
type equivCase struct {
	name    string
	prompts []string
	chunk   int
}

var equivCases = []equivCase{
	{"one prompt whole", []string{"The quick brown fox jumps over the lazy dog"}, 0},
	{"three prompts chunked", []string{"Hello, world", "Once upon a time in a land far away", "1 2 3 4 5 6 7 8 9 10 11 12"}, 5},
	{"two prompts multibyte", []string{"Grüße aus Köln — ☕ und 🚀", "日本語のテキストです"}, 3},
}

const genTokens = 12

// TestEquivalence: prefill on engine A (batches of several sequences,
// chunked), export each sequence's KV, pass it through every lossless
// codec, import it into a fresh engine B, decode there with all sequences
// in one batch. The greedy tokens must equal those of A decoding its own
// KV and those of llama.cpp's own single-sequence generation in a fresh
// context (GenerateReference), and B's logits must stay within logitTol
// of A's.
func TestEquivalence(t *testing.T) {
	for _, m := range []struct {
		model  string
		kvType engine.DType
	}{
		{"llama-f32", engine.F16},
		{"qwen2-f16", engine.F16},
		{"llama-q8", engine.Q8_0},
	} {
		t.Run(m.model+"/"+m.kvType.String(), func(t *testing.T) {
			for _, tc := range equivCases {
				t.Run(tc.name, func(t *testing.T) { testEquivalence(t, m.model, m.kvType, tc) })
			}
		})
	}
}

func testEquivalence(t *testing.T, model string, kvType engine.DType, tc equivCase) {
	opts := func(o *Options) { o.KVType = kvType }
	a := newTestEngine(t, model, opts)
	spec := a.Spec()
	tok := a.Tokenizer()
	prompts := make([][]int32, len(tc.prompts))
	for i, p := range tc.prompts {
		prompts[i] = tok.Encode(p)
	}

	// llama.cpp alone, one sequence in a fresh context.
	want := make([][]int32, len(prompts))
	for i, p := range prompts {
		ref, err := a.Model().GenerateReference(p, genTokens, 512, 2, kvType)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = ref
	}

	// A: chunked prefill of all prompts in shared batches.
	firsts := prefillMix(t, a, prompts, tc.chunk)
	aTokens, aLogits := decodeAll(t, a, len(prompts), firsts, genTokens-1)

	// A fresh A' prefills the same mix, so that the KV exported is the
	// prefill's, before any decode step.
	a2 := newTestEngine(t, model, opts)
	if diff := cmp.Diff(firsts, prefillMix(t, a2, prompts, tc.chunk)); diff != "" {
		t.Fatalf("first tokens of two identical prefills differ:\n%s", diff)
	}
	raw := exportAll(t, a2, prompts)
	for _, c := range codec.LosslessCodecs() {
		if c.Supports(spec.KVDType) != nil {
			continue
		}
		t.Run(c.Name(), func(t *testing.T) {
			b := newTestEngine(t, model, opts)
			transfer(t, b, raw, c, true)
			bTokens, bLogits := decodeAll(t, b, len(prompts), firsts, genTokens-1)
			for i := range prompts {
				if diff := cmp.Diff(aTokens[i], bTokens[i]); diff != "" {
					t.Errorf("prompt %d: imported KV decodes differently from the engine alone (-A +B):\n%s", i, diff)
				}
				if d := maxDiff(aLogits[i], bLogits[i]); d > logitTol {
					t.Errorf("prompt %d: logits of B differ from A's by %g > %g", i, d, logitTol)
				}
			}
		})
	}
	for i := range prompts {
		if diff := cmp.Diff(want[i], aTokens[i]); diff != "" {
			t.Errorf("prompt %d %q: batched engine differs from llama.cpp's own single-sequence generation (-llama.cpp +engine):\n%s", i, tc.prompts[i], diff)
		}
	}
}

// prefillMix prefills prompts as seqs 1…n, all in the same Prefill calls,
// chunk tokens of each per call (0: whole), and returns the first tokens.
func prefillMix(t *testing.T, e *Engine, prompts [][]int32, chunk int) []int32 {
	t.Helper()
	firsts := make([]int32, len(prompts))
	done := make([]int, len(prompts))
	for {
		var items []engine.PrefillItem
		for i, p := range prompts {
			if done[i] == len(p) {
				continue
			}
			n := len(p) - done[i]
			if chunk > 0 {
				n = min(n, chunk)
			}
			items = append(items, engine.PrefillItem{Seq: engine.SeqID(i + 1), Tokens: p[done[i] : done[i]+n], Last: done[i]+n == len(p)})
			done[i] += n
		}
		if len(items) == 0 {
			return firsts
		}
		outs, err := e.Prefill(context.Background(), items, nil)
		if err != nil {
			t.Fatal(err)
		}
		for j, o := range outs {
			if o.Sampled {
				firsts[int(items[j].Seq)-1] = o.Token
			}
		}
	}
}

// decodeAll decodes seqs 1…n together for steps steps starting from
// firsts, and returns each sequence's tokens (firsts included) and the
// logits of its first decode step.
func decodeAll(t *testing.T, e *Engine, n int, firsts []int32, steps int) ([][]int32, [][]float32) {
	t.Helper()
	toks := make([][]int32, n)
	logits := make([][]float32, n)
	next := append([]int32(nil), firsts...)
	for i := range n {
		toks[i] = []int32{firsts[i]}
	}
	for s := range steps {
		items := make([]engine.DecodeItem, n)
		for i := range n {
			items[i] = engine.DecodeItem{Seq: engine.SeqID(i + 1), Token: next[i]}
		}
		outs, err := e.Decode(context.Background(), items)
		if err != nil {
			t.Fatalf("decode step %d: %v", s, err)
		}
		for i, o := range outs {
			next[i] = o.Token
			toks[i] = append(toks[i], o.Token)
			if s == 0 {
				logits[i] = append([]float32(nil), o.Logits...)
			}
		}
	}
	return toks, logits
}

func maxDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// exportAll exports every layer of seqs 1…n (prompts[i] tokens each):
// [prompt][layer].
func exportAll(t *testing.T, e *Engine, prompts [][]int32) [][][]byte {
	t.Helper()
	raw := make([][][]byte, len(prompts))
	for i, p := range prompts {
		for l := range e.Spec().Layers {
			b, err := e.ExportKV(engine.SeqID(i+1), l, 0, len(p), nil)
			if err != nil {
				t.Fatal(err)
			}
			raw[i] = append(raw[i], b)
		}
	}
	return raw
}

// transfer codes raw (from exportAll) with c as a transfer does and
// imports the decoded KV into e as seqs 1…n; exact demands that the codec
// gave the bytes back unchanged.
func transfer(t *testing.T, e *Engine, raw [][][]byte, c codec.Codec, exact bool) {
	t.Helper()
	dt := e.Spec().KVDType
	for i := range raw {
		for l, r := range raw[i] {
			enc, err := c.Encode(nil, r, dt)
			if err != nil {
				t.Fatal(err)
			}
			dec, err := c.Decode(nil, enc, len(r), dt)
			if err != nil {
				t.Fatal(err)
			}
			if exact && !bytes.Equal(dec, r) {
				t.Fatalf("codec %s: round trip of layer %d changed the KV", c.Name(), l)
			}
			if err := e.ImportKV(engine.SeqID(i+1), l, 0, dec); err != nil {
				t.Fatal(err)
			}
		}
	}
}
