//go:build !linux

package codec

import "time"

// threadCPU is not available here: the benchmarks report wall-clock MB/s only.
func threadCPU() (time.Duration, bool) { return 0, false }
