package main

import (
	"slices"
	"strings"
	"testing"
)

// TestCoordinatorFlags: the coordinator gets the engine flags it reads,
// not the workers' (it would refuse them outside --standalone).
func TestCoordinatorFlags(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"--engine sim --profile h100/llama-3-8b/tp1 --time-scale=0.1", "--engine sim"},
		{"--engine llamacpp --model m.gguf --no-repack --max-seqs 4 --llama-lib /l --ctx-size=512", "--engine llamacpp --model m.gguf --llama-lib /l"},
		{"-engine ref -preset tiny -seed 3", "-engine ref"},
	} {
		got := coordinatorFlags(strings.Fields(tc.in))
		if !slices.Equal(got, strings.Fields(tc.want)) {
			t.Errorf("coordinatorFlags(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
