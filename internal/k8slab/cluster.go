package k8slab

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"time"
)

// corefile is CoreDNS's configuration, as kubeadm writes it.
const corefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30
    loop
    reload
    loadbalance
}
`

// apply creates obj, or updates it when it exists (get for the
// resourceVersion, then update).
func apply[T any](ctx context.Context, name string, get func(context.Context, string, metav1.GetOptions) (T, error),
	create func(context.Context, T, metav1.CreateOptions) (T, error), update func(context.Context, T, metav1.UpdateOptions) (T, error),
	obj T, setRV func(old, obj T)) error {
	old, err := get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = create(ctx, obj, metav1.CreateOptions{})
	case err == nil:
		setRV(old, obj)
		_, err = update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("k8slab: apply %s: %w", name, err)
	}
	return nil
}

// upCoreDNS applies CoreDNS's ServiceAccount, RBAC, ConfigMap, Deployment
// and the kube-dns Service at DNSServiceIP, then waits for the Deployment
// to be available.
func (l *Lab) upCoreDNS(ctx context.Context) error {
	cs, err := l.Client()
	if err != nil {
		return err
	}
	ns := "kube-system"
	labels := map[string]string{"k8s-app": "kube-dns"}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: ns}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("k8slab: coredns: %w", err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	}}
	rc := cs.RbacV1().ClusterRoles()
	if err := apply(ctx, role.Name, rc.Get, rc.Create, rc.Update, role, func(o, n *rbacv1.ClusterRole) { n.ResourceVersion = o.ResourceVersion }); err != nil {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:coredns"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "coredns", Namespace: ns}}}
	rb := cs.RbacV1().ClusterRoleBindings()
	if err := apply(ctx, binding.Name, rb.Get, rb.Create, rb.Update, binding, func(o, n *rbacv1.ClusterRoleBinding) { n.ResourceVersion = o.ResourceVersion }); err != nil {
		return err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: ns}, Data: map[string]string{"Corefile": corefile}}
	cmc := cs.CoreV1().ConfigMaps(ns)
	if err := apply(ctx, cm.Name, cmc.Get, cmc.Create, cmc.Update, cm, func(o, n *corev1.ConfigMap) { n.ResourceVersion = o.ResourceVersion }); err != nil {
		return err
	}
	one, f, t := int32(1), false, true
	uid := int64(65532)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: ns, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: "coredns",
					PriorityClassName:  "system-cluster-critical",
					DNSPolicy:          corev1.DNSDefault,
					NodeSelector:       map[string]string{"kubernetes.io/hostname": NodeName},
					Containers: []corev1.Container{{
						Name: "coredns", Image: CoreDNSImage + l.opt.CoreDNS, ImagePullPolicy: corev1.PullNever,
						Args: []string{"-conf", "/etc/coredns/Corefile"},
						Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
							{Name: "metrics", ContainerPort: 9153, Protocol: corev1.ProtocolTCP}},
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("70Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("170Mi")}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}}, PeriodSeconds: 2},
						LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(8080)}},
							InitialDelaySeconds: 60, TimeoutSeconds: 5, FailureThreshold: 5},
						SecurityContext: &corev1.SecurityContext{RunAsNonRoot: &t, RunAsUser: &uid, ReadOnlyRootFilesystem: &t,
							AllowPrivilegeEscalation: &f, Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
					}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"}}}}},
				},
			},
		},
	}
	dc := cs.AppsV1().Deployments(ns)
	if err := apply(ctx, dep.Name, dc.Get, dc.Create, dc.Update, dep, func(o, n *appsv1.Deployment) { n.ResourceVersion = o.ResourceVersion }); err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: ns, Labels: labels},
		Spec: corev1.ServiceSpec{Selector: labels, ClusterIP: DNSServiceIP, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
			{Name: "metrics", Port: 9153, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(9153)},
		}},
	}
	// Get first: creating it again fails on the taken cluster IP before
	// the name.
	if _, err := cs.CoreV1().Services(ns).Get(ctx, svc.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		_, err = cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("k8slab: coredns service: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("k8slab: coredns service: %w", err)
	}
	return l.waitFor(ctx, "kubelet", "CoreDNS Deployment available", 180*time.Second, func() error {
		return deploymentAvailable(ctx, cs, ns, "coredns")
	})
}

func deploymentAvailable(ctx context.Context, cs *Client, ns, name string) error {
	d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == *d.Spec.Replicas && d.Status.AvailableReplicas == *d.Spec.Replicas {
		return nil
	}
	// Say why: the first pod's waiting reason or unready condition.
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(d.Spec.Selector)})
	if err == nil {
		for _, p := range pods.Items {
			if why := podWhy(&p); why != "" {
				return fmt.Errorf("%s/%s: %d/%d available; pod %s: %s", ns, name, d.Status.AvailableReplicas, *d.Spec.Replicas, p.Name, why)
			}
		}
	}
	return fmt.Errorf("%s/%s: %d/%d available", ns, name, d.Status.AvailableReplicas, *d.Spec.Replicas)
}

// podWhy is a one-line reason why a pod is not ready, or "".
func podWhy(p *corev1.Pod) string {
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			return fmt.Sprintf("container %s waiting: %s: %s", c.Name, w.Reason, w.Message)
		}
		if t := c.State.Terminated; t != nil {
			return fmt.Sprintf("container %s terminated: %s (exit %d): %s", c.Name, t.Reason, t.ExitCode, t.Message)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			return fmt.Sprintf("%s: %s: %s", c.Type, c.Reason, c.Message)
		}
	}
	if p.Status.Phase != corev1.PodRunning {
		return "phase " + string(p.Status.Phase)
	}
	return ""
}
