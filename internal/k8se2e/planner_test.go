//go:build k8se2e

package k8se2e

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// canI is the RBAC of the planner's Role, as kubectl auth can-i checks it
// for the coordinator's ServiceAccount: true = allowed.
var canI = map[string]bool{
	"get deployments.apps/pl-pdserve-prefill --subresource=scale":    true,
	"update deployments.apps/pl-pdserve-prefill --subresource=scale": true,
	"get deployments.apps/pl-pdserve-decode --subresource=scale":     true,
	"update deployments.apps/pl-pdserve-decode --subresource=scale":  true,
	"list pods": true,
	// nothing more:
	"patch deployments.apps/pl-pdserve-decode --subresource=scale":       false,
	"update deployments.apps/pl-pdserve-decode":                          false,
	"get deployments.apps/pl-pdserve-decode":                             false,
	"update deployments.apps/pl-pdserve-coordinator --subresource=scale": false,
	"update deployments.apps/pl-pdserve-nats --subresource=scale":        false,
	"create deployments.apps":                                            false,
	"delete pods":                                                        false,
	"create pods":                                                        false,
	"get pods":                                                           false,
	"watch pods":                                                         false,
	"get secrets":                                                        false,
	"list secrets":                                                       false,
	"list pods -n kube-system":                                           false,
	"update roles.rbac.authorization.k8s.io/pl-pdserve-planner":          false,
}

// longPrompt is about a thousand prompt tokens on the sim engine (byte
// tokens): the KV of a few of them fills an OPT-66B decode worker. Each
// request's begins with its own number, so that no two share a prefix
// block: the planner's workload model (fixed:990/256) counts no prefix
// hits, and with one prompt repeated the prefix-aware router would rightly
// keep every stream on the worker that caches it, whose shared blocks
// never fill (issue 27 §5 is the planner counting hits).
func longPrompt(i int) string {
	return fmt.Sprintf("Request %d. ", i) + strings.Repeat("The quick brown fox jumps over the lazy dog. ", 22)
}

