// Package k8slab owns the single-machine Kubernetes cluster that `make
// k8s-up` starts and `make k8s-down` stops: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, a kubelet on containerd and
// runc with a bridge CNI, kube-proxy in iptables mode, CoreDNS as a
// Deployment, and kwok for simulated GPU nodes. Every component is a real
// upstream binary run as a process of its own; none is faked.
//
// The binaries are built from pinned modules (the nested build modules
// under scripts/k8s/build) into a cache outside the repository, keyed by
// component and version (Build). Up generates certificates and kubeconfigs,
// starts what is not running yet and waits for each component to be
// healthy; it is idempotent. Down stops every process, tears down the pod
// network (CNI DEL, netns, bridge, kube-proxy's iptables rules), unmounts
// what the node mounted and removes the runtime state, so that a second Up
// starts clean. Smoke checks that a pod becomes Ready, that a Service
// resolves by DNS name from inside a pod and answers through kube-proxy.
//
// All runtime state lives under one directory (Options.State); processes
// listen on 127.0.0.1 or on the node's own address. Up, Down and Smoke need
// root. Errors name the step and the component's log file.
package k8slab
