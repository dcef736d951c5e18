package enginebuild

import (
	"errors"
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/gguf"
)

// TestLlamaCPUVariant: --llama-cpu-variant loads the named CPU backend in
// place of the best one, for the coordinator's tokenizer and the engine
// alike (one per process).
func TestLlamaCPUVariant(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	vs, err := llamacpp.CPUVariants(lib)
	if err != nil {
		t.Fatal(err)
	}
	var runnable []string
	for _, v := range vs {
		if v.Score > 0 {
			runnable = append(runnable, v.Name)
		}
	}
	if len(runnable) < 2 {
		t.Skipf("this processor runs %d CPU variant(s) of the build: nothing to choose", len(runnable))
	}
	pick := runnable[len(runnable)-1] // the least specific, never the default
	model := filepath.Join(t.TempDir(), "m.gguf")
	if err := gguf.WriteRandom(model, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 1, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 64, Type: gguf.F32, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	o := enginecfg.DefaultOptions()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--engine=llamacpp", "--model=" + model, "--llama-lib=" + lib, "--ctx-size=64", "--llama-cpu-variant=" + pick}); err != nil {
		t.Fatal(err)
	}
	_, closeTok, err := o.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	defer closeTok()
	e, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(e)
	if got := llamacpp.LoadedCPUVariant(); got != pick {
		t.Errorf("loaded CPU variant %q, want %q", got, pick)
	}
}

// TestLlamaDevice: --llama-device cpu builds the engine where no GPU is,
// over $PDSERVE_LLAMA_DEVICE=gpu; gpu refuses with llamacpp.ErrNoGPU; a
// bad policy, from the flag or the environment, is a validation error.
func TestLlamaDevice(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	model := filepath.Join(t.TempDir(), "m.gguf")
	if err := gguf.WriteRandom(model, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 1, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 64, Type: gguf.F32, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	opts := func(t *testing.T, args ...string) enginecfg.Options {
		o := enginecfg.DefaultOptions()
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(append([]string{"--engine=llamacpp", "--model=" + model, "--llama-lib=" + lib, "--ctx-size=64"}, args...)); err != nil {
			t.Fatal(err)
		}
		return o
	}
	t.Setenv(llamacpp.EnvDevice, "gpu")
	e, err := Build(opts(t, "--llama-device=cpu"))
	if err != nil {
		t.Fatalf("--llama-device cpu: %v", err)
	}
	Close(e)
	if _, err := Build(opts(t)); !errors.Is(err, llamacpp.ErrNoGPU) {
		t.Errorf("$%s=gpu: %v, want ErrNoGPU", llamacpp.EnvDevice, err)
	}
	if err := opts(t, "--llama-device=cuda").Validate(); err == nil || !strings.Contains(err.Error(), "--llama-device cuda: must be auto, gpu or cpu") {
		t.Errorf("--llama-device cuda: %v", err)
	}
	t.Setenv(llamacpp.EnvDevice, "GPU")
	if err := opts(t).Validate(); err == nil || !strings.Contains(err.Error(), `$PDSERVE_LLAMA_DEVICE "GPU"`) {
		t.Errorf("$%s=GPU: %v", llamacpp.EnvDevice, err)
	}
}
