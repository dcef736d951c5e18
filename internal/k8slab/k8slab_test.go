package k8slab

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/repotest"
	"sigs.k8s.io/yaml"
)

// TestPinsMatchBuildModules: each pinned version is the one its build
// module requires, and every k8s.io staging module is replaced with the
// release of the same minor and patch as k8s.io/kubernetes (v1.X.Y →
// v0.X.Y), as upstream documents for consumers of k8s.io/kubernetes.
func TestPinsMatchBuildModules(t *testing.T) {
	root := repotest.Root(t)
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(root, "scripts", "k8s", "build", name, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	for _, c := range []struct{ mod, path, version string }{
		{"kubernetes", "k8s.io/kubernetes", Pinned.Kubernetes},
		{"etcd", "go.etcd.io/etcd/server/v3", Pinned.Etcd},
		{"kwok", "sigs.k8s.io/kwok", Pinned.Kwok},
		{"coredns", "github.com/coredns/coredns", Pinned.CoreDNS},
	} {
		re := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(c.path) + `[ \t]+(v\S+)`)
		m := re.FindStringSubmatch(read(c.mod))
		if m == nil || m[1] != c.version {
			t.Errorf("scripts/k8s/build/%s/go.mod requires %s %v, Pinned says %s", c.mod, c.path, m, c.version)
		}
	}
	staging := "v0." + strings.TrimPrefix(Pinned.Kubernetes, "v1.")
	reps := regexp.MustCompile(`(?m)^\s*(k8s\.io/\S+) => (k8s\.io/\S+) (\S+)$`).FindAllStringSubmatch(read("kubernetes"), -1)
	if len(reps) < 30 {
		t.Fatalf("kubernetes build module replaces %d staging modules, want them all (31 for 1.35)", len(reps))
	}
	for _, r := range reps {
		if r[1] != r[2] || r[3] != staging {
			t.Errorf("replace %s => %s %s, want %s => %s %s", r[1], r[2], r[3], r[1], r[1], staging)
		}
	}
}

func TestPKI(t *testing.T) {
	dir := t.TempDir()
	nodeIP := net.ParseIP("192.0.2.7")
	if err := ensurePKI(dir, nodeIP); err != nil {
		t.Fatal(err)
	}
	load := func(name string) *x509.Certificate {
		data, err := os.ReadFile(filepath.Join(dir, name+".crt"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(data)
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ca := load("ca")
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	api := load("apiserver")
	for _, name := range []string{"127.0.0.1", "192.0.2.7", APIServiceIP, "kubernetes.default.svc.cluster.local"} {
		if _, err := api.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err != nil {
			t.Errorf("apiserver certificate for %s: %v", name, err)
		}
	}
	kubelet := load("kubelet-client")
	if kubelet.Subject.CommonName != "system:node:"+NodeName || len(kubelet.Subject.Organization) != 1 || kubelet.Subject.Organization[0] != "system:nodes" {
		t.Errorf("kubelet client subject %v, want the Node authorizer's system:node:%s in system:nodes", kubelet.Subject, NodeName)
	}
	if _, err := kubelet.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("kubelet client certificate: %v", err)
	}
	for _, f := range []string{"sa.key", "sa.pub", "ca.key"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	// A second run keeps what exists.
	before, _ := os.ReadFile(filepath.Join(dir, "apiserver.crt"))
	if err := ensurePKI(dir, nodeIP); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "apiserver.crt"))
	if string(before) != string(after) {
		t.Error("ensurePKI reissued an existing certificate")
	}
}

// TestConfigs: the generated configurations parse and carry the settings
// this machine needs.
func TestConfigs(t *testing.T) {
	l := &Lab{opt: Options{State: "/state"}, nodeIP: net.ParseIP("192.0.2.7")}
	var kubelet map[string]any
	if err := yaml.Unmarshal([]byte(l.kubeletConfig()), &kubelet); err != nil {
		t.Fatalf("kubelet config: %v", err)
	}
	for k, want := range map[string]any{"failCgroupV1": false, "cgroupDriver": "cgroupfs", "address": "192.0.2.7",
		"containerRuntimeEndpoint": "unix:///state/containerd/containerd.sock", "clusterDomain": ClusterDNS} {
		if kubelet[k] != want {
			t.Errorf("kubelet %s = %v, want %v", k, kubelet[k], want)
		}
	}
	var proxy map[string]any
	if err := yaml.Unmarshal([]byte(l.kubeProxyConfig()), &proxy); err != nil {
		t.Fatalf("kube-proxy config: %v", err)
	}
	if proxy["mode"] != "iptables" || proxy["clusterCIDR"] != PodCIDR {
		t.Errorf("kube-proxy mode %v clusterCIDR %v", proxy["mode"], proxy["clusterCIDR"])
	}
	var cni struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(l.cniConfig()), &cni); err != nil {
		t.Fatalf("CNI config: %v", err)
	}
	if len(cni.Plugins) != 2 || cni.Plugins[0]["type"] != "bridge" || cni.Plugins[0]["ipMasq"] != false || cni.Plugins[1]["type"] != "portmap" {
		t.Errorf("CNI plugins %v", cni.Plugins)
	}
	ctd := l.containerdConfig()
	for _, want := range []string{`sandbox_image = "` + PauseImage + `"`, `SystemdCgroup = false`, `address = "/state/containerd/containerd.sock"`, `conf_dir = "/state/cni/net.d"`} {
		if !strings.Contains(ctd, want) {
			t.Errorf("containerd config lacks %s", want)
		}
	}
	for _, cidr := range []string{PodCIDR, ServiceCIDR, KwokPodCIDR} {
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			t.Fatal(err)
		}
		_, other, _ := net.ParseCIDR("198.18.0.0/15") // the range other tests use
		if n.Contains(other.IP) || other.Contains(n.IP) {
			t.Errorf("%s overlaps 198.18.0.0/15", cidr)
		}
	}
}

