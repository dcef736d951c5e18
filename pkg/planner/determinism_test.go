package planner

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// hog spins a goroutine on every core until the returned stop is called:
// a busy planning machine.
func hog() (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := uint64(1)
			for !done.Load() {
				for range 1000 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			_ = x
		}()
	}
	return func() { done.Store(true); wg.Wait() }
}

// planBytes plans DistServe's OPT-13B example with the codec figures of
// the built-in codec profile, as `coordinator plan` does by default, and
// returns the text report and the JSON.
func planBytes(t *testing.T, codecName string) (text, js []byte) {
	t.Helper()
	cp, err := LoadCodecProfile(CodecProfileBuiltin)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cp.CodecFor(codecName, 100e9/8, DefaultCodecCores)
	if err != nil {
		t.Fatal(err)
	}
	cfg := opt13(t)
	cfg.LinkBytesPerSec, cfg.Codec, cfg.Requests, cfg.GPUBudget = 100e9/8, c, 100, 4
	p, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var tb, jb bytes.Buffer
	if err := WriteTable(&tb, p); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&jb, p); err != nil {
		t.Fatal(err)
	}
	return tb.Bytes(), jb.Bytes()
}

// The same inputs give the same plan, byte for byte, whatever else the
// planning machine runs: the second plan runs beside goroutines spinning
// on every core. The codec speeds come from data (the built-in codec
// profile), not from timing this machine, and nothing else in a plan
// reads the clock or depends on map order.
func TestPlanDeterministicUnderLoad(t *testing.T) {
	for _, codec := range []string{"none", "bf16", "auto"} {
		t.Run(codec, func(t *testing.T) {
			text1, js1 := planBytes(t, codec)
			stop := hog()
			text2, js2 := planBytes(t, codec)
			stop()
			if !bytes.Equal(text1, text2) {
				t.Errorf("text differs beside a CPU hog:\n--- quiet\n%s\n--- busy\n%s", text1, text2)
			}
			if !bytes.Equal(js1, js2) {
				t.Errorf("JSON differs beside a CPU hog:\n--- quiet\n%s\n--- busy\n%s", js1, js2)
			}
			// The plan says whence its codec speeds came.
			for _, want := range []string{`"encode_bytes_per_s_per_core"`, `"source": "`} {
				if !bytes.Contains(js1, []byte(want)) {
					t.Errorf("JSON lacks %s", want)
				}
			}
			if !bytes.Contains(text1, []byte("  codec      ")) {
				t.Errorf("text lacks the codec speeds line:\n%s", text1)
			}
		})
	}
}
