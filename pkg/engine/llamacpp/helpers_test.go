package llamacpp

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/gguf"
)

// Test models: random weights (no pretrained model can be had here) of
// real architectures over real vocabularies, written once per test binary.
var (
	modelsMu  sync.Mutex
	modelsDir string
	models    = map[string]string{}
	loadedMs  = map[string]*Model{}
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, lm := range loadedMs {
		lm.Close()
	}
	if modelsDir != "" {
		os.RemoveAll(modelsDir)
	}
	os.Exit(code)
}

// envTestVariant names the CPU backend variant the test models load ("":
// llama.cpp's choice); TestConformanceVariants sets it for the test
// processes it starts.
const envTestVariant = "PDSERVE_TEST_LLAMA_CPU_VARIANT"

// tinyShapes are the test models by name.
var tinyShapes = map[string]gguf.RandomOptions{
	"llama-f32": {Arch: "llama", Vocab: "ggml-vocab-llama-spm.gguf", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 512, Type: gguf.F32, Seed: 1},
	"llama-q8":  {Arch: "llama", Vocab: "ggml-vocab-llama-spm.gguf", Layers: 2, Hidden: 128, Heads: 4, KVHeads: 2, FFN: 256, Context: 512, Type: gguf.Q8_0, Seed: 2},
	"qwen2-f16": {Arch: "qwen2", Vocab: "ggml-vocab-qwen2.gguf", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 512, Type: gguf.F16, Seed: 3},
}

// testModel returns the path of the named test model and the library dir.
func testModel(t testing.TB, name string) (path, lib string) {
	t.Helper()
	lib, vocab := repotest.Llama(t)
	modelsMu.Lock()
	defer modelsMu.Unlock()
	if p, ok := models[name]; ok {
		return p, lib
	}
	if modelsDir == "" {
		d, err := os.MkdirTemp("", "pdserve-llamacpp-test-")
		if err != nil {
			t.Fatal(err)
		}
		modelsDir = d
	}
	o, ok := tinyShapes[name]
	if !ok {
		t.Fatalf("no test model %q", name)
	}
	o.Vocab = filepath.Join(vocab, o.Vocab)
	p := filepath.Join(modelsDir, name+".gguf")
	if err := gguf.WriteRandom(p, o); err != nil {
		t.Fatalf("write test model %s: %v", name, err)
	}
	models[name] = p
	return p, lib
}

// loadTestModel returns the named test model, loaded once per test binary.
func loadTestModel(t testing.TB, name string) *Model {
	t.Helper()
	path, lib := testModel(t, name)
	modelsMu.Lock()
	defer modelsMu.Unlock()
	if m, ok := loadedMs[name]; ok {
		return m
	}
	m, err := LoadModel(path, LoadOptions{LibDir: lib, CPUVariant: os.Getenv(envTestVariant)})
	if err != nil {
		t.Fatal(err)
	}
	loadedMs[name] = m
	return m
}

// newTestEngine returns an engine on the named test model (shared weights,
// its own context), closed when the test ends. It computes on one thread:
// the test models are tiny, and with two, every op of a graph ends in a
// barrier between llama.cpp's threads, each a sleep and a wake-up that
// costs milliseconds on a loaded machine (the package took 8× as long).
// What the suite compares (one sequence in two batch shapes or cache
// layouts) is in the same engine, so the thread count does not enter it.
func newTestEngine(t testing.TB, name string, mod func(*Options)) *Engine {
	t.Helper()
	m := loadTestModel(t, name)
	o := Options{CtxSize: 512, Threads: 1, MaxSeqs: 8}
	if mod != nil {
		mod(&o)
	}
	e, err := NewOnModel(m, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

var _ engine.Engine = (*Engine)(nil)
