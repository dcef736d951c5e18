package actuator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pdserve/pdserve/pkg/planner/actuator/actuatortest"
)

const ns = "serving"

func deployment(name string, replicas int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       appsv1.DeploymentSpec{Replicas: &replicas},
		Status:     appsv1.DeploymentStatus{Replicas: replicas},
	}
}

// newFake returns a fake holding the two Deployments, with a reactor in
// front of its scale subresource that logs the scale calls it sees and
// makes the first failUpdates UpdateScale calls fail with a conflict.
func newFake(t *testing.T, prefill, decode int32, failUpdates int) (*actuatortest.Fake, *[]string) {
	t.Helper()
	cs := actuatortest.NewFake(deployment("pd-prefill", prefill), deployment("pd-decode", decode))
	var mu sync.Mutex
	var calls []string
	cs.PrependReactor("get", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "scale" {
			mu.Lock()
			calls = append(calls, "get "+a.(k8stesting.GetAction).GetName())
			mu.Unlock()
		}
		return false, nil, nil
	})
	cs.PrependReactor("update", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "scale" {
			return false, nil, nil
		}
		s := a.(k8stesting.UpdateAction).GetObject().(*autoscalingv1.Scale)
		mu.Lock()
		calls = append(calls, fmt.Sprintf("update %s %d", s.Name, s.Spec.Replicas))
		fail := failUpdates > 0
		failUpdates--
		mu.Unlock()
		if fail {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "apps", Resource: "deployments"}, s.Name, errors.New("changed"))
		}
		return false, nil, nil
	})
	return cs, &calls
}

func replicas(t *testing.T, cs *actuatortest.Fake, name string) int32 {
	t.Helper()
	d, err := cs.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return *d.Spec.Replicas
}

func TestKubernetesScale(t *testing.T) {
	tests := []struct {
		name            string
		prefill, decode int
		failUpdates     int
		wantCalls       []string
		wantP, wantD    int32
	}{
		{
			name: "both change", prefill: 4, decode: 2,
			wantCalls: []string{"get pd-prefill", "update pd-prefill 4", "get pd-decode", "update pd-decode 2"},
			wantP:     4, wantD: 2,
		},
		{
			name: "decode unchanged is not updated", prefill: 3, decode: 1,
			wantCalls: []string{"get pd-prefill", "update pd-prefill 3", "get pd-decode"},
			wantP:     3, wantD: 1,
		},
		{
			name: "conflict retried", prefill: 2, decode: 1, failUpdates: 1,
			wantCalls: []string{"get pd-prefill", "update pd-prefill 2", "get pd-prefill", "update pd-prefill 2", "get pd-decode"},
			wantP:     2, wantD: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs, calls := newFake(t, 1, 1, tt.failUpdates)
			k, err := NewKubernetes(cs, KubernetesOptions{Namespace: ns, PrefillDeployment: "pd-prefill", DecodeDeployment: "pd-decode"})
			if err != nil {
				t.Fatal(err)
			}
			if err := k.Scale(t.Context(), tt.prefill, tt.decode); err != nil {
				t.Fatalf("Scale: %v", err)
			}
			if diff := cmp.Diff(tt.wantCalls, *calls); diff != "" {
				t.Errorf("scale calls (-want +got):\n%s", diff)
			}
			if p, d := replicas(t, cs, "pd-prefill"), replicas(t, cs, "pd-decode"); p != tt.wantP || d != tt.wantD {
				t.Errorf("replicas = %d, %d; want %d, %d", p, d, tt.wantP, tt.wantD)
			}
		})
	}
}

func TestKubernetesErrors(t *testing.T) {
	cs, _ := newFake(t, 1, 1, 0)
	k, err := NewKubernetes(cs, KubernetesOptions{Namespace: ns, PrefillDeployment: "pd-prefill", DecodeDeployment: "missing"})
	if err != nil {
		t.Fatal(err)
	}
	err = k.Scale(t.Context(), 2, 2)
	if !apierrors.IsNotFound(err) {
		t.Errorf("Scale with a missing Deployment: %v, want NotFound", err)
	}
	if err := k.Scale(t.Context(), -1, 2); !errors.Is(err, ErrBadReplicas) {
		t.Errorf("Scale(-1, 2) = %v, want ErrBadReplicas", err)
	}
	if _, err := NewKubernetes(cs, KubernetesOptions{Namespace: ns}); err == nil {
		t.Error("NewKubernetes without Deployment names succeeded")
	}
}

