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

// TestChargeHostSpill: a spill's copy out is priced at the profile's PCIe
// bandwidth as a DMA beside the steps (no step waits for it), spills queue
// behind each other on the link, and a load of spilled KV before its copy
// ended waits for the rest in the next step, once.
func TestChargeHostSpill(t *testing.T) {
	ctx := context.Background()
	e, clk := newSim(t, Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 0.5})
	p := e.Profile()
	bytes := int64(20000 * e.Spec().KVBytesPerToken())
	spill := time.Duration(float64(bytes) / p.HostLinkBytesPerSec() * float64(time.Second)) // modeled
	t0 := clk.Now()
	if got, want := e.ChargeHostSpill(bytes), t0.Add(spill/2); !got.Equal(want) {
		t.Errorf("first spill ready at %v, want now + %v", got.Sub(t0), spill/2)
	}
	second := e.ChargeHostSpill(bytes)
	if got := second.Sub(t0); got != spill {
		t.Errorf("second spill ready at now + %v, want %v (queued behind the first)", got, spill)
	}
	if got := e.ChargeHostSpill(0); !got.Equal(clk.Now()) {
		t.Errorf("ChargeHostSpill(0) = now + %v, want now", got.Sub(clk.Now()))
	}
	step := func(seq engine.SeqID) time.Duration {
		t0 := clk.Now()
		if _, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: seq, Tokens: seqTokens(10, uint64(seq)), Last: true}}, nil); err != nil {
			t.Fatal(err)
		}
		return clk.Now().Sub(t0)
	}
	compute := time.Duration(float64(p.StepTime(perfmodel.Batch{Prefill: []int{10}, PrefillContext: []int{0}})) * 0.5)
	if compute >= spill/2 {
		t.Fatalf("test needs a step (%v) shorter than a spill (%v)", compute, spill/2)
	}
	if got := step(1); got != compute {
		t.Errorf("step beside two spills took %v, want %v: a spill is no step's time", got, compute)
	}
	left := second.Sub(clk.Now())
	if got := e.WaitHostSpill(second); got != left {
		t.Errorf("WaitHostSpill = %v, want the %v left", got, left)
	}
	if got := step(2); got != compute+left {
		t.Errorf("step after a load that waited took %v, want %v + %v", got, compute, left)
	}
	if got := step(3); got != compute {
		t.Errorf("next step took %v, want %v: the wait is charged once", got, compute)
	}
	if got := e.WaitHostSpill(second); got != 0 {
		t.Errorf("WaitHostSpill after the copy ended = %v, want 0", got)
	}
	if st := e.Stats(); st.HostSpill != 2*spill || st.HostSpillWait != 2*left {
		t.Errorf("Stats HostSpill %v, HostSpillWait %v; want %v, %v (modeled)", st.HostSpill, st.HostSpillWait, 2*spill, 2*left)
	}
}
