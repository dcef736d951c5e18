package ref

import (
	"fmt"
	"math"
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

// BenchmarkMatmul measures the kernel on shapes of the small preset.
func BenchmarkMatmul(b *testing.B) {
	for _, shape := range []struct{ rows, n, k int }{{1, 2816, 512}, {16, 2816, 512}, {128, 2816, 512}, {128, 512, 1408}} {
		b.Run(fmt.Sprintf("%s/rows=%d/n=%d/k=%d", Kernel(), shape.rows, shape.n, shape.k), func(b *testing.B) {
			w := testMatrix(shape.n, shape.k, 1)
			x := testActivations(shape.rows, shape.k, 2)
			y := make([]float32, shape.rows*shape.n)
			p := newPool(0)
			defer p.close()
			p = newPool(2)
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
