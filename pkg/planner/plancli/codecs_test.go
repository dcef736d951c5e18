package plancli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner"
)

// `coordinator codecs --out` writes a codec profile that `plan
// --codec-profile` plans with, and the plan names it as its speeds'
// source; the default is the built-in profile.
func TestCodecsProfileRoundTrip(t *testing.T) {
	file := filepath.Join(t.TempDir(), "codecs.json")
	host := perfmodel.Host{CPU: "test CPU", LogicalCPUs: 4, Threads: 1, OS: "linux", Arch: "amd64"}
	var out, errb bytes.Buffer
	if code := Codecs(t.Context(), []string{"--budget", "60ms", "--out", file}, &out, &errb, host); code != 0 {
		t.Fatalf("codecs: exit %d, stderr %s", code, errb.String())
	}
	for _, want := range []string{"CODEC", "bf16", "no CPU"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("codecs table lacks %q:\n%s", want, out.String())
		}
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	p, err := planner.ParseCodecProfile(data)
	if err != nil {
		t.Fatal(err)
	}
	// The file records the command, not this machine's directories.
	if strings.Contains(p.Command, string(filepath.Separator)) || !strings.Contains(p.Command, "codecs.json") {
		t.Errorf("command %q", p.Command)
	}
	code, stdout, stderr := run(t, append(base, "--codec", "bf16", "--codec-profile", file)...)
	if code != 0 {
		t.Fatalf("plan: exit %d, stderr %s", code, stderr)
	}
	if !strings.Contains(stdout, "codec profile "+file) || !strings.Contains(stdout, "on test CPU (4 logical CPUs") {
		t.Errorf("plan does not name its codec profile:\n%s", stdout)
	}
	_, stdout, _ = run(t, append(base, "--codec", "bf16")...)
	if !strings.Contains(stdout, "built-in codec profile") {
		t.Errorf("default plan does not name the built-in codec profile:\n%s", stdout)
	}
	if code, _, stderr := run(t, append(base, "--codec-profile", file+".missing")...); code != 2 || !strings.Contains(stderr, "--codec-profile") {
		t.Errorf("missing codec profile: exit %d, stderr %q", code, stderr)
	}
	if code := Codecs(t.Context(), []string{"--output", "yaml"}, &out, &errb, host); code != 2 {
		t.Errorf("codecs --output yaml: exit %d, want 2", code)
	}
}

// Range warnings go to stderr as well as into the report.
func TestPlanWarnsOnStderr(t *testing.T) {
	args := []string{"--profile", "h200/llama-3-8b/tp1", "--workload", "fixed:512/64",
		"--slo-ttft", "400ms", "--slo-tpot", "40ms", "--gpu-budget", "2", "--requests", "100", "--max-batch-tokens", "512"}
	code, stdout, stderr := run(t, args...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	// h200's one calibration point is a decode of 8 sequences at 96
	// tokens: 512-token prompts lie beyond it.
	if !strings.Contains(stderr, "warning: the workload leaves the calibration points of profile h200/llama-3-8b/tp1") ||
		!strings.Contains(stdout, "warning: the workload leaves") {
		t.Errorf("no range warning:\nstdout %s\nstderr %s", stdout, stderr)
	}
}
