package ref

import (
	"math"

	"github.com/pdserve/pdserve/pkg/engine"
)

// layerWeights are one transformer block's parameters.
type layerWeights struct {
	attnNorm []float32 // Hidden
	qkv      *matrix   // (Heads + 2·KVHeads)·HeadDim × Hidden: q, then k, then v
	o        *matrix   // Hidden × Heads·HeadDim
	mlpNorm  []float32 // Hidden
	gateUp   *matrix   // 2·Intermediate × Hidden: gate rows, then up rows
	down     *matrix   // Hidden × Intermediate
}

// weights are a model's parameters, read only after construction and so
// safe to share between goroutines.
type weights struct {
	embed  []float32 // Vocab × Hidden, row-major
	layers []layerWeights
	norm   []float32 // Hidden
	head   *matrix   // Vocab × Hidden
}

// Gains of the synthetic weights over the 1/sqrt(fan-in) scale. qkGain
// sharpens attention so outputs depend on context, headGain spreads the
// logits so that greedy choices have real margins.
const (
	qkGain   = 2.0
	headGain = 3.0
)

// syntheticWeights draws every parameter from a uniform distribution whose
// standard deviation keeps activations of order one: 1/sqrt(fan-in) for
// projections (times the gains above), 1 for embeddings, 1 ± 0.1 for
// norm gains. Element i of tensor t is a pure function of (seed, t, i), so
// the same seed gives the same model on every machine.
func syntheticWeights(s engine.ModelSpec, seed uint64) *weights {
	h, d, kvh, inter := s.Hidden, s.HeadDim, s.KVHeads, s.Intermediate
	qDim, kvDim := s.Heads*d, kvh*d
	w := &weights{
		embed: make([]float32, s.Vocab*h),
		norm:  make([]float32, h),
	}
	fill(w.embed, uniform(seed, 1<<32, 1))
	for i := range w.norm {
		w.norm[i] = 1
	}
	w.head = newMatrix(s.Vocab, h, rowMajor(h, uniform(seed, 1<<32+1, headGain/math.Sqrt(float64(h)))))
	inStd := 1 / math.Sqrt(float64(h))
	for l := range s.Layers {
		t := uint64(l) * 16
		q := uniform(seed, t+1, qkGain*inStd)
		k := uniform(seed, t+2, qkGain*inStd)
		v := uniform(seed, t+3, inStd)
		gate := uniform(seed, t+6, inStd)
		up := uniform(seed, t+7, inStd)
		lw := layerWeights{
			attnNorm: make([]float32, h),
			mlpNorm:  make([]float32, h),
			qkv: newMatrix(qDim+2*kvDim, h, func(row, col int) float32 {
				switch {
				case row < qDim:
					return q(row*h + col)
				case row < qDim+kvDim:
					return k((row-qDim)*h + col)
				default:
					return v((row-qDim-kvDim)*h + col)
				}
			}),
			o: newMatrix(h, qDim, rowMajor(qDim, uniform(seed, t+4, 1/math.Sqrt(float64(qDim))))),
			gateUp: newMatrix(2*inter, h, func(row, col int) float32 {
				if row < inter {
					return gate(row*h + col)
				}
				return up((row-inter)*h + col)
			}),
			down: newMatrix(h, inter, rowMajor(inter, uniform(seed, t+8, 1/math.Sqrt(float64(inter))))),
		}
		fill(lw.attnNorm, shifted(uniform(seed, t+0, 0.1/math.Sqrt(3)), 1))
		fill(lw.mlpNorm, shifted(uniform(seed, t+5, 0.1/math.Sqrt(3)), 1))
		w.layers = append(w.layers, lw)
	}
	return w
}

// uniform returns the generator of tensor t: element i is uniform in
// [-std·√3, std·√3), so its standard deviation is std.
func uniform(seed, t uint64, std float64) func(i int) float32 {
	base := mix64(mix64(seed) ^ mix64(t))
	a := float32(std * math.Sqrt(3))
	return func(i int) float32 {
		u := float32(mix64(base+uint64(i))>>40) * 0x1p-24 // [0, 1), exact
		return (2*u - 1) * a
	}
}

func shifted(f func(int) float32, by float32) func(int) float32 {
	return func(i int) float32 { return f(i) + by }
}

func rowMajor(cols int, f func(int) float32) func(row, col int) float32 {
	return func(row, col int) float32 { return f(row*cols + col) }
}

func fill(dst []float32, f func(int) float32) {
	for i := range dst {
		dst[i] = f(i)
	}
}

// mix64 is the SplitMix64 output function.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
