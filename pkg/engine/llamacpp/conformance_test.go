package llamacpp

import (
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/enginetest"
)

// TestConformance runs the engine contract's suite on random-weight models
// of two architectures and both KV cache types.
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		model string
		kv    engine.DType
	}{
		{"llama-f32", engine.F16},
		{"qwen2-f16", engine.F16},
		{"llama-q8", engine.Q8_0},
	} {
		t.Run(tc.model+"/"+tc.kv.String(), func(t *testing.T) {
			enginetest.Run(t, func(t *testing.T) engine.Engine {
				return newTestEngine(t, tc.model, func(o *Options) { o.KVType = tc.kv })
			})
		})
	}
}
