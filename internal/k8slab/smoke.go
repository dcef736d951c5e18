package k8slab

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// SmokeNamespace is where Smoke creates (and then deletes) its objects.
const SmokeNamespace = "k8slab-smoke"

// SmokeResult is what Smoke saw.
type SmokeResult struct {
	PodReady   time.Duration // Deployment created → its pod Ready
	ServiceIP  string
	InPod      string // the client pod's JSON line: name resolved by cluster DNS, GET through the Service
	FromNode   string // body of a GET from the node to the Service's IP (kube-proxy)
	KwokPlaced string // node a pool-tolerating pod landed on, when kwok runs
}

// Smoke checks the node end to end: a Deployment of the probe image
// becomes Ready on the real node; a Service in front of it resolves by
// its DNS name from inside another pod, which GETs it through kube-proxy
// and must reach it; the node itself reaches the Service IP. With kwok up,
// a pod with the prefill pool's nodeSelector, tolerations and one GPU
// lands on a prefill node. The namespace is deleted at the end unless
// keep.
func (l *Lab) Smoke(ctx context.Context, keep bool) (SmokeResult, error) {
	var res SmokeResult
	cs, err := l.Client()
	if err != nil {
		return res, err
	}
	ns := SmokeNamespace
	nsc := cs.CoreV1().Namespaces()
	if err := nsc.Delete(ctx, ns, metav1.DeleteOptions{}); err == nil {
		if err := l.waitFor(ctx, "", "old smoke namespace gone", 120*time.Second, func() error {
			if _, err := nsc.Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("namespace %s still there", ns)
			}
			return nil
		}); err != nil {
			return res, err
		}
	}
	if _, err := nsc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return res, fmt.Errorf("k8slab: smoke: %w", err)
	}
	if !keep {
		defer func() { _ = nsc.Delete(context.Background(), ns, metav1.DeleteOptions{}) }()
	}
	labels := map[string]string{"app": "echo"}
	one, t, f := int32(1), true, false
	sc := &corev1.SecurityContext{RunAsNonRoot: &t, ReadOnlyRootFilesystem: &t, AllowPrivilegeEscalation: &f,
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	start := time.Now()
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "echo", Image: ProbeImage, ImagePullPolicy: corev1.PullNever,
					Args:            []string{"serve", "--addr", ":8080"},
					Ports:           []corev1.ContainerPort{{ContainerPort: 8080}},
					ReadinessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
					SecurityContext: sc}}}}}}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return res, fmt.Errorf("k8slab: smoke: %w", err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	created, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return res, fmt.Errorf("k8slab: smoke: %w", err)
	}
	res.ServiceIP = created.Spec.ClusterIP
	if err := l.waitFor(ctx, "kubelet", "smoke pod Ready", 120*time.Second, func() error {
		return deploymentAvailable(ctx, cs, ns, "echo")
	}); err != nil {
		return res, err
	}
	res.PodReady = time.Since(start)

	// From inside a pod: DNS name → Service IP → kube-proxy → the echo pod.
	never := corev1.RestartPolicyNever
	host := "echo." + ns + ".svc." + ClusterDNS
	client := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "client", Namespace: ns}, Spec: corev1.PodSpec{
		RestartPolicy: never,
		Containers: []corev1.Container{{Name: "client", Image: ProbeImage, ImagePullPolicy: corev1.PullNever,
			Args: []string{"get", "http://" + host + "/", "--want-ip", res.ServiceIP}, SecurityContext: sc}}}}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, client, metav1.CreateOptions{}); err != nil {
		return res, fmt.Errorf("k8slab: smoke: %w", err)
	}
	var phase corev1.PodPhase
	if err := l.waitFor(ctx, "kubelet", "smoke client pod done", 120*time.Second, func() error {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "client", metav1.GetOptions{})
		if err != nil {
			return err
		}
		phase = p.Status.Phase
		if phase == corev1.PodSucceeded || phase == corev1.PodFailed {
			return nil
		}
		return fmt.Errorf("client pod %s: %s", phase, podWhy(p))
	}); err != nil {
		return res, err
	}
	logs, err := cs.CoreV1().Pods(ns).GetLogs("client", &corev1.PodLogOptions{}).DoRaw(ctx)
	res.InPod = strings.TrimSpace(string(logs))
	if err != nil {
		return res, fmt.Errorf("k8slab: smoke: client logs (API server → kubelet): %w", err)
	}
	if phase != corev1.PodSucceeded {
		return res, fmt.Errorf("k8slab: smoke: in-pod DNS + Service check failed: %s", res.InPod)
	}

	// From the node: the Service IP through kube-proxy's iptables rules.
	if err := l.waitFor(ctx, "kube-proxy", "Service IP reachable from the node", 30*time.Second, func() error {
		resp, err := plainHTTP.Get("http://" + res.ServiceIP + "/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET: %s", resp.Status)
		}
		res.FromNode = strings.TrimSpace(string(body))
		return nil
	}); err != nil {
		return res, err
	}

	if l.opt.KwokNodes {
		node, err := l.smokeKwok(ctx, ns)
		res.KwokPlaced = node
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// smokeKwok schedules a one-GPU pod with the prefill pool's selector and
// tolerations and returns the node it was bound to.
func (l *Lab) smokeKwok(ctx context.Context, ns string) (string, error) {
	cs, err := l.Client()
	if err != nil {
		return "", err
	}
	gpu := corev1.ResourceList{"nvidia.com/gpu": resourceOne}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpu-prefill", Namespace: ns}, Spec: corev1.PodSpec{
		NodeSelector: map[string]string{poolLabel: "prefill"},
		Tolerations: []corev1.Toleration{
			{Key: poolLabel, Operator: corev1.TolerationOpEqual, Value: "prefill", Effect: corev1.TaintEffectNoSchedule},
			{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Containers: []corev1.Container{{Name: "w", Image: ProbeImage, Resources: corev1.ResourceRequirements{Requests: gpu, Limits: gpu}}}}}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("k8slab: smoke kwok: %w", err)
	}
	var node string
	err = l.waitFor(ctx, "kwok", "GPU pod Running on a prefill node", 60*time.Second, func() error {
		got, err := cs.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node = got.Spec.NodeName
		if !strings.HasPrefix(node, "kwok-prefill-") {
			return fmt.Errorf("pod on %q (%s)", node, podWhy(got))
		}
		if got.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("pod %s on %s", got.Status.Phase, node)
		}
		return nil
	})
	return node, err
}
