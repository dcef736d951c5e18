//go:build !(goexperiment.simd && amd64)

package ref

// nr is the panel width of packed weights (output features per panel):
// one row of the portable kernel's six accumulators (see dot6).
const nr = 6

// Kernel names the active kernel set ("go" for the portable one, "avx2"
// or "avx512" for the SIMD ones built with GOEXPERIMENT=simd on a CPU with
// AVX2 and FMA).
func Kernel() string { return "go" }

func panelKernel(y []float32, ldy int, x []float32, ldx, rows int, p []float32, k, ncols int, add bool) {
	panelKernelGo(y, ldy, x, ldx, rows, p, k, ncols, add)
}

func softmax(s []float32, scale float32) { softmaxGo(s, scale) }

func packKeys(p []float32, k []uint16, stride, keys, d int) { packKeysGo(p, k, stride, 0, keys, d) }

func packValues(p []float32, v []uint16, stride, n, w int) { packValuesGo(p, v, stride, n, w) }

func swiGLU(dst, g, u []float32) { swiGLUGo(dst, g, u) }
