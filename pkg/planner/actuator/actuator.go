package actuator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/pdserve/pdserve/pkg/planner"
)

// Compile-time checks.
var (
	_ planner.Actuator = (*Log)(nil)
	_ planner.Actuator = (*Kubernetes)(nil)
)

// ErrBadReplicas is returned for a replica count < 0; match with errors.Is.
var ErrBadReplicas = errors.New("actuator: replica count must be ≥ 0")

// Log only logs the desired replicas: the default actuator, for a human
// or an external autoscaler to act on. Safe for concurrent use.
type Log struct {
	log *zap.Logger
}

// NewLog returns a Log writing to log (nil: a no-op logger).
func NewLog(log *zap.Logger) *Log {
	if log == nil {
		log = zap.NewNop()
	}
	return &Log{log: log}
}

// Scale logs the replica counts. Errors: ErrBadReplicas.
func (l *Log) Scale(_ context.Context, prefill, decode int) error {
	if prefill < 0 || decode < 0 {
		return fmt.Errorf("%w: prefill %d, decode %d", ErrBadReplicas, prefill, decode)
	}
	l.log.Info("planner: desired pool replicas (log actuator: not applied)", zap.Int("prefill", prefill), zap.Int("decode", decode))
	return nil
}

// Client is the part of the Kubernetes API the actuators use: the apps/v1
// group (Deployments and their scale subresource) and the core/v1 group
// (Pods). A clientset satisfies it; NewClient builds one with only these
// two groups, which keeps the other API groups' clients (over a hundred
// generated packages) out of the coordinator.
type Client interface {
	AppsV1() appsv1client.AppsV1Interface
	CoreV1() corev1client.CoreV1Interface
}

// clients is NewClient's Client.
type clients struct {
	apps *appsv1client.AppsV1Client
	core *corev1client.CoreV1Client
}

func (c clients) AppsV1() appsv1client.AppsV1Interface { return c.apps }
func (c clients) CoreV1() corev1client.CoreV1Interface { return c.core }

// NewClient returns a Client of the API server cfg names. Errors: a bad
// config.
func NewClient(cfg *rest.Config) (Client, error) {
	apps, err := appsv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("actuator: kubernetes client: %w", err)
	}
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("actuator: kubernetes client: %w", err)
	}
	return clients{apps: apps, core: core}, nil
}

// Kubernetes scales the prefill and decode Deployments of one namespace
// through their scale subresource. RBAC it needs (see RBACRules): get and
// update on deployments/scale in the apps API group. Safe for concurrent
// use (the client is).
type Kubernetes struct {
	client                  Client
	namespace               string
	prefillName, decodeName string
}

// KubernetesOptions name the Deployments to scale.
type KubernetesOptions struct {
	Namespace         string // required
	PrefillDeployment string // required
	DecodeDeployment  string // required
}

// NewKubernetes returns an actuator using client (NewClient's, a
// clientset or a fake). Errors: a missing namespace or Deployment name.
func NewKubernetes(client Client, o KubernetesOptions) (*Kubernetes, error) {
	if client == nil || o.Namespace == "" || o.PrefillDeployment == "" || o.DecodeDeployment == "" {
		return nil, errors.New("actuator: kubernetes needs a client, a namespace and the prefill and decode Deployment names")
	}
	return &Kubernetes{client: client, namespace: o.Namespace, prefillName: o.PrefillDeployment, decodeName: o.DecodeDeployment}, nil
}

// InClusterClient returns a client of the API server of the cluster it
// runs in, with the pod's service account. Errors: not running in a
// cluster, a bad config.
func InClusterClient() (Client, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("actuator: in-cluster config: %w", err)
	}
	return NewClient(cfg)
}

// NewInCluster returns an actuator that talks to the API server of the
// cluster it runs in, with the pod's service account. Errors: not running
// in a cluster, or those of NewKubernetes.
func NewInCluster(o KubernetesOptions) (*Kubernetes, error) {
	cs, err := InClusterClient()
	if err != nil {
		return nil, err
	}
	return NewKubernetes(cs, o)
}

