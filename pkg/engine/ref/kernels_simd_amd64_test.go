//go:build goexperiment.simd && amd64

package ref

import (
	"context"
	"math"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
)

// TestAVX2HeadDim64PathsAgree checks that the register-blocked attention
// paths for head dim 64 compute exactly what the general AVX2 paths do, so
// a model's results do not depend on which of them runs.
func TestAVX2HeadDim64PathsAgree(t *testing.T) {
	if !useAVX2 {
		t.Skip("CPU without AVX2 and FMA")
	}
	const d, keys, stride = 64, 29, 128
	q := make([]float32, d)
	fill(q, uniform(1, 2, 1))
	kv := make([]uint16, keys*stride)
	for i := range kv {
		kv[i] = toBF16(uniform(3, 4, 1)(i))
	}
	sc := make([]float32, keys)
	m := scoresBF16AVX2(sc, q, kv[d:], stride, 0.125)
	for j := range sc {
		if want := dotBF16AVX2(q, kv[d+j*stride:]) * 0.125; math.Float32bits(sc[j]) != math.Float32bits(want) {
			t.Fatalf("score %d = %g, dotBF16AVX2 gives %g", j, sc[j], want)
		}
		if sc[j] > m {
			t.Fatalf("max %g below score %d = %g", m, j, sc[j])
		}
	}
	out := make([]float32, d)
	valuesBF16AVX2(out, sc, 0.5, kv[d:], stride)
	want := make([]float32, d)
	for j, w := range sc {
		axpyBF16AVX2(want, w*0.5, kv[d+j*stride:])
	}
	for i := range out {
		if math.Float32bits(out[i]) != math.Float32bits(want[i]) {
			t.Fatalf("value %d = %g, axpy path gives %g", i, out[i], want[i])
		}
	}
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
