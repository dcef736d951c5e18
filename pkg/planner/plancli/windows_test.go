package plancli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/planner"
)

// shiftTrace writes an Azure trace of three minutes whose mix moves each
// minute: long prompts with short answers at 30 req/s, then short prompts
// with long answers at 120 req/s, then the first again.
func shiftTrace(t *testing.T) string {
	t.Helper()
	return minutesTrace(t, []traceMinute{{false, 30}, {true, 120}, {false, 30}})
}

// traceMinute is one minute of minutesTrace: chat (short prompts, long
// answers) or code (long prompts, short answers) at rate req/s.
type traceMinute struct {
	chat bool
	rate int
}

// minutesTrace writes an Azure trace of one minute per element of mins.
func minutesTrace(t *testing.T, mins []traceMinute) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	base := time.Date(2023, 11, 16, 0, 0, 0, 0, time.UTC)
	i := 0
	for at := time.Duration(0); at < time.Duration(len(mins))*time.Minute; i++ {
		m := mins[at/time.Minute]
		in, out, rate := 4000+(i%7)*100, 12, m.rate
		if m.chat {
			in, out = 150+(i%5)*20, 350
		}
		fmt.Fprintf(&b, "%s,%d,%d\n", base.Add(at).Format("2006-01-02 15:04:05.0000000"), in, out)
		at += time.Second / time.Duration(rate)
	}
	name := filepath.Join(t.TempDir(), "shift.csv")
	if err := os.WriteFile(name, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestPlanWindows(t *testing.T) {
	trace := shiftTrace(t)
	args := []string{"--profile", "h100/llama-3-8b/tp1", "--workload", trace, "--slo-ttft", "1s", "--slo-tpot", "50ms",
		"--gpu-budget", "8", "--requests", "100", "--cache-sweep=false", "--window", "1m"}
	code, out, errs := run(t, append(args, "--output", "json")...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errs)
	}
	var rep WindowsReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if len(rep.Windows) != 3 {
		t.Fatalf("%d windows, want 3: %+v", len(rep.Windows), rep.Windows)
	}
	sum := 0
	for i, w := range rep.Windows {
		if w.Skipped != "" || w.Design.Prefill < 1 || w.Design.Decode < 1 {
			t.Fatalf("window %d not planned: %+v", i, w)
		}
		if i > 0 {
			sum += planner.RoleChanges(rep.Windows[i-1].Design, w.Design)
		}
	}
	// The code-like minutes need more prefill for their share of decode
	// than the chat-like minute: the ratio moves and back.
	if a, b := rep.Windows[0].Design, rep.Windows[1].Design; a.Prefill*b.Decode <= b.Prefill*a.Decode {
		t.Errorf("P:D %d:%d then %d:%d: the chat minute has no more decode per prefill", a.Prefill, a.Decode, b.Prefill, b.Decode)
	}
	if rep.Changes != sum || sum == 0 || rep.Transits != 2 {
		t.Errorf("role changes %d over %d transitions; the designs give %d over 2", rep.Changes, rep.Transits, sum)
	}
	if want := float64(sum) / 2 * 24 * 60; rep.PerDay != want {
		t.Errorf("%v role changes a day, want %v", rep.PerDay, want)
	}

	code, table, errs := run(t, args...)
	if code != 0 {
		t.Fatalf("table: exit %d, stderr %s", code, errs)
	}
	if want := fmt.Sprintf("%d over 2 transitions of 1m0s → %.1f a day", sum, rep.PerDay); !strings.Contains(table, want) {
		t.Errorf("table lacks %q:\n%s", want, table)
	}
}

