// Package charttest checks the Helm chart in helm/pdserve. It has no
// non-test code: its tests render the chart with the Helm SDK for every
// values file in helm/pdserve/ci, decode each object strictly into the
// Kubernetes API types, and check what a cluster would otherwise find out
// at run time: that the two worker pools land on their own node selectors
// and tolerations, that GPUs are requested only where configured, that every
// flag given to a pdserve container is one its binary accepts (parsed with
// the binary's own flag set) and yields valid options (TLS files: a
// sample of the user's Secret), that the coordinator's policy file parses,
// that the planner's flags name the release's Deployments and its Role
// grants exactly what the Kubernetes actuator uses, that with the llamacpp
// engine every pdserve pod runs a llama.cpp image, finds its libraries and
// opens the GGUF model in its read-only model volume (and that the model
// download sends the token from its Secret, checks the file and leaves no
// partial one: its script runs against a local HTTP server), that the
// dashboard queries name real metrics (pkg/metrics and the planner's), and
// that the values schema rejects the bad values files in helm/testdata/bad.
// Every listen flag of every pdserve container is given explicitly, on all
// interfaces (a binary's default address never applies in a pod), and the
// bundled NATS server listens on all interfaces too; workers request their
// GPUs as gpuResource; node selectors name only the labels the docs
// create; and every Secret the release's objects read, unless the release
// or cert-manager makes it, is a row of the "Secrets to create" table of
// docs/kubernetes.md with the keys and readers found (and every row is
// read by some release).
// For a secured release it checks that the NetworkPolicies allow exactly
// the listed flows between the release's pods and their neighbours (a
// small evaluator of NetworkPolicy semantics), that every workload mounts
// only its role's gRPC tokens and gets the flags for them, that the
// workers, authorizing calls with grpcauth exactly as their interceptors
// do, serve each gRPC method only to its role, that the cert-manager
// Certificates carry the names and usages each role needs and the
// identities the workers allow, and that generated tokens survive an
// upgrade (lookup, against a fake cluster).
package charttest
