package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/pdserve/pdserve/internal/plannertest"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/planner"
	"github.com/pdserve/pdserve/pkg/planner/actuator/actuatortest"
	"github.com/pdserve/pdserve/pkg/plannerhost"
)

// subscribePlans subscribes to the planner's decisions on the cluster's
// NATS server.
func subscribePlans(t *testing.T, cl *cluster) *nats.Subscription {
	t.Helper()
	nc, err := nats.Connect(cl.c.NATSURL(), nats.UserInfo(cl.natsObserver.User, cl.natsObserver.Password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync(control.PlanSubject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// nextDecision waits for the next decision published on sub.
func nextDecision(t *testing.T, sub *nats.Subscription) planner.Decision {
	t.Helper()
	msg, err := sub.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("no planner decision on %s: %v", control.PlanSubject, err)
	}
	var d planner.Decision
	if err := json.Unmarshal(msg.Data, &d); err != nil {
		t.Fatalf("decision %s: %v", msg.Data, err)
	}
	return d
}

// tick hands the planner one re-plan time.
func tick(t *testing.T, ticks chan<- time.Time, now time.Time) {
	t.Helper()
	select {
	case ticks <- now:
	case <-time.After(10 * time.Second):
		t.Fatal("the planner does not take ticks")
	}
}

// sendRequests completes n requests of 4 output tokens each.
func sendRequests(t *testing.T, cl *cluster, n int) {
	t.Helper()
	for i := range n {
		r := complete(t.Context(), t, cl.url, request{Prompt: fmt.Sprintf("planner request %d", i), MaxTokens: 4, IgnoreEOS: true})
		if len(r.Tokens) != 4 {
			t.Fatalf("request %d: %d tokens, want 4", i, len(r.Tokens))
		}
	}
}

// scrape returns the coordinator's /metrics text.
func scrape(t *testing.T, cl *cluster) string {
	t.Helper()
	resp, err := http.Get(cl.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Finished requests reach the planner; a tick re-plans on them, publishes
// the decision on NATS and sets the replica gauges served on /metrics.
func TestPlannerObservesPublishesAndExports(t *testing.T) {
	ticks := make(chan time.Time)
	cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) {
		o.Engine, o.PolicyFile = plannertest.SimEngine(), plannertest.SLOPolicy(t)
		edit(o, func(p *config.Policy) { p.Pricing.GPUUSDPerHour = 2.5 })
	}, planner: func(p *plannerhost.Options) {
		p.MinObservations, p.GPUBudget = 5, 4
		p.Ticks = ticks
	}})
	if cl.planner == nil {
		t.Fatal("planner off in standalone sim mode with SLOs")
	}
	sub := subscribePlans(t, cl)
	if m := scrape(t, cl); strings.Contains(m, "pdserve_pool_replicas{") {
		t.Errorf("replica gauges set before any decision:\n%s", m)
	}

	const n = 6
	sendRequests(t, cl, n)
	now := time.Now()
	tick(t, ticks, now)
	d := nextDecision(t, sub)
	t.Logf("decision: %+v", d)
	if !d.Time.Equal(now) || d.Observations != n || !(d.ObservedRate > 0) || d.CurrentPrefill != 1 || d.CurrentDecode != 1 ||
		d.PrefillReplicas < 1 || d.DecodeReplicas < 1 || d.GPUs != d.PrefillReplicas+d.DecodeReplicas {
		t.Errorf("decision %+v: want time %v, %d observations, a rate, current 1P+1D and a desired design", d, now, n)
	}
	if p, dec := cl.planner.Online().Desired(); p != d.PrefillReplicas || dec != d.DecodeReplicas {
		t.Errorf("Desired() = %d, %d; decision %d, %d", p, dec, d.PrefillReplicas, d.DecodeReplicas)
	}
	m := scrape(t, cl)
	for _, want := range []string{
		fmt.Sprintf(`pdserve_pool_replicas{kind="desired",role="prefill"} %d`, d.PrefillReplicas),
		fmt.Sprintf(`pdserve_pool_replicas{kind="desired",role="decode"} %d`, d.DecodeReplicas),
		`pdserve_pool_replicas{kind="current",role="prefill"} 1`,
		`pdserve_pool_replicas{kind="current",role="decode"} 1`,
		fmt.Sprintf(`pdserve_planner_desired_cost_usd_per_hour %g`, float64(d.GPUs)*2.5),
	} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("/metrics lacks the line %q", want)
		}
	}
	if !strings.Contains(m, "\npdserve_planner_observed_rate ") {
		t.Errorf("/metrics lacks pdserve_planner_observed_rate")
	}

	// A tick within the interval does not re-plan: the next decision
	// published is the one of the tick after the interval.
	tick(t, ticks, now.Add(time.Millisecond))
	later := now.Add(30 * time.Second)
	tick(t, ticks, later)
	if d := nextDecision(t, sub); !d.Time.Equal(later) {
		t.Errorf("decision of %v published, want only the one of %v", d.Time, later)
	}
}

