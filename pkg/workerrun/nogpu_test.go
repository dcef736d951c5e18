package workerrun

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/gguf"
)

// TestMainNoGPU: a worker told to require a GPU (--llama-device gpu, or
// $PDSERVE_LLAMA_DEVICE=gpu as the CUDA image sets) on a machine where
// llama.cpp finds none says so in one line on stderr and exits 1; told
// --llama-device cpu it gets past the engine. A bad policy is a flag
// error (exit 2).
func TestMainNoGPU(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	model := filepath.Join(t.TempDir(), "m.gguf")
	if err := gguf.WriteRandom(model, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 1, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 64, Type: gguf.F32, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	args := []string{"--engine=llamacpp", "--model=" + model, "--llama-lib=" + lib, "--ctx-size=64", "--log-level=error",
		"--grpc-addr=127.0.0.1:0", "--metrics-addr=127.0.0.1:0"}
	for _, tc := range []struct {
		name string
		args []string
		env  string
	}{
		{"flag", []string{"--llama-device=gpu"}, ""},
		{"environment", nil, "gpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PDSERVE_LLAMA_DEVICE", tc.env)
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), "prefill-worker", NewPrefillOptions(), append(append([]string{}, args...), tc.args...), &stdout, &stderr)
			if code != 1 {
				t.Errorf("exit code %d, want 1", code)
			}
			msg := stderr.String()
			if !strings.HasPrefix(msg, "prefill-worker: no GPU: llama.cpp (") || strings.Count(msg, "\n") != 1 ||
				!strings.Contains(msg, "--llama-device cpu") {
				t.Errorf("stderr %q: want one line 'prefill-worker: no GPU: …' saying what to do", msg)
			}
		})
	}

	var stdout, stderr bytes.Buffer
	bad := append(append([]string{}, args...), "--llama-device=cuda")
	if code := Main(context.Background(), "prefill-worker", NewPrefillOptions(), bad, &stdout, &stderr); code != 2 {
		t.Errorf("--llama-device cuda: exit code %d, want 2", code)
	}
	if want := "prefill-worker: --llama-device cuda: must be auto, gpu or cpu\n"; stderr.String() != want {
		t.Errorf("--llama-device cuda: stderr %q, want %q", stderr.String(), want)
	}

	// cpu, over the environment's gpu: the engine loads (the worker then
	// stops at once on its cancelled context).
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	stderr.Reset()
	t.Setenv("PDSERVE_LLAMA_DEVICE", "gpu")
	Main(ctx, "prefill-worker", NewPrefillOptions(), append(append([]string{}, args...), "--llama-device=cpu"), &stdout, &stderr)
	if strings.Contains(stderr.String(), "no GPU") {
		t.Errorf("--llama-device cpu: stderr %q", stderr.String())
	}
}
