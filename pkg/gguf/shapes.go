package gguf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Preset is a named model shape for RandomModel.
type Preset struct {
	Name    string
	Summary string
	// Options has Vocab as a bare file name, looked up in VocabDir, and
	// Type F16; callers override what they need.
	Options RandomOptions
}

// Shapes returns the model shape presets, the tiny ones first. The tiny
// presets generate in well under a second, for tests.
func Shapes() []Preset {
	return []Preset{
		{Name: "tiny-llama", Summary: "llama over the llama-spm vocab (32000): 2 layers, hidden 64, 4 heads, 2 KV heads, FFN 128",
			Options: RandomOptions{Arch: "llama", Vocab: "ggml-vocab-llama-spm.gguf", Name: "random-tiny-llama",
				Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 2048,
				Type: F16, RopeTheta: 10000, RMSEps: 1e-5}},
		{Name: "tiny-qwen2", Summary: "qwen2 over the qwen2 vocab (151936): 2 layers, hidden 64, 4 heads, 2 KV heads, FFN 128",
			Options: RandomOptions{Arch: "qwen2", Vocab: "ggml-vocab-qwen2.gguf", Name: "random-tiny-qwen2",
				Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 2048,
				Type: F16, RopeTheta: 1e6, RMSEps: 1e-6}},
		{Name: "qwen2.5-0.5b", Summary: "Qwen2.5-0.5B's shape over the qwen2 vocab: 24 layers, hidden 896, 14 heads, 2 KV heads, FFN 4864, ctx 32768; untied output (630M parameters; --tied gives the real 494M)",
			Options: RandomOptions{Arch: "qwen2", Vocab: "ggml-vocab-qwen2.gguf", Name: "random-qwen2.5-0.5b",
				Layers: 24, Hidden: 896, Heads: 14, KVHeads: 2, FFN: 4864, Context: 32768,
				Type: F16, RopeTheta: 1e6, RMSEps: 1e-6}},
	}
}

// Shape returns the options of the preset called name.
func Shape(name string) (RandomOptions, error) {
	var names []string
	for _, p := range Shapes() {
		if p.Name == name {
			return p.Options, nil
		}
		names = append(names, p.Name)
	}
	return RandomOptions{}, fmt.Errorf("gguf: unknown shape %q (have %s)", name, strings.Join(names, ", "))
}

// VocabRelDir is where the vocab GGUFs lie below the module root.
const VocabRelDir = "third_party/llama/vocab"

// ErrNoVocab is returned (wrapped) by VocabDir when the vocab directory is
// missing.
var ErrNoVocab = errors.New("llama.cpp vocab GGUFs missing: run `make llama`")

// VocabDir returns the directory of llama.cpp's vocab GGUFs: VocabRelDir
// below the module root, the first directory holding go.mod at or above
// the working directory. It fails when there is no module root, and with
// an error wrapping ErrNoVocab when the directory is missing.
func VocabDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("gguf: vocab dir: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("gguf: vocab dir: no go.mod at or above the working directory")
		}
		dir = parent
	}
	v := filepath.Join(dir, filepath.FromSlash(VocabRelDir))
	if st, err := os.Stat(v); err != nil || !st.IsDir() {
		return "", fmt.Errorf("gguf: vocab dir %s: %w", v, ErrNoVocab)
	}
	return v, nil
}
