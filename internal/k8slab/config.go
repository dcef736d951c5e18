package k8slab

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// kubeconfig returns a kubeconfig for the user whose client certificate is
// pki/NAME.crt, talking to the API server at server.
func kubeconfig(pki, name, server string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: pdserve
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: pdserve
  context: {cluster: pdserve, user: %s}
current-context: pdserve
`, server, filepath.Join(pki, "ca.crt"), name, filepath.Join(pki, name+".crt"), filepath.Join(pki, name+".key"), name)
}

// kubeletConfig is the kubelet's KubeletConfiguration: cgroupfs driver,
// cgroup v1 allowed (failCgroupV1: false), webhook authn/authz, the
// cluster DNS Service, image GC off (the images are imported, never
// pulled, so a collected image could not come back).
func (l *Lab) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
tlsCertFile: %s
tlsPrivateKeyFile: %s
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
clusterDNS: [%s]
clusterDomain: %s
resolvConf: %s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%%, imagefs.available: 1%%, nodefs.inodesFree: 1%%}
maxPods: 110
serializeImagePulls: false
oomScoreAdj: %d
`, l.nodeIP, l.p("pki/ca.crt"), l.p("pki/kubelet-server.crt"), l.p("pki/kubelet-server.key"),
		l.containerdSock(), DNSServiceIP, ClusterDNS, l.p("kubelet/resolv.conf"), daemonOOMScoreAdj())
}

// containerdConfig keeps containerd's root, state and socket under the
// lab's state directory, runs runc with cgroupfs, uses the lab's CNI
// configuration and the pause image the lab built as the sandbox image.
// Non-root pods may bind ports below 1024 (CoreDNS on 53), as containerd 2
// allows by default. restrict_oom_score_adj keeps every container's
// oom_score_adj at or above containerd's own: lowering it needs
// CAP_SYS_RESOURCE, which machines like this one (a Firecracker VM whose
// root lacks it in the bounding set) do not grant, and without the option
// runc fails every pod sandbox (kubelet asks for -998) with "nsexec: failed
// to update /proc/self/oom_score_adj: Permission denied".
func (l *Lab) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  stream_server_address = "127.0.0.1"
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  restrict_oom_score_adj = %t
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, l.p("containerd/root"), l.p("containerd/state"), l.containerdSock(), l.p("containerd/opt"),
		PauseImage, !hasCapSysResource(), cniBinDir, l.p("cni/net.d"))
}

const cniBinDir = "/usr/lib/cni" // Debian's containernetworking-plugins

// cniConfig is the pod network: one Linux bridge with host-local IPAM and
// portmap for hostPorts. containerd adds the loopback plugin itself.
// Masquerading is one iptables rule the lab owns (ipMasq off), so that
// Down can remove exactly it.
func (l *Lab) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, CNINetwork, BridgeName, NodePodCIDR, l.p("cni/ipam"))
}

func (l *Lab) kubeProxyConfig() string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [primary]
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
oomScoreAdj: %d
`, l.p("kubeconfig/kube-proxy.conf"), PodCIDR, NodeName, l.nodeIP, daemonOOMScoreAdj())
}

// kwokConfig is the stages kwokctl configures by default (nodes become Ready at once and keep a lease, pods
// become Ready at once), read from the cache where Build copied them.
func (l *Lab) kwokConfig() (string, error) {
	var b strings.Builder
	// No KwokConfiguration document: kwok then applies its defaults (a
	// partial one leaves e.g. the lease parallelism at 0, which it refuses).
	ents, err := os.ReadDir(l.bins.KwokStages)
	if err != nil {
		return "", fmt.Errorf("k8slab: kwok stages: %w", err)
	}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(l.bins.KwokStages, e.Name()))
		if err != nil {
			return "", fmt.Errorf("k8slab: kwok stages: %w", err)
		}
		b.WriteString("---\n")
		b.Write(data)
		if len(data) > 0 && data[len(data)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.String(), nil
}

// hasCapSysResource reports whether this process may lower oom_score_adj
// (CAP_SYS_RESOURCE, bit 24, in its effective set).
func hasCapSysResource() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<24) != 0
		}
	}
	return false
}

// daemonOOMScoreAdj is the kubelet's and kube-proxy's oom_score_adj: their
// default -999, or 0 where it cannot be lowered (see containerdConfig).
func daemonOOMScoreAdj() int {
	if hasCapSysResource() {
		return -999
	}
	return 0
}
