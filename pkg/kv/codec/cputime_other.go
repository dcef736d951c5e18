//go:build !linux

package codec

import "time"

// threadCPU is not available here: SelfBench and the benchmarks fall back
// to wall-clock time.
func threadCPU() (time.Duration, bool) { return 0, false }
