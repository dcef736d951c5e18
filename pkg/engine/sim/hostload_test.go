package sim

import (
	"context"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// TestChargeHostLoad: a host-tier load is priced at the profile's PCIe
// bandwidth and waited out by the next step, on top of that step's own
// time, once.
func TestChargeHostLoad(t *testing.T) {
	ctx := context.Background()
	e, clk := newSim(t, Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 0.5})
	p := e.Profile()
	if got := p.HostLinkBytesPerSec(); got != perfmodel.PCIeGen5x16BytesPerSec {
		t.Fatalf("h100 host link %v B/s, want PCIe Gen5 x16 %v", got, perfmodel.PCIeGen5x16BytesPerSec)
	}
	// 1000 tokens of llama-3-8b KV (128 KiB a token) over 64 GB/s.
	bytes := int64(1000 * e.Spec().KVBytesPerToken())
	load := time.Duration(float64(bytes) / 64e9 * float64(time.Second))
	if got, want := e.ChargeHostLoad(bytes), load/2; got != want {
		t.Errorf("ChargeHostLoad(%d) = %v, want %v (modeled %v at time scale 0.5)", bytes, got, want, load)
	}
	if got := e.ChargeHostLoad(-1); got != 0 {
		t.Errorf("ChargeHostLoad(-1) = %v, want 0", got)
	}
	step := func(seq engine.SeqID) time.Duration {
		t0 := clk.Now()
		if _, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: seq, Tokens: seqTokens(100, uint64(seq)), Last: true}}, nil); err != nil {
			t.Fatal(err)
		}
		return clk.Now().Sub(t0)
	}
	compute := time.Duration(float64(p.StepTime(perfmodel.Batch{Prefill: []int{100}, PrefillContext: []int{0}})) * 0.5)
	if got, want := step(1), compute+load/2; got != want {
		t.Errorf("step after a load took %v, want %v (compute) + %v (load)", got, compute, load/2)
	}
	if got := step(2); got != compute {
		t.Errorf("next step took %v, want %v: the load is charged once", got, compute)
	}
	if st := e.Stats(); st.HostLoad != load {
		t.Errorf("Stats.HostLoad = %v, want %v", st.HostLoad, load)
	}
}
