package llamacpp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
)

// TestCPUVariants: the variants are listed best first, the process loads
// the best one this processor can run (as llama.cpp's own choice does),
// and a variant that is absent or needs instructions this processor lacks
// is refused by name.
func TestCPUVariants(t *testing.T) {
	lib, _ := repotest.Llama(t)
	vs, err := CPUVariants(lib)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) == 0 {
		t.Skip("this llama.cpp build has no CPU variant libraries")
	}
	for i := 1; i < len(vs); i++ {
		if vs[i].Score > vs[i-1].Score {
			t.Fatalf("variants not best first: %v", vs)
		}
	}
	t.Logf("CPU variants on this processor (score 0: cannot run): %v", vs)
	if os.Getenv(envTestVariant) == "" {
		loadTestModel(t, "llama-f32")
		if got := LoadedCPUVariant(); got != vs[0].Name {
			t.Errorf("loaded CPU variant %q, want the best-scoring %q", got, vs[0].Name)
		}
	}
	if _, err := pickVariant(vs, "no-such-cpu"); !errors.Is(err, ErrNoLibrary) || !strings.Contains(err.Error(), `no CPU backend "no-such-cpu"`) {
		t.Errorf("unknown variant: %v", err)
	}
	for _, v := range vs {
		_, err := pickVariant(vs, v.Name)
		if (err == nil) != (v.Score > 0) {
			t.Errorf("pickVariant(%s) with score %d: %v", v.Name, v.Score, err)
		}
	}
}

// envVariants, set to 1, runs TestConformanceVariants.
const envVariants = "PDSERVE_TEST_LLAMA_VARIANTS"

// sameKernels maps a CPU variant to one whose kernels compute the same
// results, bit for bit: in ggml's CMake the pair differs only by
// AVX512_VBMI, an integer byte-permutation extension that this release's
// CPU code uses only to report the feature (ggml-cpu.c), so neither the
// kernels chosen nor any float operation differ. TestConformanceVariants
// runs one of each pair. Re-check when the pinned llama.cpp changes: grep
// its ggml/src/ggml-cpu for __AVX512VBMI__.
var sameKernels = map[string]string{
	"cannonlake": "skylakex",    // skylakex + AVX512_VBMI
	"icelake":    "cascadelake", // cascadelake + AVX512_VBMI
	"zen4":       "cooperlake",  // cooperlake + AVX512_VBMI
}

// TestConformanceVariants runs the conformance suite's kernelCases, in a
// process of its own each, on every CPU variant of the prebuilt llama.cpp
// that this processor can run besides the one it loads by default (which
// TestConformance covers with the whole suite), one of each pair in
// sameKernels: haswell, sandybridge, sse42, x64 and so on on an AVX2
// machine. The variants' kernels round differently, so this catches on
// one machine a suite that only passes on the kernels of the machine it
// was written on; what a variant cannot change (the engine's
// bookkeeping) runs once. Each kernel case must have passed on each model
// in the child's output, so a misspelt case name cannot pass by running
// nothing. The variants' processes run -parallel at a time (GOMAXPROCS
// by default; each test engine computes on one thread).
//
// It runs only when envVariants is 1: `make test-llama-variants`, a step
// of its own in CI, sets it, so that `make test` keeps to the default
// variant (the variants took most of its critical path). Any other
// value fails, so that a misspelt value cannot skip it.
func TestConformanceVariants(t *testing.T) {
	if os.Getenv(envTestVariant) != "" {
		t.Skip("child process")
	}
	if testing.Short() {
		t.Skip("-short: one variant only")
	}
	switch v := os.Getenv(envVariants); {
	case v == "1":
	case v == "":
		t.Skip(envVariants + " unset: the other CPU variants run in `make test-llama-variants`")
	default:
		t.Fatalf("%s=%q: want 1 (run) or unset (skip)", envVariants, v)
	}
	lib, _ := repotest.Llama(t)
	vs, err := CPUVariants(lib)
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{vs[0].Name: true} // TestConformance's
	if same, ok := sameKernels[vs[0].Name]; ok {
		covered[same] = true
	}
	var run []string
	for _, v := range vs[min(1, len(vs)):] {
		same, ok := sameKernels[v.Name]
		if v.Score > 0 && !covered[v.Name] && !(ok && covered[same]) {
			run = append(run, v.Name)
			covered[v.Name] = true
		}
		if ok && covered[v.Name] {
			covered[same] = true
		}
	}
	t.Logf("variants run: %v (the default, %s, is TestConformance's; pairs in sameKernels run once)", run, vs[0].Name)
	if len(run) == 0 {
		t.Skip("no other CPU variant runs on this processor")
	}
	for _, name := range run {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run", "^TestConformance$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), envTestVariant+"="+name)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("conformance on CPU variant %s: %v\n%s", name, err, failures(out))
			}
			if !strings.Contains(string(out), "llama.cpp CPU variant: "+name+"\n") {
				t.Fatalf("conformance on CPU variant %s did not run on it:\n%s", name, out)
			}
			for _, m := range conformanceModels {
				for _, c := range kernelCases {
					pass := "--- PASS: TestConformance/" + m.model + "/" + m.kv.String() + "/" + c + " "
					if !strings.Contains(string(out), pass) {
						t.Errorf("conformance on CPU variant %s: no %q in its output:\n%s", name, strings.TrimSpace(pass), out)
					}
				}
			}
		})
	}
}

// failures keeps the lines of a verbose test run that tell what failed.
func failures(out []byte) string {
	var b strings.Builder
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "=== ") && !strings.Contains(l, "--- PASS") {
			fmt.Fprintln(&b, l)
		}
	}
	return b.String()
}
