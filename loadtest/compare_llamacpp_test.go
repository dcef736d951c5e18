package main

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/loadtest/deploy"
	"github.com/pdserve/pdserve/pkg/gguf"
)

// TestMain lets compare's llama.cpp deployments run this test binary
// again as their worker processes.
func TestMain(m *testing.M) {
	deploy.RunChild()
	regionsChild()
	os.Exit(m.Run())
}

// TestCompareLlamaCpp: compare starts both llama.cpp deployments itself
// (1P+1D, each pinned to one core, vs one colocated worker on both) and
// reports rates per core, on mkgguf's tiny-llama shape and a few requests.
func TestCompareLlamaCpp(t *testing.T) {
	if testing.Short() {
		t.Skip("starts llama.cpp worker processes")
	}
	if runtime.GOOS != "linux" || runtime.NumCPU() < 2 {
		t.Skip("needs Linux and two cores")
	}
	lib, vocab := repotest.Llama(t)
	o, err := gguf.Shape("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	o.Vocab, o.Type, o.Seed = filepath.Join(vocab, o.Vocab), gguf.F16, 1
	model := filepath.Join(dir, "tiny.gguf")
	if err := gguf.WriteRandom(model, o); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "compare", "--engine", "llamacpp", "--model-file", model, "--llama-lib", lib,
		"--cpus", "0,1", "--pd-split", "1:1", "--ctx-size", "1024", "--max-seqs", "4",
		"--num-prompts", "4", "--random-input-len", "16", "--random-output-len", "4",
		"--request-rates", "20", "--search-steps", "0", "--goodput", "ttft:60000", "tpot:60000",
		"--quiet", "--save-result", "--result-dir", dir, "--result-filename", "c.json")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"## Disaggregated vs colocated at equal cores", "| cores | 2 cores | 2 cores |",
		"| workers | 1 prefill + 1 decode | 1 colocated |", "prefill on cores [0] (1 threads); decode on cores [1] (1 threads)",
		"colocated on cores [0 1] (2 threads)", "| KV cache per worker | llama.cpp: 1024 cells, ≤ 4 sequences |", "**Max rate per core (req/s/core)**", "| server reports mode | disaggregated | colocated |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("comparison lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "GPU") || strings.Contains(stderr, "GPU") {
		t.Errorf("a CPU comparison speaks of GPUs:\n%s\n%s", stdout, stderr)
	}
	c := readJSON(t, filepath.Join(dir, "c.json"))
	for _, s := range c["sides"].([]any) {
		if u := s.(map[string]any)["unit"]; u != "core" {
			t.Errorf("side unit %v, want core", u)
		}
	}
}
