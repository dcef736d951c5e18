package planner

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRoleChanges(t *testing.T) {
	for _, tc := range []struct {
		a, b Design
		want int
	}{
		{Design{Prefill: 3, Decode: 1}, Design{Prefill: 1, Decode: 3}, 2},
		{Design{Prefill: 1, Decode: 3}, Design{Prefill: 3, Decode: 1}, 2},
		{Design{Prefill: 2, Decode: 2}, Design{Prefill: 3, Decode: 2}, 0},    // one added
		{Design{Prefill: 3, Decode: 2}, Design{Prefill: 2, Decode: 2}, 0},    // one removed
		{Design{Prefill: 3, Decode: 1}, Design{Prefill: 1, Decode: 2}, 1},    // one moved, one removed
		{Design{Prefill: 1, Decode: 1}, Design{Prefill: 2, Decode: 4}, 0},    // grown only
		{Design{Prefill: 2, Decode: 2}, Design{Colocated: 3, Chunk: 512}, 3}, // three move, one removed
		{Design{Colocated: 2, Chunk: 512}, Design{Colocated: 2, Chunk: 2048}, 0},
		{Design{}, Design{Prefill: 1, Decode: 1}, 0},
	} {
		if got := RoleChanges(tc.a, tc.b); got != tc.want {
			t.Errorf("RoleChanges(%v, %v) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestChangesPerDay(t *testing.T) {
	for _, tc := range []struct {
		changes, transitions int
		window               time.Duration
		want                 float64
	}{
		{2, 1, time.Hour, 48},             // 2 per hourly transition, 24 transitions a day
		{3, 23, time.Hour, 3.0 / 23 * 24}, // a day of hourly windows
		{4, 2, 30 * time.Minute, 96},
		{5, 0, time.Hour, 0},
	} {
		if got := ChangesPerDay(tc.changes, tc.transitions, tc.window); got != tc.want {
			t.Errorf("ChangesPerDay(%d, %d, %v) = %v, want %v", tc.changes, tc.transitions, tc.window, got, tc.want)
		}
	}
}

// writeAzure writes an Azure trace: per row its arrival (from 00:00:00)
// and lengths.
func writeAzure(t *testing.T, rows [][3]int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	base := time.Date(2023, 11, 16, 0, 0, 0, 0, time.UTC)
	for _, r := range rows {
		fmt.Fprintf(&b, "%s,%d,%d\n", base.Add(time.Duration(r[0])*time.Second).Format("2006-01-02 15:04:05.0000000"), r[1], r[2])
	}
	name := filepath.Join(t.TempDir(), "trace.csv")
	if err := os.WriteFile(name, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestLoadTraceWindows(t *testing.T) {
	// Arrivals at 0, 30, 59 s (first minute), none in the second, 120 s
	// exactly on the third's start and 150 s the last.
	name := writeAzure(t, [][3]int{{0, 100, 10}, {30, 200, 20}, {59, 300, 30}, {120, 400, 40}, {150, 500, 50}})
	wins, err := LoadTraceWindows(name, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		start, end time.Duration
		n          int
		in         []int
		rate       float64
	}
	var g []got
	for _, w := range wins {
		x := got{start: w.Start, end: w.End, n: w.Requests}
		if w.Workload != nil {
			x.rate = w.Workload.Rate
			for _, l := range w.Workload.Lengths {
				x.in = append(x.in, l.In)
			}
		}
		g = append(g, x)
	}
	want := []got{
		{0, time.Minute, 3, []int{100, 200, 300}, 3.0 / 60},
		{time.Minute, 2 * time.Minute, 0, nil, 0},
		{2 * time.Minute, 150 * time.Second, 2, []int{400, 500}, 2.0 / 30},
	}
	if fmt.Sprint(g) != fmt.Sprint(want) {
		t.Errorf("windows\n got %v\nwant %v", g, want)
	}
	if _, err := LoadTraceWindows(name, 0); err == nil {
		t.Error("window 0: no error")
	}
	if _, err := LoadTraceWindows("fixed:1/1", time.Minute); err == nil {
		t.Error("a workload without arrivals: no error")
	}
}
