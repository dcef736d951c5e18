package codec

import (
	"runtime"
	"testing"
)

// CPUThroughput locks the benchmark to its OS thread and returns a function,
// to defer, that reports "cpu-MB/s": bytesPerOp per op over the thread's CPU
// time. On a shared machine it is the steadier per-core figure, since time
// spent waiting for a core is not counted; MB/s stays the wall-clock one.
func CPUThroughput(b *testing.B, bytesPerOp int) func() {
	runtime.LockOSThread()
	start, ok := threadCPU()
	return func() {
		end, _ := threadCPU()
		runtime.UnlockOSThread()
		if ok && end > start {
			b.ReportMetric(float64(bytesPerOp)*float64(b.N)/1e6/(end-start).Seconds(), "cpu-MB/s")
		}
	}
}

// RefF16 is the tests' float64 reference for widening f16 (refF16).
var RefF16 = refF16

// SampleKV is SelfBench's sample (sampleKV).
var SampleKV = sampleKV
