package ref

import (
	"fmt"
	"math"
	"runtime"
	"testing"
)

// naiveMatmul is the textbook product in float64, the accuracy reference.
func naiveMatmul(x []float32, rows int, w *matrix) []float64 {
	y := make([]float64, rows*w.n)
	for r := range rows {
		for c := range w.n {
			var s float64
			for i := range w.k {
				s += float64(x[r*w.k+i]) * float64(w.at(c, i))
			}
			y[r*w.n+c] = s
		}
	}
	return y
}

func testMatrix(n, k int, seed uint64) *matrix {
	return newMatrix(n, k, rowMajor(k, uniform(seed, 7, 1)))
}

func testActivations(rows, k int, seed uint64) []float32 {
	x := make([]float32, rows*k)
	fill(x, uniform(seed, 8, 1))
	return x
}

func TestMatmulMatchesNaive(t *testing.T) {
	for _, threads := range []int{1, 3} {
		p := newPool(threads)
		defer p.close()
		for _, shape := range []struct{ rows, n, k int }{
			{1, 1, 1}, {1, 17, 5}, {2, 16, 64}, {3, 33, 40}, {5, 4, 7}, {7, 100, 129}, {70, 50, 64}, {130, 19, 33},
		} {
			t.Run(fmt.Sprintf("threads %d rows %d n %d k %d", threads, shape.rows, shape.n, shape.k), func(t *testing.T) {
				w := testMatrix(shape.n, shape.k, 1)
				x := testActivations(shape.rows, shape.k, 2)
				want := naiveMatmul(x, shape.rows, w)
				// A wider y checks that columns past n are left alone.
				ldy := shape.n + 3
				y := make([]float32, shape.rows*ldy)
				for i := range y {
					y[i] = 0.5
				}
				j := matmulJob{y: y, ldy: ldy, x: x, ldx: shape.k, rows: shape.rows, w: w, add: true}
				p.matmul(&j)
				tol := 1e-5 * float64(shape.k)
				for r := range shape.rows {
					for c := range ldy {
						got := float64(y[r*ldy+c])
						if c >= shape.n {
							if got != 0.5 {
								t.Fatalf("y[%d][%d] past n = %v, want untouched 0.5", r, c, got)
							}
							continue
						}
						if math.Abs(got-0.5-want[r*shape.n+c]) > tol {
							t.Fatalf("y[%d][%d] = %v, want 0.5 + %v", r, c, got, want[r*shape.n+c])
						}
					}
				}
			})
		}
	}
}

// TestMatmulRowIndependent checks the property the engine's equivalences
// rest on: a row's result is bit-identical whatever batch it is part of
// and however the work is split.
func TestMatmulRowIndependent(t *testing.T) {
	const n, k, rows = 40, 96, 75
	w := testMatrix(n, k, 3)
	x := testActivations(rows, k, 4)
	all := make([]float32, rows*n)
	p := newPool(4)
	defer p.close()
	p.matmul(&matmulJob{y: all, ldy: n, x: x, ldx: k, rows: rows, w: w})
	one := newPool(1)
	defer one.close()
	for r := range rows {
		y := make([]float32, n)
		one.matmul(&matmulJob{y: y, ldy: n, x: x[r*k:], ldx: k, rows: 1, w: w})
		for c := range n {
			if math.Float32bits(y[c]) != math.Float32bits(all[r*n+c]) {
				t.Fatalf("row %d col %d: alone %v, in a batch of %d %v", r, c, y[c], rows, all[r*n+c])
			}
		}
	}
}

// TestPanelKernelGoSumsInOrder pins the portable kernel's arithmetic:
// every element must be the plain float32 sum from i = 0 upwards, with each
// product rounded, bit for bit, whatever the row count, the k remainder of
// its unrolled loop or the column within the panel. Logits, and the
// equivalences between engines, depend on exactly this order.
func TestPanelKernelGoSumsInOrder(t *testing.T) {
	for _, shape := range []struct{ rows, n, k int }{
		{1, nr, 0}, {1, 1, 1}, {2, nr + 1, 3}, {3, 2 * nr, 4}, {1, nr - 1, 5}, {2, nr, 8}, {3, 3*nr - 2, 9}, {5, 2 * nr, 64}, {4, nr + 2, 131},
	} {
		for _, add := range []bool{false, true} {
			t.Run(fmt.Sprintf("rows %d n %d k %d add %v", shape.rows, shape.n, shape.k, add), func(t *testing.T) {
				w := testMatrix(shape.n, shape.k, 9)
				x := testActivations(shape.rows, shape.k, 10)
				// A row of zeros (products of both signs of zero) checks
				// that no sum comes out as -0, where the plain sum is +0.
				if shape.rows > 1 {
					clear(x[shape.k : 2*shape.k])
				}
				ldy := panels(shape.n)*nr + 1
				y := make([]float32, shape.rows*ldy)
				for i := range y {
					y[i] = 0.75
				}
				for p := range panels(shape.n) {
					c0 := p * nr
					panelKernelGo(y[c0:], ldy, x, shape.k, shape.rows, w.panel(p), shape.k, min(nr, shape.n-c0), add)
				}
				for r := range shape.rows {
					for c := range ldy {
						want := float32(0.75)
						if c < shape.n {
							var s float32
							for i := range shape.k {
								s += float32(x[r*shape.k+i] * w.at(c, i))
							}
							if want = s; add {
								want = 0.75 + s
							}
						}
						if got := y[r*ldy+c]; math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("y[%d][%d] = %g (%#08x), want %g (%#08x)", r, c, got, math.Float32bits(got), want, math.Float32bits(want))
						}
					}
				}
			})
		}
	}
}

// BenchmarkMatmul measures the matmul on shapes of the small preset: the
// MLP up-projection (gate and up, n = 2816) for a decode batch of 1 and 16
// and a prefill block of 128 rows, and the down-projection (k = 1408).
// The names do not say which kernel set runs (the log does), so that a
// portable and a SIMD run compare benchmark by benchmark.
func BenchmarkMatmul(b *testing.B) {
	b.Logf("kernels: %s", Kernel())
	for _, shape := range []struct{ rows, n, k int }{{1, 2816, 512}, {16, 2816, 512}, {128, 2816, 512}, {128, 512, 1408}} {
		b.Run(fmt.Sprintf("rows=%d/n=%d/k=%d", shape.rows, shape.n, shape.k), func(b *testing.B) {
			w := testMatrix(shape.n, shape.k, 1)
			x := testActivations(shape.rows, shape.k, 2)
			y := make([]float32, shape.rows*shape.n)
			// As many workers as the engine's default: -cpu 1 measures one
			// core, -cpu 2 two.
			p := newPool(runtime.GOMAXPROCS(0))
			defer p.close()
			j := matmulJob{y: y, ldy: shape.n, x: x, ldx: shape.k, rows: shape.rows, w: w}
			for b.Loop() {
				p.matmul(&j)
			}
			flops := 2 * float64(shape.rows*shape.n*shape.k) * float64(b.N)
			b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
