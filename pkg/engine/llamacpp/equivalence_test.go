package llamacpp

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

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
// in one batch. Both are fed llama.cpp's own greedy tokens of each prompt
// alone in a fresh context (GenerateReference; teacher forcing, so that
// every step computes on the same context). B's logits must stay within
// logitTol of A's at every step, and each greedy token of A and B must be
// llama.cpp's, except at a near tie: where the other token's logit is
// within 2×logitTol of the best (each may move by logitTol between batch
// shapes and cache layouts, see logitTol), either may win.
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
		ref, err := a.Model().GenerateReference(p, genTokens, 512, 1, kvType)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = ref
	}

	// A: chunked prefill of all prompts in shared batches.
	firsts := prefillMix(t, a, prompts, tc.chunk)
	aLogits := decodeAll(t, a, firsts, want)
	for i := range prompts {
		for s := range want[i] {
			greedyAgrees(t, fmt.Sprintf("prompt %d %q, token %d: batched engine against llama.cpp's own single-sequence generation", i, tc.prompts[i], s), want[i][s], aLogits[i][s])
		}
	}

	// A fresh A' prefills the same mix, so that the KV exported is the
	// prefill's, before any decode step.
	a2 := newTestEngine(t, model, opts)
	if d := maxDiffAll(firsts, prefillMix(t, a2, prompts, tc.chunk)); d != 0 {
		t.Fatalf("first logits of two identical prefills differ by %g", d)
	}
	raw := exportAll(t, a2, prompts)
	for _, c := range codec.LosslessCodecs() {
		if c.Supports(spec.KVDType) != nil {
			continue
		}
		t.Run(c.Name(), func(t *testing.T) {
			b := newTestEngine(t, model, opts)
			transfer(t, b, raw, c, true)
			bLogits := decodeAll(t, b, firsts, want)
			for i := range prompts {
				for s := 1; s < len(want[i]); s++ {
					if d := maxDiff(aLogits[i][s], bLogits[i][s]); d > logitTol {
						t.Errorf("prompt %d, token %d: logits of B differ from A's by %g > %g", i, s, d, logitTol)
					}
					greedyAgrees(t, fmt.Sprintf("prompt %d, token %d: imported KV against the engine alone", i, s), argmax(aLogits[i][s]), bLogits[i][s])
				}
			}
		})
	}
}

// greedyAgrees fails unless the greedy token of logits is want, or a token
// whose logit is within 2×logitTol of want's (a near tie; logged).
func greedyAgrees(t *testing.T, what string, want int32, logits []float32) {
	t.Helper()
	got := argmax(logits)
	if got == want {
		return
	}
	lead := float64(logits[got]) - float64(logits[want])
	if lead <= 2*logitTol {
		t.Logf("%s: token %d, want %d: a near tie (logits %v and %v)", what, got, want, logits[got], logits[want])
		return
	}
	t.Errorf("%s: token %d, want %d (its logit %v leads %v by %.3g > 2×%g)", what, got, want, logits[got], logits[want], lead, logitTol)
}

func argmax(l []float32) int32 {
	best := 0
	for i, v := range l {
		if v > l[best] {
			best = i
		}
	}
	return int32(best)
}

// prefillMix prefills prompts as seqs 1…n, all in the same Prefill calls,
// chunk tokens of each per call (0: whole), and returns the logits each
// prompt's first token is drawn from.
func prefillMix(t *testing.T, e *Engine, prompts [][]int32, chunk int) [][]float32 {
	t.Helper()
	firsts := make([][]float32, len(prompts))
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
				firsts[int(items[j].Seq)-1] = slices.Clone(o.Logits)
			}
		}
	}
}

// decodeAll decodes seqs 1…n together, fed feed[i][0…] (teacher
// forcing), and returns each sequence's logits per token of feed: firsts
// (the prefill's), then those of each step.
func decodeAll(t *testing.T, e *Engine, firsts [][]float32, feed [][]int32) [][][]float32 {
	t.Helper()
	n := len(feed)
	logits := make([][][]float32, n)
	for i := range n {
		logits[i] = [][]float32{firsts[i]}
	}
	for s := 0; s+1 < len(feed[0]); s++ {
		items := make([]engine.DecodeItem, n)
		for i := range n {
			items[i] = engine.DecodeItem{Seq: engine.SeqID(i + 1), Token: feed[i][s]}
		}
		outs, err := e.Decode(context.Background(), items)
		if err != nil {
			t.Fatalf("decode step %d: %v", s, err)
		}
		for i, o := range outs {
			logits[i] = append(logits[i], slices.Clone(o.Logits))
		}
	}
	return logits
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

func maxDiffAll(a, b [][]float32) float64 {
	d := 0.0
	for i := range a {
		d = max(d, maxDiff(a[i], b[i]))
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
