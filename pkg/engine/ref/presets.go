package ref

import (
	"slices"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// presets are the synthetic model shapes, all with the byte-level
// vocabulary of package tokenizer and bf16 KV.
var presets = map[string]engine.ModelSpec{
	// tiny: 125,504 parameters; tests run it in milliseconds.
	"tiny": {
		Name: "tiny", Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16,
		Hidden: 64, Intermediate: 176, MaxSeqLen: 1024,
	},
	// small: 28,455,424 parameters (hidden 512, 10 layers, GQA 8:2); the
	// benchmark and demo preset.
	"small": {
		Name: "small", Layers: 10, Heads: 8, KVHeads: 2, HeadDim: 64,
		Hidden: 512, Intermediate: 1408, MaxSeqLen: 2048,
	},
}

func init() {
	for name, s := range presets {
		s.Vocab = tokenizer.Vocab
		s.BOS, s.EOS = tokenizer.BOS, tokenizer.EOS
		s.RopeTheta = 10000
		s.KVDType = engine.BF16
		presets[name] = s
	}
}

// Presets returns the names of the synthetic presets, sorted.
func Presets() []string {
	names := make([]string, 0, len(presets))
	for name := range presets {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// PresetSpec returns the model spec of a preset and whether it exists.
func PresetSpec(name string) (engine.ModelSpec, bool) {
	s, ok := presets[name]
	return s, ok
}

// Params returns the parameter count of a spec with the layout of this
// package (untied embedding and LM head, no biases).
func Params(s engine.ModelSpec) int {
	perLayer := 2*s.Hidden + // norms
		s.Hidden*(s.Heads+2*s.KVHeads)*s.HeadDim + // q, k, v
		s.Heads*s.HeadDim*s.Hidden + // o
		3*s.Hidden*s.Intermediate // gate, up, down
	return 2*s.Vocab*s.Hidden + s.Hidden + s.Layers*perLayer
}