// Scale sets spec.replicas of the prefill and then the decode Deployment,
// leaving a Deployment already at its count untouched and retrying on
// update conflicts. Errors: ErrBadReplicas, or the API error wrapped with
// the Deployment's name (the first failure stops; the prefill Deployment
// may then already be scaled).
func (k *Kubernetes) Scale(ctx context.Context, prefill, decode int) error {
	if prefill < 0 || decode < 0 {
		return fmt.Errorf("%w: prefill %d, decode %d", ErrBadReplicas, prefill, decode)
	}
	if err := k.scaleOne(ctx, k.prefillName, int32(prefill)); err != nil {
		return err
	}
	return k.scaleOne(ctx, k.decodeName, int32(decode))
}

func (k *Kubernetes) scaleOne(ctx context.Context, name string, replicas int32) error {
	deps := k.client.AppsV1().Deployments(k.namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := deps.GetScale(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s.Spec.Replicas == replicas {
			return nil
		}
		s.Spec.Replicas = replicas
		_, err = deps.UpdateScale(ctx, name, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("actuator: scale deployment %s/%s to %d: %w", k.namespace, name, replicas, err)
	}
	return nil
}

// Current returns the replicas the prefill and decode Deployments have
// (status.replicas of their scale). Errors: the API error, wrapped.
func (k *Kubernetes) Current(ctx context.Context) (prefill, decode int, err error) {
	get := func(name string) (*autoscalingv1.Scale, error) {
		s, err := k.client.AppsV1().Deployments(k.namespace).GetScale(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("actuator: get scale of %s/%s: %w", k.namespace, name, err)
		}
		return s, nil
	}
	p, err := get(k.prefillName)
	if err != nil {
		return 0, 0, err
	}
	d, err := get(k.decodeName)
	if err != nil {
		return 0, 0, err
	}
	return int(p.Status.Replicas), int(d.Status.Replicas), nil
}

// Unschedulable is a pod of a scaled Deployment that the scheduler could
// not place: Pending with the condition PodScheduled False.
type Unschedulable struct {
	Deployment string // the Deployment's name
	Pod        string
	Reason     string // the condition's reason, e.g. Unschedulable
	// Message is the scheduler's, e.g. "0/3 nodes are available: 3
	// Insufficient nvidia.com/gpu. ..."
	Message string
}

// Unschedulable returns the pods of the prefill and then the decode
// Deployment that the scheduler could not place, found by the label
// selector of each Deployment's scale (status.selector), in pod-name order.
// RBAC: list on pods besides RBACRules' scale access. Errors: the API
// error, wrapped with the Deployment's name.
func (k *Kubernetes) Unschedulable(ctx context.Context) ([]Unschedulable, error) {
	var out []Unschedulable
	for _, name := range []string{k.prefillName, k.decodeName} {
		s, err := k.client.AppsV1().Deployments(k.namespace).GetScale(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("actuator: get scale of %s/%s: %w", k.namespace, name, err)
		}
		if s.Status.Selector == "" {
			continue // no pods yet (a Deployment the controller has not seen)
		}
		pods, err := k.client.CoreV1().Pods(k.namespace).List(ctx, metav1.ListOptions{LabelSelector: s.Status.Selector})
		if err != nil {
			return nil, fmt.Errorf("actuator: list pods of %s/%s: %w", k.namespace, name, err)
		}
		var found []Unschedulable
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodPending || p.DeletionTimestamp != nil {
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					found = append(found, Unschedulable{Deployment: name, Pod: p.Name, Reason: c.Reason, Message: c.Message})
				}
			}
		}
		slices.SortFunc(found, func(a, b Unschedulable) int { return strings.Compare(a.Pod, b.Pod) })
		out = append(out, found...)
	}
	return out, nil
}

// Rule is one RBAC policy rule, as in a Role's rules list.
type Rule struct {
	APIGroups []string
	Resources []string
	Verbs     []string
}

// RBACRules are the permissions the Kubernetes actuator needs in its
// namespace: a Role with these rules bound to the coordinator's service
// account.
func RBACRules() []Rule {
	return []Rule{
		{APIGroups: []string{"apps"}, Resources: []string{"deployments/scale"}, Verbs: []string{"get", "update"}},
		// Unschedulable: read-only, to report pods the scheduler cannot place.
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
	}
}
