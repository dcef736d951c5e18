package enginebuild

import (
	"context"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/enginecfg"
)

// TestBuild builds each engine kind and runs one prefill on it.
func TestBuild(t *testing.T) {
	for _, o := range []enginecfg.Options{
		enginecfg.DefaultOptions(),
		{Engine: enginecfg.Sim, Profile: "h100/llama-3-8b/tp1", TimeScale: 0.001, PayloadScale: 0.01, Seed: 1},
	} {
		t.Run(o.Engine, func(t *testing.T) {
			e, err := Build(o)
			if err != nil {
				t.Fatal(err)
			}
			defer Close(e)
			out, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: []int32{1, 2, 3}, Last: true}}, nil)
			if err != nil || len(out) != 1 || !out[0].Sampled {
				t.Errorf("prefill: %v, %v", out, err)
			}
		})
	}
	if _, err := Build(enginecfg.Options{Engine: "none"}); err == nil {
		t.Error("Build of an unknown engine succeeded")
	}
}
