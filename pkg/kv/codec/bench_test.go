package codec_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// refPrompt is the prompt whose KV the engine-backed benchmarks compress.
const refPrompt = `Disaggregated serving runs the prefill of a prompt on one pool of
GPUs and the decoding of its tokens on another, so that neither phase slows
the other down. The price is that the KV cache of every prompt has to cross
the network between the pools, layer by layer, while the prefill is still
running. `

// exportRefKV prefills tokens tokens (the prompt text repeated) on a
// reference engine of preset and returns the canonical KV of every layer, one
// chunk per layer, as ExportKV hands it out.
func exportRefKV(preset string, tokens int) ([][]byte, error) {
	e, err := ref.New(ref.Options{Preset: preset, Seed: 1})
	if err != nil {
		return nil, err
	}
	defer e.Close()
	ids := e.Tokenizer().Encode(strings.Repeat(refPrompt, tokens/len(refPrompt)+1))[:tokens]
	const seq = engine.SeqID(1)
	defer e.Free(seq)
	streamed := 0
	_, err = e.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: ids, Last: true}},
		func(c engine.KVChunk) error { streamed += len(c.Data); return nil })
	if err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	layers := make([][]byte, e.Spec().Layers)
	exported := 0
	for l := range layers {
		if layers[l], err = e.ExportKV(seq, l, 0, tokens, nil); err != nil {
			return nil, fmt.Errorf("export layer %d: %w", l, err)
		}
		exported += len(layers[l])
	}
	if streamed != exported {
		return nil, fmt.Errorf("prefill streamed %d KV bytes, export gave %d", streamed, exported)
	}
	return layers, nil
}

// refKV is the benchmark corpus: 512 tokens of the "small" preset (10 layers
// of 256 KiB), built once per test binary.
var refKV = sync.OnceValues(func() ([][]byte, error) { return exportRefKV("small", 512) })

func mustRefKV(b *testing.B) [][]byte {
	kv, err := refKV()
	if err != nil {
		b.Fatalf("reference engine KV: %v", err)
	}
	return kv
}

// gaussianKV is the synthetic corpus: ten 256 KiB chunks of Gaussian bf16.
var gaussianKV = sync.OnceValue(func() [][]byte {
	chunks := make([][]byte, 10)
	for i := range chunks {
		chunks[i] = gaussianBF16(128<<10, 128, uint64(i))
	}
	return chunks
})

// gaussianKVF16 is gaussianKV's values rounded to f16 instead of bf16.
var gaussianKVF16 = sync.OnceValue(func() [][]byte {
	chunks := make([][]byte, 10)
	for i := range chunks {
		chunks[i] = gaussianF16(128<<10, 128, uint64(i))
	}
	return chunks
})

// kvLikeQ80 is the q8_0 corpus: ten chunks of rows of 128 kv-like values
// quantized as llama.cpp does (≈136 KiB each, from 128 Ki values).
var kvLikeQ80 = sync.OnceValue(func() [][]byte {
	chunks := make([][]byte, 10)
	for i := range chunks {
		chunks[i] = q80Rows(kvLikeF32(128<<10, 128, uint64(i)))
	}
	return chunks
})

// BenchmarkCodecRefKV measures every codec on KV exported from the
// reference engine (bf16): MB/s of raw bytes and the compression ratio.
// One goroutine: the figures are per core.
func BenchmarkCodecRefKV(b *testing.B) { benchCodecs(b, mustRefKV(b), engine.BF16) }

// BenchmarkCodecGaussian measures every codec on synthetic Gaussian bf16.
func BenchmarkCodecGaussian(b *testing.B) { benchCodecs(b, gaussianKV(), engine.BF16) }

// BenchmarkCodecGaussianF16 measures every codec on the same Gaussian
// values as BenchmarkCodecGaussian, stored as f16 (llama.cpp's default KV
// type): the two dtypes side by side.
func BenchmarkCodecGaussianF16(b *testing.B) { benchCodecs(b, gaussianKVF16(), engine.F16) }

// BenchmarkCodecQ80 measures the codecs that take q8_0 KV (none, s2, zstd).
func BenchmarkCodecQ80(b *testing.B) { benchCodecs(b, kvLikeQ80(), engine.Q8_0) }

// benchCodecs runs every codec that takes dt on chunks.
func benchCodecs(b *testing.B, chunks [][]byte, dt engine.DType) {
	total := 0
	for _, c := range chunks {
		total += len(c)
	}
	for _, c := range codec.All() {
		if c.Supports(dt) != nil {
			continue
		}
		encoded := make([][]byte, len(chunks))
		encTotal := 0
		for i, raw := range chunks {
			enc, err := c.Encode(nil, raw, dt)
			if err != nil {
				b.Fatal(err)
			}
			encoded[i] = enc
			encTotal += len(enc)
		}
		ratio := float64(total) / float64(encTotal)
		b.Run(c.Name()+"/encode", func(b *testing.B) {
			b.SetBytes(int64(total))
			var dst []byte
			var err error
			defer codec.CPUThroughput(b, total)()
			for b.Loop() {
				for _, raw := range chunks {
					if dst, err = c.Encode(dst[:0], raw, dt); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(ratio, "ratio")
		})
		b.Run(c.Name()+"/decode", func(b *testing.B) {
			b.SetBytes(int64(total))
			var dst []byte
			var err error
			defer codec.CPUThroughput(b, total)()
			for b.Loop() {
				for i, enc := range encoded {
					if dst, err = c.Decode(dst[:0], enc, len(chunks[i]), dt); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(ratio, "ratio")
		})
	}
}

// BenchmarkFrameRefKV measures whole frames (codec, CRC-32C, header checks)
// on the reference engine's KV, encode and decode in one op.
func BenchmarkFrameRefKV(b *testing.B) {
	chunks := mustRefKV(b)
	total := 0
	for _, c := range chunks {
		total += len(c)
	}
	h := codec.Header{RequestID: "bench", End: 512, DType: engine.BF16}
	for _, name := range []string{"none", "bf16"} {
		c, _ := codec.ByName(name)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(total))
			var frame, out []byte
			var err error
			defer codec.CPUThroughput(b, total)()
			for b.Loop() {
				for l, raw := range chunks {
					h.Layer = uint32(l)
					if frame, err = codec.AppendFrame(frame[:0], h, c, raw); err != nil {
						b.Fatal(err)
					}
					if _, out, _, err = codec.DecodeFrame(out[:0], frame, len(raw)); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
