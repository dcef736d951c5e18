package cliflags

import (
	"slices"
	"strings"
	"testing"
)

// TestWithout: the engine flags without those a coordinator refuses
// outside --standalone (some of coordinator.WorkerOnlyFlags): each
// dropped flag with its value, inline or next, a bare boolean alone, a
// positional argument of the same word kept.
func TestWithout(t *testing.T) {
	workerOnly := []string{"preset", "seed", "profile", "time-scale", "ctx-size", "max-seqs", "no-repack"}
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"--engine sim --profile h100/llama-3-8b/tp1 --time-scale=0.1", "--engine sim"},
		{"--engine llamacpp --model m.gguf --no-repack --max-seqs 4 --llama-lib /l --ctx-size=512", "--engine llamacpp --model m.gguf --llama-lib /l"},
		{"-engine ref -preset tiny -seed 3", "-engine ref"},
		{"--no-repack", ""},
		{"--engine ref seed --seed 3", "--engine ref seed"},
	} {
		in := strings.Fields(tc.in)
		orig := slices.Clone(in)
		got := Without(in, workerOnly)
		if !slices.Equal(got, strings.Fields(tc.want)) {
			t.Errorf("Without(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if !slices.Equal(in, orig) {
			t.Errorf("Without changed its argument %q to %q", orig, in)
		}
	}
}
