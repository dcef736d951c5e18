package peerpull

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/engine/sim"
)

const bt = 16 // block tokens

func noLock() func() { return func() {} }

// honest prefills prompt on eng (sequence 1, freed after) and returns
// every layer's canonical KV of its first n tokens: what an honest peer
// sends.
func honest(t testing.TB, eng engine.Engine, prompt []int32, n int) [][]byte {
	t.Helper()
	if _, err := eng.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: prompt, Last: true}}, nil); err != nil {
		t.Fatal(err)
	}
	defer eng.Free(1)
	layers := make([][]byte, eng.Spec().Layers)
	for l := range layers {
		var err error
		if layers[l], err = eng.ExportKV(1, l, 0, n, nil); err != nil {
			t.Fatal(err)
		}
	}
	return layers
}

func testPrompt(n int, seed int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = (seed*31 + int32(i)*7) % 250
	}
	return p
}

// poison returns a copy of layers (the canonical KV of n tokens each)
// with the rows of block b flipped in the layers l for which only(l).
func poison(layers [][]byte, n, b int, only func(l int) bool) [][]byte {
	out := make([][]byte, len(layers))
	for l, data := range layers {
		d := slices.Clone(data)
		if only(l) {
			row := len(d) / (2 * n)
			for _, half := range []int{0, n} { // K rows, then V rows
				for i := (half + b*bt) * row; i < (half+(b+1)*bt)*row; i++ {
					d[i] ^= 0x5a
				}
			}
		}
		out[l] = d
	}
	return out
}

func all(int) bool { return true }

func TestSampleBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ n, k, want int }{{1, 1, 1}, {8, 1, 1}, {8, 3, 3}, {4, 9, 4}, {5, 0, 0}, {0, 2, 0}} {
		for range 20 {
			got := SampleBlocks(tc.n, tc.k, r.IntN)
			if len(got) != tc.want || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
				t.Fatalf("SampleBlocks(%d, %d) = %v: want %d distinct sorted blocks", tc.n, tc.k, got, tc.want)
			}
			if tc.want > 0 && got[len(got)-1] != tc.n-1 {
				t.Fatalf("SampleBlocks(%d, %d) = %v: want the last block", tc.n, tc.k, got)
			}
			for _, b := range got {
				if b < 0 || b >= tc.n {
					t.Fatalf("SampleBlocks(%d, %d) = %v: block outside [0, %d)", tc.n, tc.k, got, tc.n)
				}
			}
		}
	}
}

// TestVerifyRef: on the ref engine, honest KV matches bit for bit in
// every block; a block's KV flipped in every layer is caught by checking
// that block or the last one (its recomputation attends the flipped
// rows); a block flipped in the last layer only is caught where that
// block is checked, not by a later one (no later KV depends on the last
// layer's): the residual risk the default sampling takes.
func TestVerifyRef(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", Seed: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	const n = 6 * bt
	p := testPrompt(n+5, 3)
	good := honest(t, eng, p, n)
	last := eng.Spec().Layers - 1
	for _, tc := range []struct {
		name   string
		layers [][]byte
		blocks []int
		want   bool
	}{
		{"honest, every block", good, []int{0, 1, 2, 3, 4, 5}, true},
		{"honest, the last block", good, []int{5}, true},
		{"all layers of block 0, the last block checked", poison(good, n, 0, all), []int{5}, false},
		{"all layers of block 3, the last block checked", poison(good, n, 3, all), []int{5}, false},
		{"all layers of block 5, the last block checked", poison(good, n, 5, all), []int{5}, false},
		{"all layers of block 3, block 2 checked", poison(good, n, 3, all), []int{2}, true},
		{"the last layer of block 2, the last block checked", poison(good, n, 2, func(l int) bool { return l == last }), []int{5}, true},
		{"the last layer of block 2, block 2 checked", poison(good, n, 2, func(l int) bool { return l == last }), []int{2, 5}, false},
	} {
		ok, tokens, err := Verify(context.Background(), eng, noLock, p, tc.layers, n, bt, tc.blocks)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if ok != tc.want || tokens != len(tc.blocks)*bt {
			t.Errorf("%s: match %v after %d tokens, want %v after %d", tc.name, ok, tokens, tc.want, len(tc.blocks)*bt)
		}
	}
	if _, _, err := Verify(context.Background(), eng, noLock, p, good, n, bt, []int{6}); err == nil {
		t.Error("a block outside the pulled tokens: no error")
	}
	if _, _, err := Verify(context.Background(), eng, noLock, p, good[:1], n, bt, []int{5}); err == nil {
		t.Error("too few layers: no error")
	}
}

