//go:build !(goexperiment.simd && amd64)

package ref

// nr is the panel width of packed weights (output features per panel):
// one row of the portable kernel's six accumulators (see dot6).
const nr = 6

// Kernel names the active kernel set ("go" for the portable one, "avx2"
// for the SIMD one built with GOEXPERIMENT=simd on a CPU with AVX2 and FMA).
func Kernel() string { return "go" }

func panelKernel(y []float32, ldy int, x []float32, ldx, rows int, p []float32, k, ncols int, add bool) {
	panelKernelGo(y, ldy, x, ldx, rows, p, k, ncols, add)
}

func scoresBF16(sc, q []float32, k []uint16, stride int, scale float32) float32 {
	return scoresBF16Go(sc, q, k, stride, scale)
}

func valuesBF16(out, w []float32, inv float32, v []uint16, stride int) {
	valuesBF16Go(out, w, inv, v, stride)
}

func expSub(s []float32, m float32) float32 { return expSubGo(s, m) }

func swiGLU(dst, g, u []float32) { swiGLUGo(dst, g, u) }
