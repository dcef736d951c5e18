package k8slab

// Versions pins the upstream components. Each must agree with the
// requirement in the component's build module (scripts/k8s/build/NAME/go.mod);
// TestPinsMatchBuildModules checks that.
type Versions struct {
	Kubernetes string // k8s.io/kubernetes release (and v0.X.Y of its staging modules)
	Etcd       string // go.etcd.io/etcd/server/v3
	Kwok       string // sigs.k8s.io/kwok
	CoreDNS    string // github.com/coredns/coredns
}

// Pinned are the versions make k8s-up builds and runs. Kubernetes 1.35 is
// the last minor that still supports containerd 1.x (Debian 12 ships 1.6)
// and runs on cgroup v1 with failCgroupV1: false; etcd 3.6.5 is the
// version its go.mod requires; CoreDNS 1.14.7 is built against client-go
// v0.35.4, the same minor.
var Pinned = Versions{
	Kubernetes: "v1.35.4",
	Etcd:       "v3.6.5",
	Kwok:       "v0.8.0",
	CoreDNS:    "v1.14.7",
}

// Network layout of the lab. None of these collide with 198.18.0.0/15,
// which other tests of the repository use.
const (
	PodCIDR      = "10.244.0.0/16" // cluster CIDR (kube-proxy, masquerade)
	NodePodCIDR  = "10.244.0.0/24" // the real node's pods (CNI host-local)
	KwokPodCIDR  = "10.244.128.0/17"
	ServiceCIDR  = "10.96.0.0/12"
	APIServiceIP = "10.96.0.1"
	DNSServiceIP = "10.96.0.10"
	ClusterDNS   = "cluster.local"
	NodeName     = "pdserve-node"
	BridgeName   = "pdk8s0"
	CNINetwork   = "pdserve-k8s"
	APIPort      = 6443
)

// Image references the lab builds and imports into containerd (never
// pulled).
const (
	PauseImage   = "pdserve.local/k8slab/pause:v1"
	ProbeImage   = "pdserve.local/k8slab/probe:v1"
	CoreDNSImage = "pdserve.local/k8slab/coredns:" // + Pinned.CoreDNS
)
