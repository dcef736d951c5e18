package ref

import (
	"context"
	"math"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
)

// logitBound is the largest difference allowed between a logit of the
// engine, with any kernel set, and the same logit computed in float64
// (referenceLogits). Portable and SIMD builds round differently (fused
// multiply-adds, summation orders), so their logits may differ by up to
// twice this bound; doc.go states it. The tiny preset's logits are of
// order 3 (the LM head's gain).
const logitBound = 1e-3

// referenceLogits runs the model in float64 over tokens, a sequence from
// its start, and returns the logits of every position. K and V are rounded
// to bfloat16 as the engine stores them; everything else keeps float64.
func referenceLogits(e *Engine, tokens []int32) [][]float64 {
	sp, w := e.spec, e.w
	h, d, n := sp.Hidden, sp.HeadDim, len(tokens)
	qd, kvd, group := sp.Heads*d, sp.KVHeads*d, sp.Heads/sp.KVHeads
	norm := func(v []float64, g []float32) []float64 {
		var ss float64
		for _, a := range v {
			ss += a * a
		}
		s := 1 / math.Sqrt(ss/float64(len(v))+rmsEps)
		out := make([]float64, len(v))
		for i, a := range v {
			out[i] = a * s * float64(g[i])
		}
		return out
	}
	mul := func(m *matrix, v []float64) []float64 {
		out := make([]float64, m.n)
		for r := range out {
			for c := range m.k {
				out[r] += float64(m.at(r, c)) * v[c]
			}
		}
		return out
	}
	rotate := func(v []float64, p int) {
		cs := e.rope[p*d : (p+1)*d]
		for i := 0; i+1 < d; i += 2 {
			c, s := float64(cs[i]), float64(cs[i+1])
			v[i], v[i+1] = v[i]*c-v[i+1]*s, v[i]*s+v[i+1]*c
		}
	}
	x := make([][]float64, n)
	for p, t := range tokens {
		x[p] = make([]float64, h)
		for i := range h {
			x[p][i] = float64(w.embed[int(t)*h+i])
		}
	}
	for l := range sp.Layers {
		lw := &w.layers[l]
		q, k, v := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for p := range n {
			qkv := mul(lw.qkv, norm(x[p], lw.attnNorm))
			q[p], k[p], v[p] = qkv[:qd], qkv[qd:qd+kvd], qkv[qd+kvd:]
			for hq := range sp.Heads {
				rotate(q[p][hq*d:(hq+1)*d], p)
			}
			for kh := range sp.KVHeads {
				rotate(k[p][kh*d:(kh+1)*d], p)
			}
			for i := range kvd {
				k[p][i] = float64(fromBF16(toBF16(float32(k[p][i]))))
				v[p][i] = float64(fromBF16(toBF16(float32(v[p][i]))))
			}
		}
		for p := range n {
			att := make([]float64, qd)
			for hq := range sp.Heads {
				off := hq / group * d
				s := make([]float64, p+1)
				m := math.Inf(-1)
				for j := range s {
					for i := range d {
						s[j] += q[p][hq*d+i] * k[j][off+i]
					}
					s[j] /= math.Sqrt(float64(d))
					m = max(m, s[j])
				}
				var sum float64
				for j := range s {
					s[j] = math.Exp(s[j] - m)
					sum += s[j]
				}
				for j := range s {
					for i := range d {
						att[hq*d+i] += s[j] / sum * v[j][off+i]
					}
				}
			}
			for i, o := range mul(lw.o, att) {
				x[p][i] += o
			}
			gu := mul(lw.gateUp, norm(x[p], lw.mlpNorm))
			hid := make([]float64, sp.Intermediate)
			for i := range hid {
				g := gu[i]
				hid[i] = g / (1 + math.Exp(-g)) * gu[sp.Intermediate+i]
			}
			for i, o := range mul(lw.down, hid) {
				x[p][i] += o
			}
		}
	}
	logits := make([][]float64, n)
	for p := range n {
		logits[p] = mul(w.head, norm(x[p], w.norm))
	}
	return logits
}

// engineLogits prefills tokens with AllLogits on a fresh tiny engine and
// returns a copy of every row's logits.
func engineLogits(t *testing.T, tokens []int32) []float32 {
	t.Helper()
	e, err := New(Options{Preset: "tiny", Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	outs, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: tokens, AllLogits: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), outs[0].AllLogits...)
}

// TestLogitsWithinBound checks every kernel set of the build against the
// float64 model: no logit farther than logitBound from it, so logits of
// the portable and the SIMD builds lie within 2·logitBound of each other.
func TestLogitsWithinBound(t *testing.T) {
	e, err := New(Options{Preset: "tiny", Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tokens := e.Tokenizer().Encode("The reference engine is the oracle; its kernels may round, but only so far.")
	want := referenceLogits(e, tokens)
	for _, set := range kernelSets() {
		t.Run(set, func(t *testing.T) {
			defer useKernels(set)()
			got := engineLogits(t, tokens)
			worst := 0.0
			for p, row := range want {
				for i, w := range row {
					worst = max(worst, math.Abs(float64(got[p*len(row)+i])-w))
				}
			}
			t.Logf("%s: largest |logit − float64 logit| over %d positions: %.3g", set, len(tokens), worst)
			if worst > logitBound {
				t.Errorf("%s: a logit is %.3g from the float64 model, more than %g", set, worst, logitBound)
			}
		})
	}
}
