package actuator

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pdserve/pdserve/pkg/planner/actuator/actuatortest"
)

func labeledPod(name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}}
}

func elasticPod(name, role string) *corev1.Pod {
	return labeledPod(name, map[string]string{PoolLabel: ElasticPool, RoleLabel: role, "app.kubernetes.io/instance": "pd"})
}

func podLabels(t *testing.T, cs *actuatortest.Fake, name string) map[string]string {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Labels
}

// patches counts the pod patches cs served.
func patches(cs *actuatortest.Fake) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

// TestSetRole: the elastic pod's role label changes and nothing else of
// it; a pod of no elastic pool (a fixed pool's, or NATS's, named by a
// worker's claimed id) is refused by the patch's test and keeps its
// labels; no such pod is NotFound; a bad role or pod name makes no call.
// Fails if the patch lost its test op (the NATS pod would be relabeled)
// or set another label.
func TestSetRole(t *testing.T) {
	cs := actuatortest.NewFake(
		elasticPod("pd-elastic-a", "decode"),
		labeledPod("pd-prefill-x", map[string]string{RoleLabel: "prefill"}),
		labeledPod("pd-nats-0", map[string]string{RoleLabel: "nats", PoolLabel: "fixed"}),
	)
	l, err := NewLabeler(cs, ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetRole(t.Context(), "pd-elastic-a", "prefill"); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{PoolLabel: ElasticPool, RoleLabel: "prefill", "app.kubernetes.io/instance": "pd"}
	if diff := cmp.Diff(want, podLabels(t, cs, "pd-elastic-a")); diff != "" {
		t.Errorf("elastic pod labels (-want +got):\n%s", diff)
	}
	for _, name := range []string{"pd-prefill-x", "pd-nats-0"} {
		before := podLabels(t, cs, name)
		if err := l.SetRole(t.Context(), name, "decode"); err == nil {
			t.Errorf("SetRole(%s) of a pod of no elastic pool: no error", name)
		}
		if diff := cmp.Diff(before, podLabels(t, cs, name)); diff != "" {
			t.Errorf("%s relabeled (-before +after):\n%s", name, diff)
		}
	}
	if err := l.SetRole(t.Context(), "pd-elastic-gone", "decode"); !apierrors.IsNotFound(err) {
		t.Errorf("SetRole of no such pod: %v, want NotFound", err)
	}
	n := patches(cs)
	for _, c := range []struct{ pod, role string }{{"pd-elastic-a", ""}, {"pd-elastic-a", "no/slash"}, {"Bad_Name", "decode"}} {
		if err := l.SetRole(t.Context(), c.pod, c.role); !errors.Is(err, ErrBadLabel) {
			t.Errorf("SetRole(%q, %q): %v, want ErrBadLabel", c.pod, c.role, err)
		}
	}
	if got := patches(cs); got != n {
		t.Errorf("%d API patches for bad input", got-n)
	}
	if _, err := NewLabeler(nil, ns); err == nil {
		t.Error("NewLabeler without a client: no error")
	}
	if _, err := NewLabeler(cs, ""); err == nil {
		t.Error("NewLabeler without a namespace: no error")
	}
}

// TestRoleLabelsSync: Sync patches a pod only when its worker's role
// differs from the one last set, retries a failed patch on the next call,
// and patches a pod again after it left and came back (a worker restarted
// in its initial role). Fails if Sync patched every pod every time (the
// counts) or remembered a failed patch as done.
func TestRoleLabelsSync(t *testing.T) {
	cs := actuatortest.NewFake(elasticPod("e-0", "prefill"), elasticPod("e-1", "prefill"))
	fail := 1 // patches of e-1 to fail
	cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.PatchAction).GetName() == "e-1" && fail > 0 {
			fail--
			return true, nil, apierrors.NewServiceUnavailable("api server busy")
		}
		return false, nil, nil
	})
	l, err := NewLabeler(cs, ns)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRoleLabels(l)
	steps := []struct {
		name    string
		workers []Worker
		want    []Worker // patched
		wantErr bool
		labels  map[string]string // e-0's and e-1's role labels after
	}{
		{"first sync labels both, e-1 fails", []Worker{{"e-1", "prefill"}, {"e-0", "prefill"}},
			[]Worker{{"e-0", "prefill"}}, true, map[string]string{"e-0": "prefill", "e-1": "prefill"}},
		{"e-1 retried", []Worker{{"e-0", "prefill"}, {"e-1", "prefill"}},
			[]Worker{{"e-1", "prefill"}}, false, map[string]string{"e-0": "prefill", "e-1": "prefill"}},
		{"nothing changed", []Worker{{"e-0", "prefill"}, {"e-1", "prefill"}},
			nil, false, map[string]string{"e-0": "prefill", "e-1": "prefill"}},
		{"e-0 moved to decode", []Worker{{"e-0", "decode"}, {"e-1", "prefill"}},
			[]Worker{{"e-0", "decode"}}, false, map[string]string{"e-0": "decode", "e-1": "prefill"}},
		{"e-0 gone", []Worker{{"e-1", "prefill"}},
			nil, false, map[string]string{"e-0": "decode", "e-1": "prefill"}},
		{"e-0 back", []Worker{{"e-0", "decode"}, {"e-1", "prefill"}},
			[]Worker{{"e-0", "decode"}}, false, map[string]string{"e-0": "decode", "e-1": "prefill"}},
	}
	for _, s := range steps {
		got, err := r.Sync(t.Context(), s.workers)
		if (err != nil) != s.wantErr {
			t.Errorf("%s: error %v, want error %v", s.name, err, s.wantErr)
		}
		if diff := cmp.Diff(s.want, got); diff != "" {
			t.Errorf("%s: patched (-want +got):\n%s", s.name, diff)
		}
		for p, role := range s.labels {
			if got := podLabels(t, cs, p)[RoleLabel]; got != role {
				t.Errorf("%s: pod %s role label %q, want %q", s.name, p, got, role)
			}
		}
	}
}