func TestKwokNodes(t *testing.T) {
	n := kwokNode(Pool{Name: "decode", Nodes: 2, GPUs: 4}, 2)
	if n.Name != "kwok-decode-2" || n.Labels[poolLabel] != "decode" || n.Annotations[kwokAnnotation] != "fake" {
		t.Errorf("node %s labels %v annotations %v", n.Name, n.Labels, n.Annotations)
	}
	if g := n.Status.Allocatable["nvidia.com/gpu"]; g.Value() != 4 {
		t.Errorf("nvidia.com/gpu allocatable %v, want 4", g.String())
	}
	want := map[string]bool{"pdserve.io/pool=decode:NoSchedule": true, "nvidia.com/gpu=present:NoSchedule": true}
	for _, tn := range n.Spec.Taints {
		delete(want, tn.Key+"="+tn.Value+":"+string(tn.Effect))
	}
	if len(want) != 0 {
		t.Errorf("taints %v lack %v", n.Spec.Taints, want)
	}
}

// TestUpSmoke starts the real cluster (or checks the running one) and runs
// the smoke check. It needs root and the binary cache (a cold build takes
// tens of minutes), so it runs only with PDSERVE_K8S_E2E=1, as make
// k8s-e2e sets; it leaves the cluster running for the tests after it.
func TestUpSmoke(t *testing.T) {
	if os.Getenv("PDSERVE_K8S_E2E") != "1" {
		t.Skip("starts a Kubernetes cluster: set PDSERVE_K8S_E2E=1 (root; make k8s-up's cache)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("PDSERVE_K8S_E2E=1 but not root: the kubelet, containerd and CNI need root")
	}
	lab, err := New(Options{Repo: repotest.Root(t), KwokNodes: true, Log: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	if err := lab.Up(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := lab.Smoke(ctx, false)
	t.Logf("smoke: %+v", res)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.InPod, `"status":200`) || res.FromNode == "" || !strings.HasPrefix(res.KwokPlaced, "kwok-prefill-") {
		t.Errorf("smoke result %+v", res)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestExecName: the names go build -o DIR/ gives, which Build renames to
// each target's name.
func TestExecName(t *testing.T) {
	for pkg, want := range map[string]string{
		"k8s.io/kubernetes/cmd/kube-apiserver":                 "kube-apiserver",
		"go.etcd.io/etcd/server/v3":                            "server",
		"github.com/pdserve/pdserve/scripts/k8s/build/coredns": "coredns",
		"example.com/tool/v":                                   "v",
		"example.com/tool/v2x":                                 "v2x",
	} {
		if got := execName(pkg); got != want {
			t.Errorf("execName(%q) = %q, want %q", pkg, got, want)
		}
	}
}
