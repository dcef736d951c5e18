package plannerhost_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pdserve/pdserve/internal/plannertest"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/planner/actuator/actuatortest"
	"github.com/pdserve/pdserve/pkg/plannerhost"
)

// A pool pod the scheduler cannot place shows in
// pdserve_planner_unschedulable_pods and in the log with the scheduler's
// message; once placed, the gauge drops. Without the RBAC to list pods the
// error is logged and counted in pdserve_planner_actuator_errors_total.
func TestCheckPodsReportsUnschedulable(t *testing.T) {
	const ns = "serving"
	cs := actuatortest.NewFake()
	// The scale subresource (the fake tracker has none): the selector of
	// each Deployment's pods.
	cs.PrependReactor("get", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name := a.(k8stesting.GetAction).GetName()
		return true, &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Status: autoscalingv1.ScaleStatus{Replicas: 1, Selector: "app=" + name}}, nil
	})
	const why = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
	pending := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pd-decode-7c9-x2", Namespace: ns, Labels: map[string]string{"app": "pd-decode"}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: why}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(t.Context(), pending, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	o, p := coordinator.DefaultOptions(), plannerhost.DefaultOptions()
	o.PolicyFile = plannertest.SLOPolicy(t)
	p.Mode, p.Profile, p.Namespace, p.PrefillDeployment, p.DecodeDeployment = plannerhost.Kubernetes, plannertest.Profile, ns, "pd-prefill", "pd-decode"
	p.KubeClient = cs
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	h, err := plannerhost.New(p, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	reg := prometheus.NewRegistry()
	if err := h.Attach(coordinator.Host{Registerer: reg, Log: zap.New(core), Members: control.NewMembership(0),
		Publish: func(string, []byte) error { return nil }}); err != nil {
		t.Fatal(err)
	}
	metrics := func(unschedDecode, podErrors int) string {
		return strings.NewReplacer("DECODE", strconv.Itoa(unschedDecode), "PODS", strconv.Itoa(podErrors)).Replace(`
# HELP pdserve_planner_actuator_errors_total Failed calls of the planner's Kubernetes actuator: op scale (setting a pool's replicas), pods (listing the pools' pods), label (setting an elastic worker pod's role label); the coordinator's log has each error.
# TYPE pdserve_planner_actuator_errors_total counter
pdserve_planner_actuator_errors_total{op="pods"} PODS
pdserve_planner_actuator_errors_total{op="scale"} 0
# HELP pdserve_planner_unschedulable_pods Pods of a pool's Deployment that the scheduler could not place (Pending, PodScheduled False), by role; the coordinator's log has the scheduler's reason.
# TYPE pdserve_planner_unschedulable_pods gauge
pdserve_planner_unschedulable_pods{role="decode"} DECODE
pdserve_planner_unschedulable_pods{role="prefill"} 0
`)
	}
	check := func(step string, unschedDecode, podErrors int) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(metrics(unschedDecode, podErrors)),
			"pdserve_planner_actuator_errors_total", "pdserve_planner_unschedulable_pods"); err != nil {
			t.Errorf("%s: %v", step, err)
		}
	}

	h.CheckPods(t.Context())
	check("pending pod", 1, 0)
	warned := logs.FilterMessage("planner: pool pod cannot be scheduled").All()
	if len(warned) != 1 || warned[0].ContextMap()["message"] != why || warned[0].ContextMap()["pod"] != pending.Name {
		t.Errorf("warnings %v, want one naming %s with the scheduler's message", warned, pending.Name)
	}
	h.CheckPods(t.Context()) // unchanged: not logged again
	if n := logs.FilterMessage("planner: pool pod cannot be scheduled").Len(); n != 1 {
		t.Errorf("%d warnings after an unchanged check, want 1", n)
	}

	pending.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(t.Context(), pending, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.CheckPods(t.Context())
	check("scheduled", 0, 0)
	if logs.FilterMessage("planner: every pool pod is scheduled").Len() != 1 {
		t.Error("no log line when the pod got scheduled")
	}

	cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`User "system:serviceaccount:serving:pd" cannot list resource "pods"`))
	})
	h.CheckPods(t.Context())
	check("forbidden", 0, 1)
	if e := logs.FilterMessage("planner: list the pools' pods").All(); len(e) != 1 || !strings.Contains(e[0].ContextMap()["error"].(string), "cannot list") {
		t.Errorf("error log %v, want the API's refusal", e)
	}
}
