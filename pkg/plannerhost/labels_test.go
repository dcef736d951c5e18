package plannerhost_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pdserve/pdserve/internal/plannertest"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/planner/actuator"
	"github.com/pdserve/pdserve/pkg/planner/actuator/actuatortest"
	"github.com/pdserve/pdserve/pkg/plannerhost"
)

// TestPodLabelsFollowHeartbeats: with --planner-pod-labels (and the log
// actuator: labels need no scaling), SyncLabels sets each elastic
// worker's pod role label to its heartbeat's role, follows a role change,
// leaves fixed workers' pods alone, and counts a refused patch (a worker
// whose id names a pod of no elastic pool) in
// pdserve_planner_actuator_errors_total{op="label"}. Fails if the labels
// followed the command rather than the heartbeat, or fixed pods were
// patched.
func TestPodLabelsFollowHeartbeats(t *testing.T) {
	const ns = "serving"
	elastic := func(name, role string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{actuator.PoolLabel: actuator.ElasticPool, actuator.RoleLabel: role}}}
	}
	fixed := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pd-prefill-0", Namespace: ns, Labels: map[string]string{actuator.RoleLabel: "prefill"}}}
	cs := actuatortest.NewFake(elastic("pd-elastic-a", "prefill"), elastic("pd-elastic-b", "prefill"), fixed)

	o, p := coordinator.DefaultOptions(), plannerhost.DefaultOptions()
	o.PolicyFile = plannertest.SLOPolicy(t)
	p.Mode, p.Profile, p.Namespace, p.PodLabels, p.KubeClient = plannerhost.Log, plannertest.Profile, ns, true, cs
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(o); err != nil {
		t.Fatal(err)
	}
	h, err := plannerhost.New(p, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	members := control.NewMembership(time.Minute)
	reg := prometheus.NewRegistry()
	if err := h.Attach(coordinator.Host{Registerer: reg, Log: zap.NewNop(), Members: members,
		Publish: func(string, []byte) error { return nil }}); err != nil {
		t.Fatal(err)
	}
	beat := func(id, role string, elastic bool) {
		t.Helper()
		if err := members.Observe(control.Heartbeat{ID: id, Role: role, Elastic: elastic, GRPCAddr: "10.0.0.1:9000", Model: "m"}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	roleOf := func(name string) string {
		t.Helper()
		pod, err := cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return pod.Labels[actuator.RoleLabel]
	}
	errorsMetric := func(n string) string {
		return `
# HELP pdserve_planner_actuator_errors_total Failed calls of the planner's Kubernetes actuator: op scale (setting a pool's replicas), pods (listing the pools' pods), label (setting an elastic worker pod's role label); the coordinator's log has each error.
# TYPE pdserve_planner_actuator_errors_total counter
pdserve_planner_actuator_errors_total{op="label"} ` + n + "\n"
	}

	beat("pd-elastic-a", "prefill", true)
	beat("pd-elastic-b", "decode", true)  // started as prefill, moved before we looked
	beat("pd-prefill-0", "decode", false) // a fixed worker: never patched
	h.SyncLabels(t.Context())
	for pod, want := range map[string]string{"pd-elastic-a": "prefill", "pd-elastic-b": "decode", "pd-prefill-0": "prefill"} {
		if got := roleOf(pod); got != want {
			t.Errorf("pod %s role label %q, want %q", pod, got, want)
		}
	}
	// A move: while draining the heartbeat still says prefill, the label
	// too; then the new role's heartbeat.
	if err := members.Observe(control.Heartbeat{ID: "pd-elastic-a", Role: "prefill", Elastic: true, Draining: true, GRPCAddr: "10.0.0.1:9000", Model: "m"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	h.SyncLabels(t.Context())
	if got := roleOf("pd-elastic-a"); got != "prefill" {
		t.Errorf("draining: role label %q, want prefill until the new role's heartbeat", got)
	}
	beat("pd-elastic-a", "decode", true)
	h.SyncLabels(t.Context())
	if got := roleOf("pd-elastic-a"); got != "decode" {
		t.Errorf("after the move: role label %q, want decode", got)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(errorsMetric("0")), "pdserve_planner_actuator_errors_total"); err != nil {
		t.Error(err)
	}
	// An elastic heartbeat claiming the fixed pod's name: refused, counted.
	beat("pd-prefill-0", "decode", true)
	h.SyncLabels(t.Context())
	if got := roleOf("pd-prefill-0"); got != "prefill" {
		t.Errorf("fixed pod relabeled to %q by an elastic worker's claim", got)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(errorsMetric("1")), "pdserve_planner_actuator_errors_total"); err != nil {
		t.Error(err)
	}
}

// TestPodLabelsOptions: --planner-pod-labels needs a namespace and a
// planner that is not off.
func TestPodLabelsOptions(t *testing.T) {
	o := coordinator.DefaultOptions()
	o.PolicyFile = plannertest.SLOPolicy(t)
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, mode, ns, want string
	}{
		{"no namespace", plannerhost.Log, "", "planner-pod-labels needs --planner-namespace"},
		{"planner off", plannerhost.Off, "serving", "planner-pod-labels needs the planner"},
	} {
		p := plannerhost.DefaultOptions()
		p.Mode, p.Profile, p.Namespace, p.PodLabels = c.mode, plannertest.Profile, c.ns, true
		if err := p.Validate(o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}