func TestPlanWindowsBadFlags(t *testing.T) {
	trace := shiftTrace(t)
	base := []string{"--profile", "h100/llama-3-8b/tp1", "--slo-ttft", "1s", "--slo-tpot", "50ms", "--window", "1m"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--workload", trace, "--rate", "3"}, "drop --rate"},
		{[]string{"--workload", trace, "--design", "1:1"}, "drop --design"},
		{[]string{"--workload", "fixed:10/10"}, "arrival times"},
		{[]string{"--workload", trace, "--window", "-1m"}, "must be > 0"},
		{[]string{"--workload", trace, "--gpus", "-1"}, "--gpus -1 must be ≥ 0"},
		{[]string{"--workload", trace, "--gpus", "4", "--gpu-budget", "8"}, "give one"},
		{[]string{"--workload", trace, "--gpus", "1"}, "GPU budget 1 < 2"},
	} {
		code, _, errs := run(t, append(cloneArgs(base), tc.args...)...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
	// Workers of tp 2 cannot use 5 GPUs in full.
	code, _, errs := run(t, "--profile", "h100/llama-2-70b/tp2", "--slo-ttft", "1s", "--slo-tpot", "50ms", "--workload", trace, "--window", "1m", "--gpus", "5")
	if want := "--gpus 5: no split into ≥ 1 prefill and ≥ 1 decode worker of 2 and 2 GPUs each"; code != 2 || !strings.Contains(errs, want) {
		t.Errorf("--gpus 5 of tp 2: exit %d, stderr %q, want 2 and %q", code, errs, want)
	}
	// --gpus fixes the pool of a --window plan only: alone it would change
	// nothing.
	code, _, errs = run(t, "--profile", "h100/llama-3-8b/tp1", "--slo-ttft", "1s", "--slo-tpot", "50ms", "--workload", "fixed:100/10", "--gpus", "4")
	if want := "--gpus fixes the pool of a --window plan"; code != 2 || !strings.Contains(errs, want) {
		t.Errorf("--gpus without --window: exit %d, stderr %q, want 2 and %q", code, errs, want)
	}
}

func cloneArgs(s []string) []string { return append([]string(nil), s...) }

func TestBestSplit(t *testing.T) {
	splits := []planner.Design{{Prefill: 1, Decode: 3}, {Prefill: 2, Decode: 2}, {Prefill: 3, Decode: 1}}
	d := func(p, dd int) *planner.Design { return &planner.Design{Prefill: p, Decode: dd} }
	for _, tc := range []struct {
		name string
		att  []float64
		prev *planner.Design
		want int
	}{
		{"highest wins", []float64{0.5, 0.9, 0.7}, nil, 1},
		{"highest wins over prev", []float64{0.5, 0.9, 0.89}, d(3, 1), 1},
		{"tie: first without prev", []float64{1, 1, 0.2}, nil, 0},
		{"tie: prev kept", []float64{1, 1, 1}, d(3, 1), 2},
		{"tie: prev not among the best", []float64{0.2, 1, 1}, d(1, 3), 1},
		{"tie: prev elsewhere", []float64{1, 1, 0.9}, d(5, 5), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := bestSplit(splits, tc.att, tc.prev); got != tc.want {
				t.Errorf("bestSplit(%v, prev %v) = %d, want %d", tc.att, tc.prev, got, tc.want)
			}
		})
	}
}

// TestPlanWindowsFixedPool: with --gpus every window uses exactly that
// many GPUs, the split moves with the mix, and every worker a role gains
// is one moved from the other role: the role changes are the prefill
// count's steps. In the fewest-GPUs mode (no --gpus) the chat minute's
// design has another total, and the changes (the moves left after
// workers added or removed) fall short of the designs' differences.
func TestPlanWindowsFixedPool(t *testing.T) {
	// Chat at 40 req/s, long prompts at 24 req/s, chat at 200 req/s.
	trace := minutesTrace(t, []traceMinute{{true, 40}, {false, 24}, {true, 200}})
	const gpus = 4
	args := []string{"--profile", "h100/llama-3-8b/tp1", "--workload", trace, "--slo-ttft", "1s", "--slo-tpot", "50ms",
		"--requests", "100", "--cache-sweep=false", "--window", "1m", "--gpus", fmt.Sprint(gpus), "--output", "json"}
	code, out, errs := run(t, args...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errs)
	}
	var rep WindowsReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if len(rep.Windows) != 3 || rep.FixedGPUs != gpus {
		t.Fatalf("%d windows on %d GPUs, want 3 on %d: %+v", len(rep.Windows), rep.FixedGPUs, gpus, rep.Windows)
	}
	moved := 0
	for i, w := range rep.Windows {
		t.Logf("window %d: %d:%d attainment %.3f", i, w.Design.Prefill, w.Design.Decode, w.Attainment)
		if w.GPUs != gpus || w.Design.Prefill+w.Design.Decode != gpus || w.Design.Prefill < 1 || w.Design.Decode < 1 {
			t.Fatalf("window %d: %+v, want a split of %d GPUs", i, w, gpus)
		}
		if i > 0 {
			step := w.Design.Prefill - rep.Windows[i-1].Design.Prefill
			moved += max(step, -step)
			if w.RoleChanges != max(step, -step) {
				t.Errorf("window %d: %d role changes, the prefill count moved by %d", i, w.RoleChanges, step)
			}
		}
	}
	if a, b, c := rep.Windows[0].Design, rep.Windows[1].Design, rep.Windows[2].Design; b.Prefill <= a.Prefill || b.Prefill <= c.Prefill {
		t.Errorf("P:D %s, %s, %s: the long-prompt minute has no more prefill workers than the chat minutes", a, b, c)
	}
	if rep.Changes != moved || rep.Transits != 2 {
		t.Errorf("%d role changes over %d transitions, the designs moved %d workers over 2", rep.Changes, rep.Transits, moved)
	}
	if want := float64(moved) / 2 * 24 * 60; rep.PerDay != want {
		t.Errorf("%v role changes a day, want %v", rep.PerDay, want)
	}

	code, table, errs := run(t, args[:len(args)-2]...)
	if code != 0 {
		t.Fatalf("table: exit %d, stderr %s", code, errs)
	}
	for _, want := range []string{"pool: 4 GPUs in every window", fmt.Sprintf("%d over 2 transitions", moved)} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}
