package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/pdserve/pdserve/loadtest/metrics"
)

// ErrBaseline reports a baseline or result file that cannot be used.
var ErrBaseline = errors.New("report: unusable result file")

// ReadResult reads a result JSON file into a generic map.
func ReadResult(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBaseline, path, err)
	}
	return m, nil
}

// Check names one figure to compare: a metric (ttft, tpot, itl, e2el,
// ttfo) at a statistic (mean, median, or a percentile such as p90).
type Check struct {
	Metric string
	Stat   string
}

// Key returns the result JSON key, e.g. "p90_ttft_ms".
func (c Check) Key() string { return c.Stat + "_" + c.Metric + "_ms" }

// ParseStat parses --regress-stat: mean, median, or a percentile given as
// "90" or "p90".
func ParseStat(s string) (string, error) {
	switch s {
	case "mean", "median":
		return s, nil
	}
	p, err := strconv.ParseFloat(strings.TrimPrefix(s, "p"), 64)
	if err != nil || !(p > 0 && p <= 100) {
		return "", fmt.Errorf("%w: statistic %q: want mean, median or a percentile such as p90", metrics.ErrBadSpec, s)
	}
	return metrics.PercentileName(p), nil
}

// Drift bounds a regression check.
type Drift struct {
	// Max is the largest allowed relative change, e.g. 0.2 for +20%.
	Max float64
	// FloorMs ignores changes smaller than this many milliseconds, so that
	// tiny figures do not fail on noise.
	FloorMs float64
	// TwoSided also fails on improvements beyond Max (a stale baseline).
	TwoSided bool
}

// Finding is one checked figure.
type Finding struct {
	Key               string
	Baseline, Current float64
	Change            float64 // relative: (current − baseline) / baseline
	Failed            bool
	Reason            string
}

// Regress compares current against baseline on every check, and on the
// number of failed requests (more failures than the baseline fail). It
// returns the findings and whether any failed. A check missing from either
// file is an error.
func Regress(baseline, current map[string]any, checks []Check, d Drift) ([]Finding, bool, error) {
	var out []Finding
	bad := false
	for _, c := range checks {
		k := c.Key()
		b, okB := number(baseline[k])
		cur, okC := number(current[k])
		if !okB || !okC {
			return nil, false, fmt.Errorf("%w: %s missing from the baseline or the current result (rerun with that percentile in --metric-percentiles)", ErrBaseline, k)
		}
		f := Finding{Key: k, Baseline: b, Current: cur}
		if b > 0 {
			f.Change = (cur - b) / b
		} else if cur > 0 {
			f.Change = math.Inf(1)
		}
		switch {
		case f.Change > d.Max && cur-b > d.FloorMs:
			f.Failed, f.Reason = true, fmt.Sprintf("slower by %s (limit +%s)", pctSigned(f.Change), pct(d.Max))
		case d.TwoSided && f.Change < -d.Max && b-cur > d.FloorMs:
			f.Failed, f.Reason = true, fmt.Sprintf("faster by %s: update the baseline (limit ±%s)", pctSigned(f.Change), pct(d.Max))
		default:
			f.Reason = "ok"
		}
		bad = bad || f.Failed
		out = append(out, f)
	}
	bf, _ := number(baseline["failed"])
	cf, okF := number(current["failed"])
	if okF {
		f := Finding{Key: "failed", Baseline: bf, Current: cf, Reason: "ok"}
		if cf > bf {
			f.Failed, f.Reason = true, "more failed requests than the baseline"
			bad = true
		}
		out = append(out, f)
	}
	return out, bad, nil
}

func number(v any) (float64, bool) {
	f, ok := v.(float64)
	return f, ok
}

func pctSigned(x float64) string {
	if math.IsInf(x, 1) {
		return "+inf"
	}
	return fmt.Sprintf("%+.1f%%", 100*x)
}

// RegressMarkdown writes the findings as a table and a verdict line.
func RegressMarkdown(w io.Writer, baselinePath string, fs []Finding, failed bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## Regression check against %s\n\n", baselinePath)
	b.WriteString("| figure | baseline | current | change | verdict |\n|---|---:|---:|---:|---|\n")
	for _, f := range fs {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", f.Key, f2(f.Baseline), f2(f.Current), pctSigned(f.Change), f.Reason)
	}
	if failed {
		b.WriteString("\n**REGRESSION**: at least one figure drifted beyond its limit.\n")
	} else {
		b.WriteString("\nNo regression.\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
