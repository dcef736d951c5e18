package llamacpp

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// BenchmarkCodecsOnKV codes llama.cpp's own KV with every codec that takes
// its dtype: the KV of a 512-token prompt, all layers, exported from the
// engine. It reports the ratio (raw/wire) and, through SetBytes, MB/s of
// one goroutine (one core) for encode and decode. The model is
// $PDSERVE_BENCH_MODEL when set (e.g. mkgguf's qwen2.5-0.5b shape), else
// the tiny qwen2 test model; its weights are random, which shapes the KV's
// value distribution, so ratios on a trained model will differ.
func BenchmarkCodecsOnKV(b *testing.B) {
	for _, kv := range []engine.DType{engine.F16, engine.Q8_0} {
		b.Run(kv.String(), func(b *testing.B) { benchCodecs(b, kv) })
	}
}

func benchCodecs(b *testing.B, kv engine.DType) {
	var e *Engine
	if path := os.Getenv("PDSERVE_BENCH_MODEL"); path != "" {
		_, lib := testModel(b, "qwen2-f16")
		var err error
		if e, err = New(Options{LibDir: lib, Model: path, CtxSize: 1024, KVType: kv}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(e.Close)
	} else {
		e = newTestEngine(b, "llama-q8", func(o *Options) { o.CtxSize, o.KVType = 1024, kv })
	}
	spec := e.Spec()
	p := make([]int32, 512)
	for i := range p {
		p[i] = int32(1000 + (i*7919)%20000)
	}
	if _, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil); err != nil {
		b.Fatal(err)
	}
	var raw []byte
	for l := range spec.Layers {
		var err error
		if raw, err = e.ExportKV(1, l, 0, len(p), raw); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range codec.All() {
		if c.Supports(spec.KVDType) != nil {
			continue
		}
		enc, err := c.Encode(nil, raw, spec.KVDType)
		if err != nil {
			b.Fatal(err)
		}
		ratio := float64(len(raw)) / float64(len(enc))
		b.Run(c.Name()+"/encode", func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			var dst []byte
			for b.Loop() {
				dst, _ = c.Encode(dst[:0], raw, spec.KVDType)
			}
			b.ReportMetric(ratio, "ratio")
		})
		b.Run(c.Name()+"/decode", func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			var dst []byte
			for b.Loop() {
				if dst, err = c.Decode(dst[:0], enc, len(raw), spec.KVDType); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(ratio, "ratio")
		})
	}
}

// countingGrammar counts the full masks a grammar state computes (Sample
// masks only when the unmasked choice is refused).
type countingGrammar struct {
	*Grammar
	masks int
}

func (c *countingGrammar) Mask(l []float32) { c.masks++; c.Grammar.Mask(l) }

// BenchmarkTPOTJSONSchema measures the cost of structured output on
// llama.cpp (issue 28): one sequence decodes under a JSON schema's
// grammar (llama.cpp's grammar sampler) until the grammar ends it, then
// the same number of tokens unconstrained from the same prompt, both
// greedy, 2 threads. It reports both TPOTs (decode time per token, the
// first token's prefill excluded), their ratio, and the share of tokens
// whose unmasked choice the grammar refused (each then costs a mask over
// the vocabulary). The model is $PDSERVE_BENCH_MODEL when set (mkgguf's
// qwen2.5-0.5b shape), else the tiny qwen2 test model; random weights
// choose tokens a trained model would not, so the refused share, and
// with it the ratio, is an upper bound of a trained model's.
func BenchmarkTPOTJSONSchema(b *testing.B) {
	var e *Engine
	if path := os.Getenv("PDSERVE_BENCH_MODEL"); path != "" {
		_, lib := testModel(b, "qwen2-f16")
		var err error
		if e, err = New(Options{LibDir: lib, Model: path, CtxSize: 1024, Threads: 2}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(e.Close)
	} else {
		e = newTestEngine(b, "qwen2-f16", func(o *Options) { o.CtxSize = 1024 })
	}
	gbnf, err := grammar.FromSchema([]byte(`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["name","age","tags"],"additionalProperties":false}`))
	if err != nil {
		b.Fatal(err)
	}
	tok := e.Tokenizer()
	prompt := tok.Encode("Describe a person as JSON:")
	const maxTokens = 200
	ctx := context.Background()
	// decode runs one sequence for up to n tokens (until EOS when
	// constrained) and returns the tokens and the decode time.
	decode := func(seq engine.SeqID, s engine.Sampling, st engine.GrammarState, n int) (int, time.Duration) {
		defer e.Free(seq)
		out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: seq, Tokens: prompt, Last: true, Sampling: s}}, nil)
		if err != nil {
			b.Fatal(err)
		}
		next, count := out[0].Token, 1
		start := time.Now()
		for count < n {
			if st != nil {
				if err := st.Accept(next); err != nil {
					b.Fatalf("token %d against the grammar: %v", next, err)
				}
				if next == tok.EOS() {
					break
				}
			}
			d, err := e.Decode(ctx, []engine.DecodeItem{{Seq: seq, Token: next, Sampling: s}})
			if err != nil {
				b.Fatal(err)
			}
			next = d[0].Token
			count++
		}
		return count, time.Since(start)
	}
	var plain, schema time.Duration
	var tokens, masks int
	seq := engine.SeqID(0)
	for b.Loop() {
		g, err := e.model.NewGrammar(gbnf)
		if err != nil {
			b.Fatal(err)
		}
		cg := &countingGrammar{Grammar: g}
		seq++
		n, d := decode(seq, engine.Sampling{Constraint: cg}, cg, maxTokens)
		g.Close()
		if n < 2 {
			b.Fatalf("the grammar ended after %d token", n)
		}
		schema += d
		masks += cg.masks
		seq++
		_, d = decode(seq, engine.Sampling{}, nil, n)
		plain += d
		tokens += n - 1
	}
	tp, ts := plain.Seconds()*1e3/float64(tokens), schema.Seconds()*1e3/float64(tokens)
	b.ReportMetric(tp, "ms/token-plain")
	b.ReportMetric(ts, "ms/token-schema")
	b.ReportMetric(ts/tp, "ratio")
	b.ReportMetric(float64(masks)/float64(tokens), "masked/token")
}
