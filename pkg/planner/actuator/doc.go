// Package actuator applies the planner's desired pool sizes: Log (the
// default) only logs them; Kubernetes scales the prefill and decode
// Deployments through the API server with client-go, by the Deployments'
// scale subresource (GetScale, then UpdateScale when the count differs,
// retried on conflict).
//
// RBAC for Kubernetes, in the Deployments' namespace (RBACRules):
//
//	apiGroups: ["apps"]
//	resources: ["deployments/scale"]
//	verbs:     ["get", "update"]
//
// and, for Kubernetes.Unschedulable (the pods of the two Deployments that
// the scheduler cannot place, with its reason), read-only:
//
//	apiGroups: [""]
//	resources: ["pods"]
//	verbs:     ["list"]
//
// Both implement planner.Actuator and are safe for concurrent use.
//
// Labeler sets the role label (RoleLabel, the chart's
// app.kubernetes.io/component) of an elastic worker's pod, by a JSON
// patch that first tests PoolLabel=ElasticPool, so that no pod of another
// pool is relabeled whatever a worker's heartbeat claims; RoleLabels
// keeps those labels equal to the roles the workers' heartbeats say,
// patching only on a change. The pod is found by name: the worker's id,
// which the chart sets to the pod's name (--id=$(POD_NAME)), so the
// heartbeat needs no new field and the RBAC no read access. RBAC, in the
// pods' namespace (LabelRBACRules):
//
//	apiGroups: [""]
//	resources: ["pods"]
//	verbs:     ["patch"]
package actuator
