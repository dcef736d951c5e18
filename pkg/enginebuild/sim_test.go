package enginebuild

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/enginecfg"
)

// TestOverrunWarner: the first overrun warns at once, later ones at most
// once per overrunWarnEvery, with the steps counted since the last
// warning.
func TestOverrunWarner(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	o := enginecfg.DefaultOptions()
	o.Engine, o.Profile = enginecfg.Sim, "a100-80g/opt-13b/tp1"
	warn := overrunWarner(zap.New(core), o)
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	ov := func(s int, took time.Duration) sim.Overrun {
		return sim.Overrun{At: t0.Add(time.Duration(s) * time.Second), Took: took, Scaled: 72 * time.Millisecond, Modeled: 72 * time.Millisecond}
	}
	for _, x := range []sim.Overrun{
		ov(0, 3600*time.Millisecond), // warns
		ov(1, time.Second), ov(29, time.Second),
		ov(30, 2*time.Second), // warns: 3 steps
		ov(31, time.Second),
	} {
		warn(x)
	}
	type line struct {
		Took  time.Duration
		Steps int64
	}
	var got []line
	for _, e := range logs.All() {
		m := e.ContextMap()
		got = append(got, line{Took: m["step_took"].(time.Duration), Steps: m["overrun_steps"].(int64)})
		if m["step_modeled"] != 72*time.Millisecond || m["profile"] != "a100-80g/opt-13b/tp1" || m["payload_scale"] != enginecfg.DefaultPayloadScale {
			t.Errorf("fields %v", m)
		}
	}
	if diff := cmp.Diff([]line{{3600 * time.Millisecond, 1}, {2 * time.Second, 3}}, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}

// TestSimDefaultPayloadScale: --engine sim without --payload-scale hands
// out the least KV the engine keeps, not the true size.
func TestSimDefaultPayloadScale(t *testing.T) {
	o := enginecfg.DefaultOptions()
	o.Engine, o.Profile = enginecfg.Sim, "a100-80g/opt-13b/tp1"
	e, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(e)
	s := e.(*sim.Engine)
	// OPT-13B: 40 heads × 128 = 5120 values per K and V row; 8 kept.
	if got, want := s.PayloadScale(), 8.0/5120; got != want {
		t.Errorf("payload scale %v, want %v", got, want)
	}
	if got, full := s.KVTokenBytes(), s.Spec().KVTokenBytes(); got*640 != full {
		t.Errorf("KV bytes per token and layer %d, want 1/640 of %d", got, full)
	}
}
