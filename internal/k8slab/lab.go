package k8slab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	rbacv1client "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// Options configure a Lab. Repo is required; the rest have defaults.
type Options struct {
	Repo      string    // repository root: build modules, cmd/mkimage, bin/images
	State     string    // runtime state directory; default Repo/.pdserve/k8s
	Cache     string    // binary cache root; default see CacheDir
	NodeIP    string    // the node's address; default the source address of the default route
	KwokNodes bool      // start kwok and its simulated GPU nodes
	Pools     []Pool    // simulated GPU node pools; default DefaultPools
	Log       io.Writer // progress lines; default os.Stderr
	Versions
}

// Lab is the cluster of one state directory. Its methods are not safe for
// concurrent use; one k8slab process drives a state directory at a time.
type Lab struct {
	opt    Options
	bins   Bins
	nodeIP net.IP
	cs     *Client
}

// New validates opt, fills defaults and returns the lab. It builds
// nothing and starts nothing.
func New(opt Options) (*Lab, error) {
	if opt.Repo == "" {
		return nil, errors.New("k8slab: Options.Repo is required")
	}
	if opt.State == "" {
		opt.State = filepath.Join(opt.Repo, ".pdserve", "k8s")
	}
	var err error
	if opt.State, err = filepath.Abs(opt.State); err != nil {
		return nil, fmt.Errorf("k8slab: state: %w", err)
	}
	if opt.Cache, err = CacheDir(opt.Cache); err != nil {
		return nil, err
	}
	if opt.Versions == (Versions{}) {
		opt.Versions = Pinned
	}
	if opt.Pools == nil {
		opt.Pools = DefaultPools
	}
	if opt.Log == nil {
		opt.Log = os.Stderr
	}
	return &Lab{opt: opt}, nil
}

func (l *Lab) logf(format string, args ...any) {
	fmt.Fprintf(l.opt.Log, "k8slab: "+format+"\n", args...)
}

// p joins rel onto the state directory.
func (l *Lab) p(rel string) string { return filepath.Join(l.opt.State, rel) }

func (l *Lab) containerdSock() string { return l.p("containerd/containerd.sock") }

// Kubeconfig is the admin kubeconfig (cluster-admin) Up writes.
func (l *Lab) Kubeconfig() string { return l.p("kubeconfig/admin.conf") }

// Kubectl is the path of the kubectl binary built with the cluster.
func (l *Lab) Kubectl() string {
	return filepath.Join(l.opt.Cache, "kubernetes-"+l.opt.Kubernetes, "bin", "kubectl")
}

// Client is a client of the API groups the lab writes: core/v1, apps/v1
// and rbac/v1 (the whole clientset would compile every group's client
// into the tests that link the lab).
type Client struct {
	core *corev1client.CoreV1Client
	apps *appsv1client.AppsV1Client
	rbac *rbacv1client.RbacV1Client
}

func (c *Client) CoreV1() corev1client.CoreV1Interface { return c.core }
func (c *Client) AppsV1() appsv1client.AppsV1Interface { return c.apps }
func (c *Client) RbacV1() rbacv1client.RbacV1Interface { return c.rbac }

// Client returns a client for the admin kubeconfig.
func (l *Lab) Client() (*Client, error) {
	if l.cs != nil {
		return l.cs, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", l.Kubeconfig())
	if err != nil {
		return nil, fmt.Errorf("k8slab: kubeconfig: %w", err)
	}
	cfg.Timeout = 15 * time.Second
	c := &Client{}
	if c.core, err = corev1client.NewForConfig(cfg); err == nil {
		if c.apps, err = appsv1client.NewForConfig(cfg); err == nil {
			c.rbac, err = rbacv1client.NewForConfig(cfg)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("k8slab: client: %w", err)
	}
	l.cs = c
	return c, nil
}

// Build makes sure the pinned binaries are in the cache (see Build).
func (l *Lab) Build(ctx context.Context) error {
	b, err := Build(ctx, l.opt.Repo, l.opt.Cache, l.opt.Versions, l.logf)
	l.bins = b
	return err
}

// defaultNodeIP is the source address of the default IPv4 route.
func defaultNodeIP() (net.IP, error) {
	out, err := exec.Command("ip", "-4", "route", "get", "1.1.1.1").Output()
	if err != nil {
		return nil, fmt.Errorf("k8slab: node IP: ip route get: %w", err)
	}
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "src" {
			if ip := net.ParseIP(f[i+1]); ip != nil {
				return ip, nil
			}
		}
	}
	return nil, fmt.Errorf("k8slab: node IP: no src in %q (give --node-ip)", strings.TrimSpace(string(out)))
}

func (l *Lab) resolveNodeIP() error {
	if l.opt.NodeIP != "" {
		ip := net.ParseIP(l.opt.NodeIP)
		if ip == nil || ip.To4() == nil {
			return fmt.Errorf("k8slab: --node-ip %q: not an IPv4 address", l.opt.NodeIP)
		}
		l.nodeIP = ip
		return nil
	}
	ip, err := defaultNodeIP()
	l.nodeIP = ip
	return err
}

func (l *Lab) apiServer() string { return fmt.Sprintf("https://%s:%d", l.nodeIP, APIPort) }

// writeFiles writes the state directory's layout, certificates,
// kubeconfigs and component configurations (configurations every time,
// certificates only when missing).
func (l *Lab) writeFiles() error {
	for _, d := range []string{"pki", "kubeconfig", "etcd", "containerd", "kubelet/root", "cni/net.d", "cni/ipam", "logs", "run", "images", "kwok"} {
		if err := os.MkdirAll(l.p(d), 0o755); err != nil {
			return fmt.Errorf("k8slab: state: %w", err)
		}
	}
	if err := os.Chmod(l.p("etcd"), 0o700); err != nil {
		return fmt.Errorf("k8slab: state: %w", err)
	}
	if err := ensurePKI(l.p("pki"), l.nodeIP); err != nil {
		return err
	}
	kwokCfg, err := l.kwokConfig()
	if err != nil {
		return err
	}
	files := map[string]string{
		"kubelet/config.yaml":           l.kubeletConfig(),
		"kubelet/resolv.conf":           hostResolvConf(),
		"containerd/config.toml":        l.containerdConfig(),
		"cni/net.d/10-pdserve.conflist": l.cniConfig(),
		"kube-proxy.yaml":               l.kubeProxyConfig(),
		"kwok/kwok.yaml":                kwokCfg,
	}
	for user, file := range map[string]string{"admin": "admin", "controller-manager": "controller-manager", "scheduler": "scheduler",
		"kubelet-client": "kubelet", "kube-proxy": "kube-proxy", "kwok": "kwok"} {
		files["kubeconfig/"+file+".conf"] = kubeconfig(l.p("pki"), user, l.apiServer())
	}
	for rel, content := range files {
		if err := os.WriteFile(l.p(rel), []byte(content), 0o600); err != nil {
			return fmt.Errorf("k8slab: write %s: %w", rel, err)
		}
	}
	return nil
}

// hostResolvConf is the resolv.conf for pods with dnsPolicy Default
// (CoreDNS forwards to it): the host's nameservers except loopback ones,
// which would point a pod at itself.
func hostResolvConf() string {
	data, _ := os.ReadFile("/etc/resolv.conf")
	var b strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if ip := net.ParseIP(f[1]); ip != nil && ip.IsLoopback() {
				continue
			}
		}
		if len(f) > 0 && (f[0] == "nameserver" || f[0] == "options") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}