// TestVerifySim: the sim engine's KV is a function of the tokens, so a
// block recomputed from imported KV matches the peer's bit for bit, at a
// scaled-down payload too; a flipped block does not.
func TestVerifySim(t *testing.T) {
	eng, err := sim.New(sim.Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 1e-6, PayloadScale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	const n = 4 * bt
	p := testPrompt(n+3, 5)
	good := honest(t, eng, p, n)
	if ok, _, err := Verify(context.Background(), eng, noLock, p, good, n, bt, []int{0, 1, 2, 3}); err != nil || !ok {
		t.Errorf("honest KV: match %v, %v; want a match", ok, err)
	}
	if ok, _, err := Verify(context.Background(), eng, noLock, p, poison(good, n, 3, all), n, bt, []int{3}); err != nil || ok {
		t.Errorf("a flipped block: match %v, %v; want none", ok, err)
	}
}

func half(f float32) []byte {
	// f is exactly representable in f16 in these tests: 1.0 = 0x3c00,
	// 1.0009765625 = 0x3c01, 2.0 = 0x4000.
	var h uint16
	switch f {
	case 1:
		h = 0x3c00
	case 1.0009765625:
		h = 0x3c01
	case 2:
		h = 0x4000
	default:
		panic(fmt.Sprint("no f16 for ", f))
	}
	return binary.LittleEndian.AppendUint16(nil, h)
}

// TestMatch: bf16 and q8_0 match byte for byte; f16 within its
// tolerance (an ulp passes, a doubled value does not).
func TestMatch(t *testing.T) {
	if !Match(engine.BF16, []byte{1, 2}, []byte{1, 2}) || Match(engine.BF16, []byte{1, 2}, []byte{1, 3}) || Match(engine.Q8_0, []byte{1}, []byte{2}) {
		t.Error("bf16, q8_0: want byte-for-byte equality")
	}
	if !Match(engine.F16, half(1), half(1.0009765625)) {
		t.Error("f16: one ulp apart does not match")
	}
	if Match(engine.F16, half(1), half(2)) {
		t.Error("f16: 1 and 2 match")
	}
	if Match(engine.F16, half(1), append(half(1), half(1)...)) {
		t.Error("lengths differ: match")
	}
}

// BenchmarkSpotCheck measures the spot check on the ref engine's tiny
// preset (one thread) for a pulled prefix of 512 tokens (32
// blocks), against the two alternatives it sits between: computing the
// prefix (prefill) and importing it as pulled (import). Each check
// sub-benchmark recomputes k blocks (the last, then random others) of KV
// poisoned as mode says, a block chosen at random each iteration, and
// reports the fraction it caught (caught/op) and the prompt tokens it
// recomputed (tokens/op):
//
//	go test -run '^$' -bench SpotCheck -benchtime 100x ./pkg/peerpull/
func BenchmarkSpotCheck(b *testing.B) {
	eng, err := ref.New(ref.Options{Preset: "tiny", Seed: 1, Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	const blocks = 32
	const n = blocks * bt
	p := testPrompt(n+1, 3)
	good := honest(b, eng, p, n)
	last := eng.Spec().Layers - 1
	bad := poisonAll(good, n)
	b.Run("prefill", func(b *testing.B) {
		for i := range b.N {
			seq := engine.SeqID(100 + i)
			if _, err := eng.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: p[:n]}}, nil); err != nil {
				b.Fatal(err)
			}
			eng.Free(seq)
		}
		b.ReportMetric(n, "tokens/op")
	})
	b.Run("import", func(b *testing.B) {
		for i := range b.N {
			seq := engine.SeqID(100 + i)
			for l, data := range good {
				if err := eng.ImportKV(seq, l, 0, data); err != nil {
					b.Fatal(err)
				}
			}
			eng.Free(seq)
		}
	})
	modes := []struct {
		name string
		kv   func(b int) [][]byte
	}{
		{"honest", func(int) [][]byte { return good }},
		{"all-blocks", func(int) [][]byte { return bad }},
		{"one-block", func(blk int) [][]byte { return poison(good, n, blk, all) }},
		{"one-block-last-layer", func(blk int) [][]byte { return poison(good, n, blk, func(l int) bool { return l == last }) }},
	}
	for _, k := range []int{1, 2, 4, 8} {
		for _, m := range modes {
			b.Run(fmt.Sprintf("k=%d/%s", k, m.name), func(b *testing.B) {
				r := rand.New(rand.NewPCG(uint64(k), 7))
				var caught, tokens int
				for range b.N {
					b.StopTimer()
					kv := m.kv(r.IntN(blocks))
					sample := SampleBlocks(blocks, k, r.IntN)
					b.StartTimer()
					ok, t, err := Verify(context.Background(), eng, noLock, p, kv, n, bt, sample)
					if err != nil {
						b.Fatal(err)
					}
					tokens += t
					if !ok {
						caught++
					}
				}
				b.ReportMetric(float64(caught)/float64(b.N), "caught/op")
				b.ReportMetric(float64(tokens)/float64(b.N), "tokens/op")
			})
		}
	}
}

// poisonAll flips every block of every layer.
func poisonAll(layers [][]byte, n int) [][]byte {
	out := layers
	for blk := range n / bt {
		out = poison(out, n, blk, all)
	}
	return out
}
