//go:build goexperiment.simd && amd64

package ref

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
)

// kernelSets returns the kernel sets this CPU can run in this build: the
// SIMD ones and the portable one, which computes here exactly what it
// computes in the portable build (its results do not depend on the panel
// width).
func kernelSets() []string {
	switch {
	case useAVX512:
		return []string{"avx512", "avx2", "go"}
	case useAVX2:
		return []string{"avx2", "go"}
	}
	return []string{"go"}
}

// useKernels makes set (one of kernelSets) the active kernel set and
// returns the function that restores the previous one.
func useKernels(set string) (restore func()) {
	avx2, avx512 := useAVX2, useAVX512
	useAVX2, useAVX512 = set != "go", set == "avx512"
	return func() { useAVX2, useAVX512 = avx2, avx512 }
}

// TestPortableKernelWithWidePanels covers the fallback for CPUs without
// AVX2 in this build, whose panels are 16 wide.
func TestPortableKernelWithWidePanels(t *testing.T) {
	for _, shape := range []struct{ rows, n, k int }{{1, 16, 3}, {3, 21, 40}, {6, 40, 17}} {
		w := testMatrix(shape.n, shape.k, 5)
		x := testActivations(shape.rows, shape.k, 6)
		want := naiveMatmul(x, shape.rows, w)
		y := make([]float32, shape.rows*shape.n)
		for p := range panels(shape.n) {
			c0 := p * nr
			panelKernelGo(y[c0:], shape.n, x, shape.k, shape.rows, w.panel(p), shape.k, min(nr, shape.n-c0), false)
		}
		for i, v := range y {
			if math.Abs(float64(v)-want[i]) > 1e-5*float64(shape.k) {
				t.Fatalf("rows %d n %d k %d: y[%d] = %g, want %g", shape.rows, shape.n, shape.k, i, v, want[i])
			}
		}
	}
}

// TestExpSubMatchesGo checks that the vector expf gives every element the
// bits of the scalar one (the same operations), the sum differing only by
// its order of addition.
func TestExpSubMatchesGo(t *testing.T) {
	if !useAVX2 {
		t.Skip("CPU without AVX2 and FMA")
	}
	for _, n := range []int{1, 7, 8, 9, 64, 100} {
		s := make([]float32, n)
		fill(s, uniform(5, uint64(n), 10))
		a, b := slices.Clone(s), slices.Clone(s)
		sa, sb := expSubAVX2(a, 3), expSubGo(b, 3)
		if !slices.Equal(a, b) {
			t.Fatalf("n %d: expSubAVX2 elements differ from expSubGo", n)
		}
		if math.Abs(float64(sa-sb)) > 1e-6*math.Abs(float64(sb)) {
			t.Errorf("n %d: expSubAVX2 sum %g, expSubGo %g", n, sa, sb)
		}
	}
}

// TestPackingMatchesGo checks the vector packing of keys and values
// against the portable one, bit for bit, for key counts around the blocks
// of eight and head dims around the panel width.
func TestPackingMatchesGo(t *testing.T) {
	if !useAVX2 {
		t.Skip("CPU without AVX2 and FMA")
	}
	for _, d := range []int{8, 24, 64} {
		for _, keys := range []int{1, 7, 8, 13, nr} {
			stride := 3 * d
			kv := make([]uint16, nr*stride)
			for i := range kv {
				kv[i] = toBF16(uniform(14, uint64(d), 1)(i))
			}
			a, b := make([]float32, d*nr), make([]float32, d*nr)
			fill(a, uniform(15, 1, 1)) // stale data the packing must overwrite
			packKeysAVX2(a, kv[d:], stride, keys, d)
			packKeysGo(b, kv[d:], stride, 0, keys, d)
			if !slices.Equal(a, b) {
				t.Fatalf("d %d keys %d: packKeysAVX2 differs from packKeysGo", d, keys)
			}
			a, b = make([]float32, keys*nr), make([]float32, keys*nr)
			fill(a, uniform(16, 1, 1))
			packValuesAVX2(a, kv[d:], stride, keys, min(d, nr))
			packValuesGo(b, kv[d:], stride, keys, min(d, nr))
			if !slices.Equal(a, b) {
				t.Fatalf("d %d keys %d: packValuesAVX2 differs from packValuesGo", d, keys)
			}
		}
	}
}

// TestAVX512MatchesAVX2 checks that the two vector matmul kernels give
// bit-identical results, so workers on CPUs with and without AVX-512
// compute the same logits.
func TestAVX512MatchesAVX2(t *testing.T) {
	if !useAVX512 {
		t.Skip("CPU without AVX-512")
	}
	for _, shape := range []struct{ rows, n, k int }{{1, 32, 5}, {5, 70, 64}, {9, 33, 130}} {
		w := testMatrix(shape.n, shape.k, 7)
		x := testActivations(shape.rows, shape.k, 8)
		a := make([]float32, shape.rows*shape.n)
		b := make([]float32, shape.rows*shape.n)
		for i := range a {
			a[i], b[i] = 0.25, 0.25
		}
		for p := range panels(shape.n) {
			c0 := p * nr
			ncols := min(nr, shape.n-c0)
			panelKernelAVX512(a[c0:], shape.n, x, shape.k, shape.rows, w.panel(p), shape.k, ncols, true)
			for c := 0; c < ncols; c += 16 {
				panelKernelAVX2(b[c0+c:], shape.n, x, shape.k, shape.rows, w.panel(p)[c:], shape.k, min(16, ncols-c), true)
			}
		}
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("rows %d n %d k %d: element %d: avx512 %g, avx2 %g", shape.rows, shape.n, shape.k, i, a[i], b[i])
			}
		}
	}
}

// TestEngineSameLogitsWithAVX2 runs a prompt through the engine with the
// AVX-512 and then the AVX2 matmul: the logits must be bit-identical.
func TestEngineSameLogitsWithAVX2(t *testing.T) {
	if !useAVX512 {
		t.Skip("CPU without AVX-512")
	}
	run := func() []float32 {
		e, err := New(Options{Preset: "tiny", Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		outs, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: e.Tokenizer().Encode("kernel parity, kernel parity"), Last: true}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), outs[0].Logits...)
	}
	a := run()
	useAVX512 = false
	defer func() { useAVX512 = true }()
	b := run()
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("logit %d: avx512 %g, avx2 %g", i, a[i], b[i])
		}
	}
}

// BenchmarkMatmulAVX2 is BenchmarkMatmul with the AVX-512 kernel turned
// off, for CPUs that lack it.
func BenchmarkMatmulAVX2(b *testing.B) {
	if !useAVX512 {
		b.Skip("AVX2 is already the active kernel")
	}
	useAVX512 = false
	defer func() { useAVX512 = true }()
	BenchmarkMatmul(b)
}
