package ref_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
)

// matmulFLOPs returns the multiply-add FLOPs (2 per weight) of the matrix
// products a step performs: rows tokens through every layer's q/k/v, only
// the sampled rows through the last layer's output projection and MLP
// (the engine skips the rest), and sampled rows through the LM head.
func matmulFLOPs(s engine.ModelSpec, rows, sampled int) float64 {
	qkv := s.Hidden * (s.Heads + 2*s.KVHeads) * s.HeadDim
	rest := s.Heads*s.HeadDim*s.Hidden + 3*s.Hidden*s.Intermediate
	full := (s.Layers-1)*(qkv+rest)*rows + qkv*rows + rest*sampled
	return 2 * float64(full+s.Vocab*s.Hidden*sampled)
}

// attnFLOPs returns the FLOPs of attention for one query row at position
// p in layers layers: for every query head, q·k and the weighted sum of v
// over p+1 keys, 2 FLOPs per element each, so 4·HeadDim per (query head,
// key) pair, as doc.go states. Softmax, norms and the like are not
// counted.
func attnFLOPs(s engine.ModelSpec, p, layers int) float64 {
	return float64(layers) * float64(p+1) * float64(s.Heads*s.HeadDim) * 4
}

func report(b *testing.B, tokens, flops float64) {
	sec := b.Elapsed().Seconds()
	b.ReportMetric(tokens*float64(b.N)/sec, "tokens/s")
	b.ReportMetric(flops*float64(b.N)/sec/1e9, "GFLOP/s")
}

func benchPrompt(n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*7 + i/13) % 256)
	}
	return p
}

// BenchmarkPrefill measures one prompt of 512 tokens in one chunk on the
// small preset: tokens/s and the GFLOP/s of the work done.
func BenchmarkPrefill(b *testing.B) {
	const n = 512
	e := newEngine(b, "small", 0)
	s := e.Spec()
	p := benchPrompt(n)
	flops := matmulFLOPs(s, n, 1)
	for pos := range n {
		flops += attnFLOPs(s, pos, s.Layers-1)
	}
	flops += attnFLOPs(s, n-1, 1)
	b.Run(fmt.Sprintf("small/%s/tokens=%d", ref.Kernel(), n), func(b *testing.B) {
		for b.Loop() {
			if _, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil); err != nil {
				b.Fatal(err)
			}
			e.Free(1)
		}
		report(b, n, flops)
	})
}

// BenchmarkDecode measures decode steps on the small preset for batches of
// 1 and 16 sequences with 256 tokens of context each (the context grows by
// one token a step and is reset every 64 steps, outside the timing).
func BenchmarkDecode(b *testing.B) {
	const ctxLen, reset = 256, 64
	e := newEngine(b, "small", 0)
	s := e.Spec()
	src := newEngine(b, "small", 0)
	if _, err := src.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: benchPrompt(ctxLen), Last: true}}, nil); err != nil {
		b.Fatal(err)
	}
	kv := make([][]byte, s.Layers)
	for l := range kv {
		var err error
		if kv[l], err = src.ExportKV(1, l, 0, ctxLen, nil); err != nil {
			b.Fatal(err)
		}
	}
	load := func(b *testing.B, batch int) {
		for i := range batch {
			seq := engine.SeqID(i)
			e.Free(seq)
			for l := range kv {
				if err := e.ImportKV(seq, l, 0, kv[l]); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	for _, batch := range []int{1, 16} {
		b.Run(fmt.Sprintf("small/%s/batch=%d/context=%d", ref.Kernel(), batch, ctxLen), func(b *testing.B) {
			items := make([]engine.DecodeItem, batch)
			for i := range items {
				items[i] = engine.DecodeItem{Seq: engine.SeqID(i), Token: int32(i)}
			}
			load(b, batch)
			step, flops := 0, 0.0
			for b.Loop() {
				if step == reset {
					b.StopTimer()
					load(b, batch)
					step = 0
					b.StartTimer()
				}
				outs, err := e.Decode(context.Background(), items)
				if err != nil {
					b.Fatal(err)
				}
				for i, o := range outs {
					items[i].Token = o.Token
				}
				flops += matmulFLOPs(s, batch, batch) + float64(batch)*attnFLOPs(s, ctxLen+step, s.Layers)
				step++
			}
			sec := b.Elapsed().Seconds()
			b.ReportMetric(float64(batch*b.N)/sec, "tokens/s")
			b.ReportMetric(flops/sec/1e9, "GFLOP/s")
		})
	}
}
