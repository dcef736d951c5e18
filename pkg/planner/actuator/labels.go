package actuator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Pod labels of the chart (helm/pdserve) that the Labeler reads and sets.
const (
	// RoleLabel names the role a worker pod has now: prefill, decode or
	// colocated. The chart's Services, PodMonitor, ServiceMonitor and
	// NetworkPolicies of the prefill and decode pools select by it.
	RoleLabel = "app.kubernetes.io/component"
	// PoolLabel marks the pods of the chart's elastic pool (value
	// ElasticPool); its Deployment, PodDisruptionBudget and NetworkPolicy
	// select by it, since RoleLabel changes under them.
	PoolLabel = "pdserve.io/pool"
	// ElasticPool is PoolLabel's value on the elastic pool's pods.
	ElasticPool = "elastic"
)

// ErrBadLabel is returned for a pod name or role that cannot be a pod's
// name or a label value; match with errors.Is.
var ErrBadLabel = errors.New("actuator: bad pod name or role label")

// Labeler sets the role label of elastic worker pods in one namespace.
// RBAC it needs there (see LabelRBACRules): patch on pods. Safe for
// concurrent use.
type Labeler struct {
	client    Client
	namespace string
}

// NewLabeler returns a Labeler of namespace using client (NewClient's, a
// clientset or a fake). Errors: a nil client or an empty namespace.
func NewLabeler(client Client, namespace string) (*Labeler, error) {
	if client == nil || namespace == "" {
		return nil, errors.New("actuator: a labeler needs a client and a namespace")
	}
	return &Labeler{client: client, namespace: namespace}, nil
}

// SetRole sets RoleLabel of pod to role with one JSON patch that first
// tests that the pod carries PoolLabel=ElasticPool: a worker's id (the
// pod name) is only its heartbeat's claim, and this way the coordinator
// relabels no pod of a fixed pool, of NATS or of another application,
// whatever a worker claims. Errors: ErrBadLabel, or the API error wrapped
// with the pod's name (NotFound for no such pod, Invalid — 422 — for a
// pod of no elastic pool; match with apierrors).
func (l *Labeler) SetRole(ctx context.Context, pod, role string) error {
	if errs := validation.IsDNS1123Subdomain(pod); len(errs) > 0 {
		return fmt.Errorf("%w: pod %q: %s", ErrBadLabel, pod, strings.Join(errs, "; "))
	}
	if role == "" {
		return fmt.Errorf("%w: empty role", ErrBadLabel)
	}
	if errs := validation.IsValidLabelValue(role); len(errs) > 0 {
		return fmt.Errorf("%w: role %q: %s", ErrBadLabel, role, strings.Join(errs, "; "))
	}
	patch, err := json.Marshal([]map[string]string{
		{"op": "test", "path": "/metadata/labels/" + jsonPointerEscape(PoolLabel), "value": ElasticPool},
		{"op": "add", "path": "/metadata/labels/" + jsonPointerEscape(RoleLabel), "value": role},
	})
	if err != nil {
		return fmt.Errorf("actuator: label pod %s/%s: %w", l.namespace, pod, err)
	}
	if _, err := l.client.CoreV1().Pods(l.namespace).Patch(ctx, pod, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("actuator: label pod %s/%s %s=%s: %w", l.namespace, pod, RoleLabel, role, err)
	}
	return nil
}

// jsonPointerEscape escapes a JSON Pointer token (RFC 6901).
func jsonPointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// LabelRBACRules are the permissions SetRole needs in its namespace. RBAC
// cannot limit them to the elastic pool's pods (their names are made by
// the ReplicaSet); SetRole's patch tests PoolLabel instead.
func LabelRBACRules() []Rule {
	return []Rule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"patch"}}}
}

// Worker is an elastic worker as its heartbeat says: its pod's name (the
// worker id, which the chart sets to the pod's name) and role.
type Worker struct {
	Pod, Role string
}

// RoleLabels keeps the role label of elastic workers' pods equal to the
// roles their heartbeats say: the caller hands Sync the elastic workers
// it knows, as often as it likes; Sync patches only the pods whose role
// changed since it last set them (or whose patch failed), so that a role
// change, a worker restarted in its initial role and a coordinator
// restart all end with the right label. Safe for concurrent use.
type RoleLabels struct {
	l   *Labeler
	mu  sync.Mutex
	set map[string]string // pod → role last set
}

// NewRoleLabels returns a RoleLabels patching through l.
func NewRoleLabels(l *Labeler) *RoleLabels {
	return &RoleLabels{l: l, set: map[string]string{}}
}

// Sync patches the pods of workers whose role differs from the one Sync
// last set on them, in pod-name order, and forgets the pods not in
// workers (one that comes back is patched again). It returns the workers
// it patched and the failed patches' errors, joined (a failed pod is
// tried again on the next Sync). Calls are serialized.
func (r *RoleLabels) Sync(ctx context.Context, workers []Worker) (patched []Worker, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	workers = slices.Clone(workers)
	slices.SortFunc(workers, func(a, b Worker) int { return strings.Compare(a.Pod, b.Pod) })
	seen := map[string]bool{}
	var errs []error
	for _, w := range workers {
		seen[w.Pod] = true
		if role, ok := r.set[w.Pod]; ok && role == w.Role {
			continue
		}
		if err := r.l.SetRole(ctx, w.Pod, w.Role); err != nil {
			delete(r.set, w.Pod)
			errs = append(errs, err)
			continue
		}
		r.set[w.Pod] = w.Role
		patched = append(patched, w)
	}
	for pod := range r.set {
		if !seen[pod] {
			delete(r.set, pod)
		}
	}
	return patched, errors.Join(errs...)
}
