package charttest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/metrics"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner"
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

// registerPlanner registers the online planner's metrics on reg, as the
// coordinator does with the planner on.
func registerPlanner(t *testing.T, reg prometheus.Registerer) {
	t.Helper()
	p, err := perfmodel.Load("h100/llama-3-8b/tp1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := planner.OnlineConfig{Base: planner.Config{
		Prefill: p, SLO: planner.SLO{TTFT: time.Second, TPOT: 100 * time.Millisecond, Attainment: 0.9},
		LinkBytesPerSec: 1e10, Codec: planner.Codec{Name: "none", Ratio: 1}, GPUBudget: 2,
	}}
	if _, err := planner.NewOnline(cfg, reg); err != nil {
		t.Fatal(err)
	}
}

var seriesName = regexp.MustCompile(`\bpdserve_[a-z0-9_]+`)

// TestDashboard: the Grafana dashboard is valid JSON with the panels the
// chart promises, and every pdserve_ series it queries is one the
// coordinator exports: its metrics package's, or its online planner's.
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
	// With an SLO, as the dashboard's goodput and attainment panels need.
	metrics.New(&reg, metrics.SLO{TTFT: time.Second, TPOT: 100 * time.Millisecond})
	registerPlanner(t, &reg)
	known := metricNames(t, reg.cs)

	var titles []string
	used := map[string]bool{}
	for _, p := range dash.Panels {
		titles = append(titles, p.Title)
		for _, target := range p.Targets {
			for _, name := range seriesName.FindAllString(target.Expr, -1) {
				used[name] = true
				if !known[name] {
					t.Errorf("panel %q queries %s, which neither pkg/metrics nor the planner exports", p.Title, name)
				}
			}
		}
	}
	all := strings.ToLower(strings.Join(titles, "\n"))
	for _, want := range []string{"ttft", "tpot", "itl", "goodput", "attainment", "budget", "kv bytes raw vs on the wire", "replicas: desired vs current", "cost per 1k tokens"} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel about %q; panels:\n%s", want, all)
		}
	}
	for _, want := range []string{"pdserve_kv_transfer_seconds_bucket", "pdserve_kv_raw_bytes_total", "pdserve_kv_wire_bytes_total", "pdserve_goodput_requests_total", "pdserve_slo_attainment", "pdserve_cost_usd_total", "pdserve_pool_replicas"} {
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
