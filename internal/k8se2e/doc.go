// Package k8se2e is the chart's end-to-end test on a real cluster: the one
// `make k8s-up` starts (etcd, kube-apiserver, controller-manager,
// scheduler, a kubelet on containerd and runc, kube-proxy, CoreDNS and
// kwok GPU nodes), with the images of `make images` imported into the
// node's containerd. `make k8s-e2e` runs it (PDSERVE_K8S_E2E=1, built
// with -tags k8se2e); without that variable the test skips, so that
// `go test ./...` needs no cluster, and with it a missing or broken
// cluster fails the test. Without the tag only TestDocCommands is built,
// with a TestK8sE2E that skips (or fails when PDSERVE_K8S_E2E=1), so that
// go test ./... compiles and links no Kubernetes client to skip it.
//
// The steps, in order, each a subtest: install the chart with
// helm/pdserve/ci/k8s-e2e-values.yaml (llama.cpp on the CPU, a tiny GGUF
// from a hostPath, API keys, generated NATS and gRPC secrets) with the
// commands docs/kubernetes.md shows (docCommands; TestDocCommands keeps
// the two equal), every pod Ready, helm test, a streamed chat completion
// through the coordinator's Service equal to the standalone server's
// greedy text, helm upgrade keeping the generated Secrets and rolling the
// workers under a streaming client, helm uninstall leaving only what the
// docs list; then the planner release (ci/k8s-e2e-planner-values.yaml):
// its Role checked with kubectl auth can-i, a load that makes the planner
// add a decode worker which joins and serves, scale-down after a drain,
// the RoleBinding removed and the actuator's error seen in its log and
// metrics; the elastic pool (ci/k8s-e2e-elastic-values.yaml: a role
// command under load moves a pod's role, label, Services and routing);
// two regions (ci/k8s-e2e-regions-values.yaml, a release per namespace,
// as docs/regions.md installs them: the coordinators learn each other over
// the NATS gateways, the forwarding Service lets in only certificates of
// the regions' CA, and a region whose pools are scaled to 0 has every
// request answered by the other); and the production layout on the kwok GPU nodes (server-side
// dry run, then placement per pool, GPU counts, and Pending pods with the
// scheduler's reason reported by the planner). Measurements (install to
// Ready, planner decision to first request served by the new worker) go
// to the test log as "measure:" lines.
package k8se2e
