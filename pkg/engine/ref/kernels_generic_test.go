//go:build !(goexperiment.simd && amd64)

package ref

// kernelSets returns the kernel sets of this build (see useKernels).
func kernelSets() []string { return []string{"go"} }

// useKernels makes set the active kernel set and returns the function that
// restores the previous one; the portable build has one set.
func useKernels(string) (restore func()) { return func() {} }
