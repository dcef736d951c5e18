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
	var b strings.Builder
	b.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	base := time.Date(2023, 11, 16, 0, 0, 0, 0, time.UTC)
	i := 0
	for at := time.Duration(0); at < 3*time.Minute; i++ {
		in, out, rate := 4000+(i%7)*100, 12, 30
		if at/time.Minute == 1 {
			in, out, rate = 150+(i%5)*20, 350, 120
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
	} {
		code, _, errs := run(t, append(cloneArgs(base), tc.args...)...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
}

func cloneArgs(s []string) []string { return append([]string(nil), s...) }