func (e *env) planner(t *testing.T) {
	e.sh(t, `helm install pl helm/pdserve -n pdserve -f helm/pdserve/ci/k8s-e2e-planner-values.yaml --set image.registry="$REGISTRY"`)
	waitFor(t, "every pod of pl Ready", 5*time.Minute, func() error { return e.podsReady(t.Context(), namespace, plannerRel) })

	sa := "system:serviceaccount:" + namespace + ":pl-pdserve-coordinator"
	for q, want := range canI {
		ns := "-n " + namespace
		if strings.Contains(q, " -n ") {
			ns = ""
		}
		out, _ := e.trySh(fmt.Sprintf("kubectl auth can-i %s %s --as=%s", q, ns, sa))
		if got := strings.TrimSpace(out) == "yes"; got != want {
			t.Errorf("kubectl auth can-i %s: %q, want allowed=%v", q, strings.TrimSpace(out), want)
		}
	}

	base := e.serviceURL(t, namespace, plannerRel+"-pdserve-coordinator")
	model := firstModel(t, base, "")
	scale := func() int {
		s, err := e.cs.AppsV1().Deployments(namespace).GetScale(t.Context(), "pl-pdserve-decode", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return int(s.Spec.Replicas)
	}
	before := e.workerPods(t, namespace, plannerRel, "decode")

	// Up: about 0.55 req/s of ~1000 → 256 tokens (8 streams back to back,
	// each ~14 s of OPT-66B decode): the plan at that rate × 1.2 is 1P+2D
	// (coordinator plan --workload fixed:990/256 --rate 0.66), the GPU
	// budget of 6 caps it there.
	heavy := startLoadPrompt(base, "", model, longPrompt, 8, 256)
	var decided time.Time
	waitFor(t, "the planner raising the decode Deployment to 2", 4*time.Minute, func() error {
		if n := scale(); n < 2 {
			return fmt.Errorf("decode replicas %d", n)
		}
		decided = time.Now()
		return nil
	})
	var newPod string
	waitFor(t, "the new decode pod Ready", 3*time.Minute, func() error {
		for _, p := range e.workerPods(t, namespace, plannerRel, "decode") {
			if !slices.Contains(before, p) {
				newPod = p
			}
		}
		if newPod == "" {
			return fmt.Errorf("no new decode pod")
		}
		return e.podsReady(t.Context(), namespace, plannerRel)
	})
	ready := time.Now()
	var served time.Time
	waitFor(t, "the new decode worker serving a request", 3*time.Minute, func() error {
		at, ok := heavy.firstServed(newPod)
		if !ok {
			return fmt.Errorf("%s has served nothing yet", newPod)
		}
		served = at
		return nil
	})
	t.Logf("measure: planner decision (decode Deployment at 2) to the new decode worker %s Ready: %.1f s, to the end of its first served request (a 256-token stream): %.1f s",
		newPod, ready.Sub(decided).Seconds(), served.Sub(decided).Seconds())

	// Down: short requests only; the planner goes back to 1 decode worker
	// after its cooldown, and the removed worker drains first. Both decode
	// pods' logs are followed from now: a worker with nothing in flight
	// logs "worker draining" and exits within milliseconds, and the kubelet
	// removes the pod with its log right after, too soon for a poll.
	logs := map[string]*followed{}
	for _, p := range e.workerPods(t, namespace, plannerRel, "decode") {
		logs[p] = e.followLogs(t, namespace, p)
	}
	heavy.end()
	light := startLoad(base, "", model, 1, 16)
	var drained string
	waitFor(t, "the planner lowering the decode Deployment to 1", 5*time.Minute, func() error {
		if n := scale(); n != 1 {
			return fmt.Errorf("decode replicas %d", n)
		}
		if len(e.workerPods(t, namespace, plannerRel, "decode")) != 1 {
			return fmt.Errorf("the removed pod is still there")
		}
		return nil
	})
	light.end()
	left := e.workerPods(t, namespace, plannerRel, "decode")
	for p, f := range logs {
		if !slices.Contains(left, p) && strings.Contains(f.wait(), "worker draining") {
			drained = p
		}
	}
	for _, l := range []*load{heavy, light} {
		if l.lost > 0 {
			t.Errorf("%d requests lost while scaling: %q", l.lost, l.lostErrs)
		}
	}
	if drained == "" {
		t.Error("no log line 'worker draining' from the decode pod the scale-down removed")
	}
	t.Logf("scale-down: %s drained; %d + %d requests complete, %d + %d refused", drained, heavy.done, light.done, heavy.refused, light.refused)

	// RBAC removed: the actuator's error in its log and metrics.
	rb, err := e.cs.RbacV1().RoleBindings(namespace).Get(t.Context(), "pl-pdserve-planner", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cs.RbacV1().RoleBindings(namespace).Delete(t.Context(), rb.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the actuator's refused call in its metrics and log", 2*time.Minute, func() error {
		m, err := get(base + "/metrics")
		if err != nil {
			return err
		}
		if v := metric(m, `pdserve_planner_actuator_errors_total{op="pods"}`); v < 1 {
			return fmt.Errorf(`pdserve_planner_actuator_errors_total{op="pods"} = %v`, v)
		}
		logs, err := e.trySh("kubectl -n pdserve logs deploy/pl-pdserve-coordinator")
		if err != nil {
			return err
		}
		if !strings.Contains(logs, "planner: list the pools' pods") || !strings.Contains(logs, "forbidden") {
			return fmt.Errorf("no 'planner: list the pools' pods' … forbidden in the coordinator's log")
		}
		return nil
	})
	rb.ResourceVersion = ""
	if _, err := e.cs.RbacV1().RoleBindings(namespace).Create(t.Context(), rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.sh(t, `helm uninstall pl -n pdserve --wait`)
}

// gpuLayout installs the production layout (ci/gpu-two-pools-values.yaml,
// sim engine) on the kwok GPU nodes: a server-side dry run first, then a
// release with one decode pod more than the decode pool's GPUs hold.
func (e *env) gpuLayout(t *testing.T) {
	nodes, err := e.cs.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{LabelSelector: "pdserve.io/pool"})
	if err != nil {
		t.Fatal(err)
	}
	pool := map[string][]string{}
	gpus := map[string]int64{}
	for _, n := range nodes.Items {
		p := n.Labels["pdserve.io/pool"]
		pool[p] = append(pool[p], n.Name)
		q := n.Status.Allocatable["nvidia.com/gpu"]
		gpus[p] += q.Value()
	}
	if len(pool["prefill"]) == 0 || len(pool["decode"]) == 0 {
		t.Fatalf("no kwok GPU nodes labelled pdserve.io/pool=prefill and =decode (make k8s-up starts them): %v", pool)
	}
	// gpu-two-pools asks for runtimeClassName: nvidia, the RuntimeClass
	// the NVIDIA GPU operator creates on a GPU cluster; this one has no
	// operator, and the API server refuses pods of a RuntimeClass that does
	// not exist. The kwok nodes run nothing, so its handler is never
	// called; its nodeSelector keeps such pods off the real node, whose
	// containerd has no nvidia handler.
	rc := &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia"},
		Handler:    "nvidia",
		Scheduling: &nodev1.Scheduling{NodeSelector: map[string]string{"nvidia.com/gpu.present": "true"}},
	}
	if _, err := e.cs.NodeV1().RuntimeClasses().Create(t.Context(), rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	e.vars["PREFILL_NODES"] = strings.Join(pool["prefill"], " ")
	e.vars["DECODE_NODES"] = strings.Join(pool["decode"], " ")
	e.sh(t, docCommands["nodes"])
	out := e.sh(t, docCommands["gpu-dry-run"])
	if !strings.Contains(out, "(server dry run)") {
		t.Errorf("kubectl apply --dry-run=server printed no server dry run:\n%s", out)
	}
	// gpu-two-pools: prefill 3 × 2 GPUs, decode 2 GPUs each.
	const perPod = 2
	prefill := min(3, gpus["prefill"]/perPod)
	decode := gpus["decode"]/perPod + 1 // one more than fits
	e.sh(t, fmt.Sprintf(`helm install pg helm/pdserve -n pdserve-gpu -f helm/pdserve/ci/gpu-two-pools-values.yaml \
  --set image.registry="$REGISTRY" --set coordinator.image.pullPolicy=Never \
  --set nats.image.registry=pdserve.local/k8se2e --set nats.image.tag=2.15.3 --set nats.image.pullPolicy=Never \
  --set coordinator.planner.actuator=kubernetes --set coordinator.planner.interval=5s \
  --set prefillWorker.replicas=%d --set decodeWorker.replicas=%d`, prefill, decode))
	var pending *corev1.Pod
	waitFor(t, "the layout placed, one decode pod Pending", 5*time.Minute, func() error {
		pods, err := e.cs.CoreV1().Pods(gpuNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=pg"})
		if err != nil {
			return err
		}
		count := map[string]int64{}
		pending = nil
		for i := range pods.Items {
			p := &pods.Items[i]
			role := p.Labels["app.kubernetes.io/component"]
			if role != "prefill" && role != "decode" {
				continue
			}
			if p.Spec.NodeName == "" {
				if p.Status.Phase == corev1.PodPending && strings.Contains(podWhy(p), "nvidia.com/gpu") {
					pending = p
				}
				continue
			}
			count[role]++
			n, err := e.cs.CoreV1().Nodes().Get(t.Context(), p.Spec.NodeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := n.Labels["pdserve.io/pool"]; got != role {
				t.Errorf("%s pod %s on node %s of pool %q", role, p.Name, n.Name, got)
			}
			q := p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]
			if q.Value() != perPod {
				t.Errorf("%s pod %s: %d GPUs, want %d", role, p.Name, q.Value(), perPod)
			}
		}
		if count["prefill"] != prefill || count["decode"] != decode-1 || pending == nil {
			return fmt.Errorf("placed %v (want prefill %d, decode %d), pending %v", count, prefill, decode-1, pending != nil)
		}
		return nil
	})
	t.Logf("Pending %s: %s", pending.Name, podWhy(pending))
	// The coordinator is never Ready here: its /readyz waits for a prefill
	// and a decode worker to join, and kwok's pods run no process. So the
	// Service has no endpoint; its metrics are read from the pod's IP (the
	// pod network is reachable from the node) once it answers /healthz.
	var base string
	waitFor(t, "the coordinator answering /healthz", 5*time.Minute, func() error {
		pods := e.workerPods(t, gpuNamespace, gpuRel, "coordinator")
		if len(pods) == 0 {
			return fmt.Errorf("no coordinator pod")
		}
		p, err := e.cs.CoreV1().Pods(gpuNamespace).Get(t.Context(), pods[0], metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.PodIP == "" {
			return fmt.Errorf("%s has no IP yet%s", p.Name, podWhy(p))
		}
		u := "http://" + net.JoinHostPort(p.Status.PodIP, "8080")
		if _, err := get(u + "/healthz"); err != nil {
			return err
		}
		base = u
		return nil
	})
	waitFor(t, "the planner reporting the Pending pod", 2*time.Minute, func() error {
		m, err := get(base + "/metrics")
		if err != nil {
			return err
		}
		if v := metric(m, `pdserve_planner_unschedulable_pods{role="decode"}`); v < 1 {
			return fmt.Errorf(`pdserve_planner_unschedulable_pods{role="decode"} = %v`, v)
		}
		logs, err := e.trySh("kubectl -n pdserve-gpu logs deploy/pg-pdserve-coordinator")
		if err != nil {
			return err
		}
		if !strings.Contains(logs, "planner: pool pod cannot be scheduled") || !strings.Contains(logs, pending.Name) {
			return fmt.Errorf("no 'planner: pool pod cannot be scheduled' naming %s in the coordinator's log", pending.Name)
		}
		return nil
	})
	t.Logf("the planner reports %s Pending (%s decode pods fit %s GPUs)", pending.Name, strconv.FormatInt(decode-1, 10), strconv.FormatInt(gpus["decode"], 10))
}
