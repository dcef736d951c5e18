package planner

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/pdserve/pdserve/pkg/workload"
)

// TraceWindow is one window of a trace: the requests that arrived in
// [Start, End), counted from the trace's first request, as a workload of
// their own (nil when none arrived). Its Rate is the window's requests
// over its length (the last window ends with the trace's last arrival).
type TraceWindow struct {
	Start, End time.Duration
	Requests   int
	Workload   *Workload
}

// LoadTraceWindows reads a trace (an Azure .csv or a Mooncake .jsonl, as
// LoadWorkload) and cuts it into consecutive windows of length window
// (> 0), the first starting at the trace's first request. Errors wrap
// ErrWorkload, or the file's read error.
func LoadTraceWindows(spec string, window time.Duration) ([]TraceWindow, error) {
	if window <= 0 {
		return nil, fmt.Errorf("%w: window %v must be > 0", ErrWorkload, window)
	}
	kind := ""
	switch {
	case strings.HasSuffix(spec, ".csv"):
		kind = "azure"
	case strings.HasSuffix(spec, ".jsonl"):
		kind = "mooncake"
	default:
		return nil, fmt.Errorf("%w: %q: windows need a trace with arrival times (an Azure .csv or a Mooncake .jsonl)", ErrWorkload, spec)
	}
	data, err := os.ReadFile(spec)
	if err != nil {
		return nil, fmt.Errorf("planner: read workload: %w", err)
	}
	rows, err := parseTrace(kind, data)
	if err != nil {
		return nil, err
	}
	return cutWindows(kind, rows, window)
}

// cutWindows cuts rows (in arrival order, ≥ 1) into windows of length
// window.
func cutWindows(kind string, rows []workload.TraceRow, window time.Duration) ([]TraceWindow, error) {
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: the trace has no requests", ErrWorkload)
	}
	first, last := rows[0].Arrival, rows[len(rows)-1].Arrival
	var out []TraceWindow
	i := 0
	for start := time.Duration(0); ; start += window {
		end := start + window
		final := end >= last-first // the last window takes the last arrival too
		tw := TraceWindow{Start: start, End: min(end, last-first)}
		j := i
		for j < len(rows) && (final || rows[j].Arrival-first < end) {
			j++
		}
		if tw.Requests = j - i; tw.Requests > 0 {
			tw.Workload = rowsWorkload(kind, rows[i:j])
			tw.Workload.Rate = 0
			if l := (tw.End - tw.Start).Seconds(); l > 0 {
				tw.Workload.Rate = float64(tw.Requests) / l
			}
			tw.Workload.Description = fmt.Sprintf("%s trace window %v–%v: %d requests, %.2f req/s", kind, tw.Start, tw.End, tw.Requests, tw.Workload.Rate)
			if err := tw.Workload.Validate(); err != nil {
				return nil, fmt.Errorf("window at %v: %w", start, err)
			}
		}
		out = append(out, tw)
		i = j
		if final {
			break
		}
	}
	return out, nil
}

// RoleChanges is the fewest workers that change role to go from design a
// to design b: each role that shrinks gives workers, each that grows
// takes them, and every worker given and taken at once is one change;
// the rest are workers added or removed. Chunk sizes do not count.
func RoleChanges(a, b Design) int {
	var gave, took int
	for _, d := range [][2]int{{a.Prefill, b.Prefill}, {a.Decode, b.Decode}, {a.Colocated, b.Colocated}} {
		if d[0] > d[1] {
			gave += d[0] - d[1]
		} else {
			took += d[1] - d[0]
		}
	}
	return min(gave, took)
}

// ChangesPerDay scales role changes counted over transitions between
// consecutive windows of length window to 24 hours: changes ×
// (24 h / window) / transitions. 0 with no transition.
func ChangesPerDay(changes, transitions int, window time.Duration) float64 {
	if transitions <= 0 || window <= 0 {
		return 0
	}
	return float64(changes) / float64(transitions) * float64(24*time.Hour) / float64(window)
}
