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
package actuator
