package llamacpp

import (
	"context"
	"os"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
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
