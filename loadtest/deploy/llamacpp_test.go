package deploy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/loadtest/client"
	"github.com/pdserve/pdserve/loadtest/deploy"
	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/workload"
)

// TestMain lets the llama.cpp deployments run this test binary again as
// their worker processes.
func TestMain(m *testing.M) {
	deploy.RunChild()
	os.Exit(m.Run())
}

// tinyModel writes mkgguf's tiny-llama shape (random f16 weights over the
// llama-spm vocabulary) and returns its path and the libraries' directory.
func tinyModel(t *testing.T) (model, lib string) {
	t.Helper()
	lib, vocab := repotest.Llama(t)
	o, err := gguf.Shape("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	o.Vocab, o.Type, o.Seed = filepath.Join(vocab, o.Vocab), gguf.F16, 1
	model = filepath.Join(t.TempDir(), "tiny.gguf")
	if err := gguf.WriteRandom(model, o); err != nil {
		t.Fatal(err)
	}
	return model, lib
}

// allowedCPUs reads the cores every thread of process pid may run on.
func allowedCPUs(t *testing.T, pid int) map[string][]int {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int{}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil {
			continue // the thread ended
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				out[task.Name()] = parseCPUList(t, strings.TrimSpace(v))
			}
		}
	}
	return out
}

func parseCPUList(t *testing.T, s string) []int {
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, ok := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			t.Fatalf("cpu list %q", s)
		}
		b := a
		if ok {
			if b, err = strconv.Atoi(hi); err != nil {
				t.Fatalf("cpu list %q", s)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out
}

// TestLlamaCppPinned starts the two llama.cpp deployments compare runs on
// two cores: 1 prefill + 1 decode worker, each a process pinned to one
// core, and one colocated worker on both; every thread of each worker
// keeps its cores, and each deployment serves completions.
func TestLlamaCppPinned(t *testing.T) {
	if testing.Short() {
		t.Skip("starts llama.cpp worker processes")
	}
	if runtime.GOOS != "linux" {
		t.Skip("pinning needs Linux")
	}
	if runtime.NumCPU() < 2 {
		t.Skip("needs two cores")
	}
	model, lib := tinyModel(t)
	w, err := workload.Random(workload.RandomOptions{InputLen: 24, OutputLen: 4}, 2, 1, workload.Synth{})
	if err != nil {
		t.Fatal(err)
	}
	base := deploy.Spec{Engine: "llamacpp", Model: model, LlamaLib: lib, CtxSize: 1024, MaxSeqs: 4, CPUs: []int{0, 1}}
	dis, col := base, base
	dis.Mode, dis.PrefillWorkers, dis.DecodeWorkers = deploy.Disaggregated, 1, 1
	col.Mode, col.DecodeWorkers = deploy.Colocated, 1
	for _, tc := range []struct {
		spec deploy.Spec
		want map[string][]int
	}{
		{dis, map[string][]int{"prefill-0": {0}, "decode-0": {1}}},
		{col, map[string][]int{"colocated-0": {0, 1}}},
	} {
		t.Run(tc.spec.Mode, func(t *testing.T) {
			if n, err := tc.spec.GPUs(); err != nil || n != 2 {
				t.Errorf("GPUs() = %d, %v; want 2 cores", n, err)
			}
			ctx := context.Background()
			l, err := deploy.Start(ctx, tc.spec, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := l.Close(ctx); err != nil {
					t.Error(err)
				}
				for _, p := range l.Processes() {
					if _, err := os.Stat(fmt.Sprintf("/proc/%d/status", p.PID)); err == nil {
						if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID)); !strings.Contains(string(b), "State:\tZ") {
							t.Errorf("worker %s (pid %d) still runs after Close", p.ID, p.PID)
						}
					}
				}
			}()
			c, err := client.New(client.Options{BaseURL: l.URL(), IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			for i := range w.Requests {
				o := c.Do(ctx, &w.Requests[i])
				if !o.Success || o.OutputTokens != 4 {
					t.Fatalf("request %d: success %v, %d tokens, error %q", i, o.Success, o.OutputTokens, o.Error)
				}
				if o.Budget == nil || o.Budget["mode"] != tc.spec.Mode {
					t.Errorf("budget %v, want mode %s", o.Budget, tc.spec.Mode)
				}
			}
			got := map[string][]int{}
			for _, p := range l.Processes() {
				got[p.ID] = p.CPUs
				threads := allowedCPUs(t, p.PID)
				if len(threads) < 2 {
					t.Errorf("worker %s: %d threads, want the Go runtime's and llama.cpp's", p.ID, len(threads))
				}
				for tid, cpus := range threads {
					if !cmp.Equal(cpus, p.CPUs) {
						t.Errorf("worker %s thread %s may run on %v, want %v", p.ID, tid, cpus, p.CPUs)
					}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("workers' cores (-want +got):\n%s", diff)
			}
		})
	}
}