func TestKubernetesCurrent(t *testing.T) {
	cs, _ := newFake(t, 3, 2, 0)
	k, err := NewKubernetes(cs, KubernetesOptions{Namespace: ns, PrefillDeployment: "pd-prefill", DecodeDeployment: "pd-decode"})
	if err != nil {
		t.Fatal(err)
	}
	p, d, err := k.Current(t.Context())
	if err != nil || p != 3 || d != 2 {
		t.Errorf("Current = %d, %d, %v; want 3, 2, nil", p, d, err)
	}
}

func TestLog(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	l := NewLog(zap.New(core))
	if err := l.Scale(t.Context(), 3, 2); err != nil {
		t.Fatal(err)
	}
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d log entries, want 1", len(entries))
	}
	got := entries[0].ContextMap()
	if diff := cmp.Diff(map[string]any{"prefill": int64(3), "decode": int64(2)}, got); diff != "" {
		t.Errorf("log fields (-want +got):\n%s", diff)
	}
	if err := l.Scale(t.Context(), 1, -2); !errors.Is(err, ErrBadReplicas) {
		t.Errorf("Scale(1, -2) = %v, want ErrBadReplicas", err)
	}
}

func TestRBACRules(t *testing.T) {
	want := []Rule{
		{APIGroups: []string{"apps"}, Resources: []string{"deployments/scale"}, Verbs: []string{"get", "update"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
	}
	if diff := cmp.Diff(want, RBACRules()); diff != "" {
		t.Errorf("RBACRules (-want +got):\n%s", diff)
	}
}

// pod is a pod of a Deployment's pods (app=app) in phase, scheduled or not.
func pod(name, app string, phase corev1.PodPhase, scheduled corev1.ConditionStatus, msg string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Status: corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: scheduled, Reason: map[bool]string{true: "Unschedulable"}[scheduled == corev1.ConditionFalse], Message: msg},
		}},
	}
}

func TestUnschedulable(t *testing.T) {
	cs, _ := newFake(t, 1, 2, 0)
	// The fake serves the scale's selector from the Deployment's name.
	cs.PrependReactor("get", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "scale" {
			return false, nil, nil
		}
		name := a.(k8stesting.GetAction).GetName()
		return true, &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Status: autoscalingv1.ScaleStatus{Selector: "app=" + name}}, nil
	})
	const full = "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector."
	for _, p := range []*corev1.Pod{
		pod("pd-prefill-a", "pd-prefill", corev1.PodRunning, corev1.ConditionTrue, ""),
		pod("pd-decode-b", "pd-decode", corev1.PodPending, corev1.ConditionFalse, full),
		pod("pd-decode-a", "pd-decode", corev1.PodRunning, corev1.ConditionTrue, ""),
		pod("pd-decode-c", "pd-decode", corev1.PodPending, corev1.ConditionTrue, ""), // scheduled, pulling its image
		pod("other-x", "other", corev1.PodPending, corev1.ConditionFalse, full),      // not ours
	} {
		if _, err := cs.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	k, err := NewKubernetes(cs, KubernetesOptions{Namespace: ns, PrefillDeployment: "pd-prefill", DecodeDeployment: "pd-decode"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.Unschedulable(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []Unschedulable{{Deployment: "pd-decode", Pod: "pd-decode-b", Reason: "Unschedulable", Message: full}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Unschedulable (-want +got):\n%s", diff)
	}

	// Without the list permission: the API's error, naming the Deployment.
	cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("RBAC: no list"))
	})
	if _, err := k.Unschedulable(t.Context()); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "serving/pd-prefill") {
		t.Errorf("Unschedulable without list = %v, want a Forbidden error naming serving/pd-prefill", err)
	}
}
