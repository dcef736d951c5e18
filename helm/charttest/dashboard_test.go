package charttest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/metrics"
)

// recordingRegisterer keeps the collectors registered on it.
type recordingRegisterer struct{ cs []prometheus.Collector }

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.cs = append(r.cs, c)
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }

func (r *recordingRegisterer) Unregister(prometheus.Collector) bool { return false }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// metricNames returns the series names the collectors expose: each
// metric's name, and for histograms also _bucket, _sum and _count.
func metricNames(t *testing.T, cs []prometheus.Collector) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, c := range cs {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the name of %s", d)
			}
			names[m[1]] = true
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[m[1]+suffix] = true
			}
		}
	}
	return names
}

// pendingMetrics are named by the dashboard before the package that will
// export them exists; each entry says which.
var pendingMetrics = map[string]string{
	"pdserve_planner_desired_replicas": "the online planner (desired replicas per role)",
}

var seriesName = regexp.MustCompile(`\bpdserve_[a-z0-9_]+`)

// TestDashboard: the Grafana dashboard is valid JSON with the panels the
// chart promises, and every pdserve_ series it queries is one the
// coordinator's metrics package exports.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "pdserve.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var reg recordingRegisterer
	metrics.New(&reg, metrics.SLO{})
	known := metricNames(t, reg.cs)

	var titles []string
	used := map[string]bool{}
	for _, p := range dash.Panels {
		titles = append(titles, p.Title)
		for _, target := range p.Targets {
			for _, name := range seriesName.FindAllString(target.Expr, -1) {
				used[name] = true
				if !known[name] && pendingMetrics[name] == "" {
					t.Errorf("panel %q queries %s, which pkg/metrics does not export", p.Title, name)
				}
			}
		}
	}
	for name, by := range pendingMetrics {
		if known[name] {
			t.Errorf("%s is exported now: drop it from pendingMetrics (was pending on %s)", name, by)
		}
	}
	all := strings.ToLower(strings.Join(titles, "\n"))
	for _, want := range []string{"ttft", "tpot", "itl", "goodput", "attainment", "budget", "kv bytes raw vs on the wire", "replicas: desired vs current"} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel about %q; panels:\n%s", want, all)
		}
	}
	for _, want := range []string{"pdserve_kv_transfer_seconds_bucket", "pdserve_kv_bytes_raw_total", "pdserve_kv_bytes_wire_total", "pdserve_goodput_requests_total"} {
		if !used[want] {
			t.Errorf("dashboard does not query %s", want)
		}
	}
	if dash.UID == "" {
		t.Error("dashboard has no uid")
	}
	sorted := make([]string, 0, len(used))
	for n := range used {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	t.Logf("series queried: %s", strings.Join(sorted, " "))
}
