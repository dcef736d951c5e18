package ref

import (
	"fmt"
	"math"
	"testing"
)

// attnCase is a KV head and its queries for the attention tests: kv holds
// tokens × stride bf16 values with the head at offset off.
type attnCase struct {
	d, group, tokens, stride, off int
	k, v                          []uint16
	q                             []float32 // tokens × group × d
}

func newAttnCase(d, group, tokens int, seed uint64) *attnCase {
	c := &attnCase{d: d, group: group, tokens: tokens, stride: 3 * d, off: d}
	c.k = make([]uint16, tokens*c.stride)
	c.v = make([]uint16, tokens*c.stride)
	for i := range c.k {
		c.k[i] = toBF16(uniform(seed, 1, 1)(i))
		c.v[i] = toBF16(uniform(seed, 2, 1)(i))
	}
	c.q = make([]float32, tokens*group*d)
	fill(c.q, uniform(seed, 3, 1))
	return c
}

// attend runs attnScratch.attend for query rows [r0, r1) and returns
// their outputs (rows × group × d).
func (c *attnCase) attend(a *attnScratch, r0, r1 int) []float32 {
	ld := c.group * c.d
	a.pack(c.k, c.v, c.off, c.stride, r1, c.d)
	out := make([]float32, (r1-r0)*ld)
	a.attend(out, ld, c.q[r0*ld:], ld, r1-r0, r0, c.group, c.d)
	return out
}

// naive returns the attention output of query head g of row r in float64.
func (c *attnCase) naive(r, g int) []float64 {
	q := c.q[(r*c.group+g)*c.d:]
	s := make([]float64, r+1)
	m := math.Inf(-1)
	for j := range s {
		for i := range c.d {
			s[j] += float64(q[i]) * float64(fromBF16(c.k[j*c.stride+c.off+i]))
		}
		s[j] /= math.Sqrt(float64(c.d))
		m = max(m, s[j])
	}
	var sum float64
	for j := range s {
		s[j] = math.Exp(s[j] - m)
		sum += s[j]
	}
	out := make([]float64, c.d)
	for j := range s {
		for i := range out {
			out[i] += s[j] / sum * float64(fromBF16(c.v[j*c.stride+c.off+i]))
		}
	}
	return out
}

// TestAttendMatchesNaive checks the matrix form of attention against the
// textbook formula in float64, for head dims and key counts on both sides
// of the panel width.
func TestAttendMatchesNaive(t *testing.T) {
	for _, shape := range []struct{ d, group, tokens int }{{16, 2, 1}, {16, 2, 9}, {64, 4, 40}, {24, 1, 70}, {5, 3, 33}} {
		t.Run(fmt.Sprintf("d %d group %d tokens %d", shape.d, shape.group, shape.tokens), func(t *testing.T) {
			c := newAttnCase(shape.d, shape.group, shape.tokens, 1)
			var a attnScratch
			got := c.attend(&a, 0, shape.tokens)
			for r := range shape.tokens {
				for g := range shape.group {
					want := c.naive(r, g)
					for i, w := range want {
						if v := got[(r*shape.group+g)*shape.d+i]; math.Abs(float64(v)-w) > 1e-5 {
							t.Fatalf("row %d head %d element %d = %g, want %g", r, g, i, v, w)
						}
					}
				}
			}
		})
	}
}

// TestAttendRowIndependent checks the property the engine's equivalences
// rest on: a query row's attention is bit-identical whatever rows share
// its unit (and so however many keys were packed), as in chunked prefill
// against one decode step.
func TestAttendRowIndependent(t *testing.T) {
	for _, shape := range []struct{ d, group, tokens int }{{16, 2, 50}, {64, 4, 75}} {
		c := newAttnCase(shape.d, shape.group, shape.tokens, 2)
		ld := shape.group * shape.d
		var a attnScratch
		all := c.attend(&a, 0, shape.tokens)
		for _, chunk := range [][2]int{{0, 1}, {5, 6}, {7, 23}, {shape.tokens - 1, shape.tokens}} {
			got := c.attend(&a, chunk[0], chunk[1])
			for i, v := range got {
				if w := all[chunk[0]*ld+i]; math.Float32bits(v) != math.Float32bits(w) {
					t.Fatalf("d %d rows %v: element %d = %g, %g with all rows", shape.d, chunk, i, v, w)
				}
			}
		}
	}
}

// BenchmarkAttention measures one attention unit of the small preset's
// shape (head dim 64, four query heads per KV head) on one core, packing
// included: a prefill unit of attnRowsPerUnit rows ending at position 511
// and a decode row at position 256. GFLOP/s counts 4·head dim per (query
// head, key) pair attended, as the engine benchmarks do.
func BenchmarkAttention(b *testing.B) {
	b.Logf("kernels: %s", Kernel())
	const d, group = 64, 4
	for _, shape := range []struct {
		name       string
		rows, last int // query rows, position of the last
	}{{"prefill", attnRowsPerUnit, 511}, {"decode", 1, 256}} {
		b.Run(fmt.Sprintf("%s/rows=%d/keys=%d", shape.name, shape.rows, shape.last+1), func(b *testing.B) {
			c := newAttnCase(d, group, shape.last+1, 3)
			r0 := shape.last + 1 - shape.rows
			var a attnScratch
			flops := 0.0
			for r := r0; r <= shape.last; r++ {
				flops += float64(group*(r+1)) * 4 * d
			}
			for b.Loop() {
				c.attend(&a, r0, shape.last+1)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkSoftmax measures softmax over a row of 512 scores, and
// BenchmarkSwiGLU the activation of one small-preset row (1408 elements):
// element-wise kernels, reported in elements per second.
func BenchmarkSoftmax(b *testing.B) {
	b.Logf("kernels: %s", Kernel())
	s := make([]float32, 512)
	fill(s, uniform(4, 1, 3))
	for b.Loop() {
		softmax(s, 0.125) // the probabilities are scores as good as any
	}
	b.ReportMetric(float64(len(s)*b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
}

func BenchmarkSwiGLU(b *testing.B) {
	b.Logf("kernels: %s", Kernel())
	const n = 1408
	g, u, dst := make([]float32, n), make([]float32, n), make([]float32, n)
	fill(g, uniform(5, 1, 2))
	fill(u, uniform(5, 2, 1))
	for b.Loop() {
		swiGLU(dst, g, u)
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
}
