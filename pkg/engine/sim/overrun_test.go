package sim

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
)

func TestOverran(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name         string
		took, scaled time.Duration
		want         bool
	}{
		{"on time", 72 * ms, 72 * ms, false},
		{"late timer", 73 * ms, 72 * ms, false},
		{"over the fraction, under the slack", 9 * ms, 2 * ms, false},
		{"over the slack, under the fraction", 120 * ms, 100 * ms, false},
		{"over both", 3600 * ms, 72 * ms, true},
		{"just over both", 31 * ms, 20 * ms, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := overran(tc.took, tc.scaled); got != tc.want {
				t.Errorf("overran(%v, %v) = %v, want %v", tc.took, tc.scaled, got, tc.want)
			}
		})
	}
}

// TestOverruns: a step whose KV callbacks take longer than the modeled
// GPU is recorded and reported to the hook; a step on time is not.
func TestOverruns(t *testing.T) {
	e, clk := newSim(t, Options{Profile: "h100/llama-3-8b/tp1"})
	var hooked []Overrun
	e.OnOverrun(func(o Overrun) { hooked = append(hooked, o) })
	step := e.Profile().PrefillTime([]int{8})
	prefill := func(seq engine.SeqID, perLayer time.Duration) {
		t.Helper()
		_, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: seqTokens(8, uint64(seq)), Last: true}}, func(engine.KVChunk) error {
			clk.advance(perLayer)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	prefill(1, 0)
	if got := e.Overruns(); got != (Overruns{}) {
		t.Fatalf("after a step on time: %+v", got)
	}

	// 32 layers × (step + 1 ms): the step takes 32 steps' time and more.
	perLayer := step + time.Millisecond
	start := clk.Now()
	prefill(2, perLayer)
	// Layer 0 waits 1/32 of the step; its callback and every later one
	// run late, without waiting.
	took := step/32 + 32*perLayer
	want := Overrun{At: start.Add(took), Took: took, Scaled: step, Modeled: step}
	if diff := cmp.Diff(Overruns{Steps: 1, Last: want}, e.Overruns()); diff != "" {
		t.Errorf("Overruns (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Overrun{want}, hooked); diff != "" {
		t.Errorf("hook calls (-want +got):\n%s", diff)
	}
}
