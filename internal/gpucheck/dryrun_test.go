package gpucheck_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/gpucheck"
	"github.com/pdserve/pdserve/internal/repotest"
)

// EnvDryRun gates TestGPUCheckDryRun: it builds llama.cpp's CPU backend
// from source (tens of minutes on two busy cores the first time), so it
// runs only when asked, with PDSERVE_GPU_DRYRUN=1 (make gpu-dryrun).
const EnvDryRun = "PDSERVE_GPU_DRYRUN"

// TestGPUCheckDryRun runs what a GPU node runs, with --cpu: make
// gpu-bundle's script, then scripts/gpu-check.sh --cpu, and checks the
// report: both modes served every prompt and batch, the disaggregated
// requests moved KV and the colocated ones none, decode batched, greedy
// text matched, and the profile was written.
func TestGPUCheckDryRun(t *testing.T) {
	if os.Getenv(EnvDryRun) != "1" {
		t.Skipf("the GPU check's dry run builds llama.cpp from source: set %s=1 (make gpu-dryrun) to run it", EnvDryRun)
	}
	for _, c := range []string{"cmake", "c++", "xz"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Fatalf("%s is required (Debian: apt-get install -y cmake ninja-build g++ xz-utils): %v", c, err)
		}
	}
	root := repotest.Root(t)
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		t.Logf("%s %s:\n%s", name, strings.Join(args, " "), out)
		if err != nil {
			t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
		}
	}
	run("bash", "scripts/gpu-bundle.sh")
	out := t.TempDir()
	run("bash", "scripts/gpu-check.sh", "--cpu", "--out", out, "--jobs", "2")

	b, err := os.ReadFile(filepath.Join(out, "gpucheck.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r gpucheck.Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Skipped) > 0 {
		t.Errorf("skipped: %q", r.Skipped)
	}
	if len(r.Modes) != 2 || r.Modes[0].Mode != gpucheck.Disaggregated || r.Modes[1].Mode != gpucheck.Colocated {
		t.Fatalf("modes: %+v", r.Modes)
	}
	for _, m := range r.Modes {
		if len(m.Errors) > 0 || m.ExitedEarly {
			t.Errorf("%s: errors %q, exited early %v", m.Mode, m.Errors, m.ExitedEarly)
		}
		if len(m.TTFT) != len(r.Settings.PromptTokens) || len(m.Decode) != len(r.Settings.Batches) {
			t.Errorf("%s: %d TTFT points, %d decode points; want %d and %d", m.Mode, len(m.TTFT), len(m.Decode), len(r.Settings.PromptTokens), len(r.Settings.Batches))
		}
		for _, p := range m.TTFT {
			moved := p.Budget.KVBytesRaw > 0 && p.Budget.KVBytesWire > 0
			if p.Budget.Mode != m.Mode || p.Budget.PromptTokens != p.PromptTokens || p.ClientTTFTMs <= 0 || p.Budget.TTFTMs <= 0 ||
				moved != (m.Mode == gpucheck.Disaggregated) || p.Text == "" {
				t.Errorf("%s: TTFT point %+v", m.Mode, p)
			}
		}
		for _, d := range m.Decode {
			if d.AggregateTokS <= 0 || d.OutputTokens != d.Batch*r.Settings.DecodeTokens {
				t.Errorf("%s: decode point %+v", m.Mode, d)
			}
		}
		if last := m.Decode[len(m.Decode)-1]; last.MeanBatchSize <= 1 {
			t.Errorf("%s: %d concurrent requests decoded in a mean batch of %.2f", m.Mode, last.Batch, last.MeanBatchSize)
		}
	}
	if r.GreedyMatch == nil || !*r.GreedyMatch || r.GreedyCompared != len(r.Settings.PromptTokens) {
		t.Errorf("greedy match %v over %d prompts", r.GreedyMatch, r.GreedyCompared)
	}
	if r.Profile.Path == "" {
		t.Fatalf("no profile: %+v", r.Profile)
	}
	pb, err := os.ReadFile(filepath.Join(out, r.Profile.Path))
	if err != nil {
		t.Fatal(err)
	}
	var prof map[string]any
	if err := json.Unmarshal(pb, &prof); err != nil || len(prof) == 0 {
		t.Errorf("profile %s: %v", r.Profile.Path, err)
	}
	var build map[string]string
	if bb, err := os.ReadFile(filepath.Join(out, "build.json")); err != nil || json.Unmarshal(bb, &build) != nil || build["mode"] != "cpu" {
		t.Errorf("build.json: %v %v", build, err)
	}
}