// With the planner off (no profile), nothing is observed and no planner
// gauge is exported.
func TestPlannerOff(t *testing.T) {
	cl := startCluster(t, clusterOpts{planner: func(*plannerhost.Options) {}})
	if cl.planner != nil {
		t.Fatal("planner on without a profile")
	}
	sendRequests(t, cl, 1)
	m := scrape(t, cl)
	for _, name := range []string{"pdserve_pool_replicas", "pdserve_planner_"} {
		if strings.Contains(m, name) {
			t.Errorf("/metrics has %s with the planner off", name)
		}
	}
}

// fakeDeployments returns a fake API holding the named Deployments at
// replicas.
func fakeDeployments(ns string, replicas int32, names ...string) *actuatortest.Fake {
	var objs []runtime.Object
	for _, name := range names {
		r := replicas
		objs = append(objs, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: appsv1.DeploymentSpec{Replicas: &r}, Status: appsv1.DeploymentStatus{Replicas: r}})
	}
	return actuatortest.NewFake(objs...)
}

// The kubernetes actuator scales the named Deployments once the planner's
// scale-down is stable: two workers per pool, light load, two re-plans.
func TestPlannerScalesDeployments(t *testing.T) {
	const ns = "serving"
	cs := fakeDeployments(ns, 2, "pd-prefill", "pd-decode", "unrelated")
	ticks := make(chan time.Time)
	cl := startCluster(t, clusterOpts{prefill: 2, decode: 2, edit: func(o *coordinator.Options) {
		o.Engine, o.PolicyFile = plannertest.SimEngine(), plannertest.SLOPolicy(t)
	}, planner: func(p *plannerhost.Options) {
		*p = plannerhost.Options{
			Mode: plannerhost.Kubernetes, Namespace: ns, PrefillDeployment: "pd-prefill", DecodeDeployment: "pd-decode",
			Interval: time.Second, Window: time.Hour, Cooldown: time.Hour, Headroom: 0.2, Hysteresis: 0.15,
			MinObservations: 5, LinkGbps: 100, GPUBudget: 4, KubeClient: cs, Ticks: ticks,
		}
	}})
	sub := subscribePlans(t, cl)
	sendRequests(t, cl, 6)
	// Re-plan well after the requests, so that the observed rate is low.
	now := time.Now().Add(10 * time.Second)
	tick(t, ticks, now)
	if d := nextDecision(t, sub); d.Changed || d.Reason != planner.ReasonStabilize || d.TargetPrefill != 1 || d.TargetDecode != 1 {
		t.Fatalf("first decision %+v: want target 1P+1D, unchanged while stabilizing", d)
	}
	tick(t, ticks, now.Add(time.Second))
	if d := nextDecision(t, sub); !d.Changed || d.Reason != planner.ReasonScaleDown || d.PrefillReplicas != 1 || d.DecodeReplicas != 1 {
		t.Fatalf("second decision %+v: want a scale down to 1P+1D", d)
	}
	replicas := func(name string) int32 {
		dep, err := cs.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return *dep.Spec.Replicas
	}
	waitFor(t, 10*time.Second, func() error {
		if p, d, u := replicas("pd-prefill"), replicas("pd-decode"), replicas("unrelated"); p != 1 || d != 1 || u != 2 {
			return fmt.Errorf("replicas prefill %d, decode %d, unrelated %d; want 1, 1, 2", p, d, u)
		}
		return nil
	})
}
