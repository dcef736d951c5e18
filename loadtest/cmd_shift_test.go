package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestShiftShort runs a short shifting trace (8 s halves, 3 GPUs) with a
// fixed split and elastic roles, under CI=true: both configurations run
// and measure requests in each minute (no figure is checked).
func TestShiftShort(t *testing.T) {
	if os.Getenv("CI") != "true" || testing.Short() {
		t.Skip("two local deployments for 16 s each: CI=true only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := cmdShift(ctx, []string{"--first-trace", "../data/azure-llm-2023/AzureLLMInferenceTrace_code.csv",
		"--second-trace", "../data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
		"--rates", "2,4", "--gpus", "3", "--phase", "8s", "--configs", "fixed-first,elastic", "--quiet",
		"--planner-interval", "1s", "--planner-window", "4s", "--planner-role-dwell", "2s"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("shift: %v\n%s", err, stderr.String())
	}
	t.Logf("%s", stdout.String())
	rows := shiftRows(stdout.String())
	for _, name := range []string{"fixed-first", "elastic"} {
		cells, ok := rows[name]
		if !ok {
			t.Fatalf("no row %s in:\n%s", name, stdout.String())
		}
		// min 1, overall goodput, attainment, moves, first request, gap;
		// "—" in a minute where nothing was sent.
		if len(cells) < 6 || cells[0] == "—" {
			t.Errorf("%s measured nothing in its minute: %q", name, cells)
		}
	}
}

// shiftRows returns the cells after the name of each row of shift's
// goodput table, by configuration.
func shiftRows(out string) map[string][]string {
	rows := map[string][]string{}
	in := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == "configuration":
			in = true
		case in && len(f) == 0:
			in = false
		case in:
			// Cells are separated by two or more spaces.
			var cells []string
			for _, c := range strings.Split(line, "  ") {
				if c = strings.TrimSpace(c); c != "" {
					cells = append(cells, c)
				}
			}
			rows[cells[0]] = cells[1:]
		}
	}
	return rows
}

// TestShiftBadFlags: bad options are usage errors, before anything starts.
func TestShiftBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--gpus", "3"}, "--rates R1,R2 is required"},
		{[]string{"--rates", "1"}, "want R1,R2"},
		{[]string{"--rates", "1,2", "--configs", "fixed-first,bogus"}, "unknown configuration"},
		{[]string{"--rates", "1,2", "--gpus", "3", "--planner-start", "2:2"}, "is not --gpus 3"},
		{[]string{"--rates", "1,2", "--gpus", "1"}, "want ≥ 2"},
		{[]string{"--rates", "100000,2", "--first-trace", "../data/azure-llm-2023/AzureLLMInferenceTrace_code.csv"}, "the trace has"},
	} {
		var stdout, stderr bytes.Buffer
		err := cmdShift(context.Background(), tc.args, &stdout, &stderr)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error()+stderr.String(), tc.want) {
			t.Errorf("%v: error %v (stderr %q), want a usage error with %q", tc.args, err, stderr.String(), tc.want)
		}
	}
}
