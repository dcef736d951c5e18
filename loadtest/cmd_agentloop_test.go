package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/loadtest/agentloop"
)

// TestAgentLoopCommand: agentloop starts a fresh sim deployment per
// transport (2 colocated H100 workers of Llama-3-8B), runs 2 loops of 2
// turns over each, and reports both side by side with their ratios, in
// Markdown and in the result JSON (both transports, every turn, a loop
// time, the load average). Bad flags are usage errors before anything
// starts.
func TestAgentLoopCommand(t *testing.T) {
	for _, args := range [][]string{
		{"--loops", "0"}, {"--transports", "ws,smoke-signals"}, {"--local", "sideways"},
		{"--local", "colocated", "--base-url", "http://127.0.0.1:1"}, {"--tool-output-bytes", "0"},
	} {
		if code, _, stderr := runCLI(t, append([]string{"agentloop"}, args...)...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (usage); stderr:\n%s", args, code, exitUsage, stderr)
		}
	}
	dir := t.TempDir()
	code, stdout, stderr := runCLI(t, "agentloop", "--local", "colocated", "--profile", "h100/llama-3-8b/tp1", "--gpus", "2",
		"--loops", "2", "--turns", "2", "--instructions-bytes", "200", "--tool-output-bytes", "50", "--quiet",
		"--save-result", "--result-dir", dir, "--result-filename", "a.json")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"## Agent loops: 2 at once × 2 turns", "| 2 |", "end-to-end p50 ws/http:", "- workers: 2 colocated", "load average"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "a.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Transports map[string]agentloop.Summary `json:"transports"`
		Ratios     *agentRatios                 `json:"ratios_ws_over_http"`
		Raw        map[string][]agentloop.Loop  `json:"loops_detail"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	if res.Ratios == nil || len(res.Ratios.TTFTP50PerTurn) != 2 || res.Ratios.E2EP50 <= 0 {
		t.Errorf("ratios %+v", res.Ratios)
	}
	for _, tr := range []string{"ws", "http"} {
		s := res.Transports[tr]
		if s.Loops != 2 || s.Failed != 0 || len(s.PerTurn) != 2 || s.E2EMsP50 <= 0 || len(res.Raw[tr]) != 2 {
			t.Errorf("%s: %+v", tr, s)
		}
	}
}
