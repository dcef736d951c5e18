package k8slab

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Up starts the cluster, or the part of it that is not running, and
// returns once every component is healthy: the API server ready, the real
// node Ready, CoreDNS available and (with Options.KwokNodes) the simulated GPU
// nodes Ready. Calling it on a running cluster only checks it. The error
// names the step that failed and the end of the component's log.
func (l *Lab) Up(ctx context.Context) error {
	start := time.Now()
	if os.Geteuid() != 0 {
		return errors.New("k8slab: up needs root (containerd, the kubelet, CNI and iptables)")
	}
	if err := ensureHostPackages(l.logf); err != nil {
		return err
	}
	if err := checkKernel(); err != nil {
		return err
	}
	if err := l.Build(ctx); err != nil {
		return err
	}
	if err := l.resolveNodeIP(); err != nil {
		return err
	}
	if err := l.writeFiles(); err != nil {
		return err
	}
	if err := l.setupHostNetwork(); err != nil {
		return err
	}
	steps := []struct {
		name string
		f    func(context.Context) error
	}{
		{"etcd", l.upEtcd},
		{"kube-apiserver", l.upAPIServer},
		{"kube-controller-manager", l.upControllerManager},
		{"kube-scheduler", l.upScheduler},
		{"images", l.buildImages},
		{"containerd", l.upContainerd},
		{"kubelet", l.upKubelet},
		{"kube-proxy", l.upKubeProxy},
		{"coredns", l.upCoreDNS},
	}
	if l.opt.KwokNodes {
		steps = append(steps, struct {
			name string
			f    func(context.Context) error
		}{"kwok", l.upKwok})
	}
	for _, s := range steps {
		t := time.Now()
		if err := s.f(ctx); err != nil {
			return err
		}
		l.logf("%-24s ok (%s)", s.name, time.Since(t).Round(100*time.Millisecond))
	}
	l.logf("cluster up in %s; node %s at %s", time.Since(start).Round(100*time.Millisecond), NodeName, l.nodeIP)
	return nil
}

// waitFor polls f every 250 ms until it returns nil or d passes; the
// error then names what and f's last error, and the log's tail of comp.
func (l *Lab) waitFor(ctx context.Context, comp, what string, d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	var last error
	for {
		if last = f(); last == nil {
			return nil
		}
		var fe fatalError
		if errors.As(last, &fe) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("k8slab: %s: %s: %w", comp, what, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	msg := fmt.Sprintf("k8slab: %s: %s not reached after %s: %v", comp, what, d, last)
	var fe fatalError
	if errors.As(last, &fe) {
		msg = fmt.Sprintf("k8slab: %s: %s not reached: %v", comp, what, last)
	}
	if comp != "" {
		msg += fmt.Sprintf("\n--- last lines of %s:\n%s", l.LogFile(comp), l.tail(comp, 25))
	}
	return errors.New(msg)
}

// startAndWait starts p (unless it runs) and waits until healthy returns
// nil, failing early when the process exits.
func (l *Lab) startAndWait(ctx context.Context, p proc, what string, d time.Duration, healthy func() error) error {
	pid, err := l.start(p)
	if err != nil {
		return err
	}
	return l.waitFor(ctx, p.name, what, d, func() error {
		if !pidAlive(pid) {
			return fatalError{fmt.Errorf("%s exited", p.name)}
		}
		return healthy()
	})
}

// fatalError stops waitFor at once: waiting longer cannot help.
type fatalError struct{ error }

func httpOK(c *http.Client, url string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

var (
	plainHTTP    = &http.Client{Timeout: 3 * time.Second}
	insecureHTTP = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		// Only for the /healthz of kcm and the scheduler, which serve a
		// self-signed certificate on 127.0.0.1.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
)

func (l *Lab) upEtcd(ctx context.Context) error {
	pki := l.p("pki") + "/"
	return l.startAndWait(ctx, proc{name: "etcd", bin: l.bins.Path("etcd"), args: []string{
		"--name=default", "--data-dir=" + l.p("etcd/data"),
		"--listen-client-urls=https://127.0.0.1:2379", "--advertise-client-urls=https://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380", "--listen-metrics-urls=http://127.0.0.1:2381",
		"--cert-file=" + pki + "etcd-server.crt", "--key-file=" + pki + "etcd-server.key",
		"--client-cert-auth", "--trusted-ca-file=" + pki + "ca.crt",
		"--snapshot-count=10000", "--quota-backend-bytes=2147483648",
	}}, "/health", 60*time.Second, func() error { return httpOK(plainHTTP, "http://127.0.0.1:2381/health") })
}

func (l *Lab) upAPIServer(ctx context.Context) error {
	pki := l.p("pki") + "/"
	ip := l.nodeIP.String()
	if err := l.startAndWait(ctx, proc{name: "kube-apiserver", bin: l.bins.Path("kube-apiserver"), args: []string{
		"--etcd-servers=https://127.0.0.1:2379", "--etcd-cafile=" + pki + "ca.crt",
		"--etcd-certfile=" + pki + "apiserver-etcd-client.crt", "--etcd-keyfile=" + pki + "apiserver-etcd-client.key",
		"--bind-address=" + ip, "--advertise-address=" + ip, fmt.Sprintf("--secure-port=%d", APIPort),
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--tls-cert-file=" + pki + "apiserver.crt", "--tls-private-key-file=" + pki + "apiserver.key",
		"--client-ca-file=" + pki + "ca.crt",
		"--kubelet-client-certificate=" + pki + "apiserver-kubelet-client.crt", "--kubelet-client-key=" + pki + "apiserver-kubelet-client.key",
		"--kubelet-certificate-authority=" + pki + "ca.crt", "--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc." + ClusterDNS,
		"--service-account-key-file=" + pki + "sa.pub", "--service-account-signing-key-file=" + pki + "sa.key",
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true", "--profiling=false", "--event-ttl=1h",
	}}, "/readyz", 120*time.Second, func() error { return l.apiReady(ctx) }); err != nil {
		return err
	}
	return nil
}

func (l *Lab) apiReady(ctx context.Context) error {
	cs, err := l.Client()
	if err != nil {
		return err
	}
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("readyz: %v %s", err, body)
	}
	return nil
}

func (l *Lab) upControllerManager(ctx context.Context) error {
	pki := l.p("pki") + "/"
	kc := l.p("kubeconfig/controller-manager.conf")
	return l.startAndWait(ctx, proc{name: "kube-controller-manager", bin: l.bins.Path("kube-controller-manager"), args: []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", "--leader-elect=false",
		"--cluster-signing-cert-file=" + pki + "ca.crt", "--cluster-signing-key-file=" + pki + "ca.key",
		"--root-ca-file=" + pki + "ca.crt", "--service-account-private-key-file=" + pki + "sa.key",
		"--use-service-account-credentials=true", "--controllers=*,bootstrapsigner,tokencleaner",
		"--allocate-node-cidrs=false", "--service-cluster-ip-range=" + ServiceCIDR, "--cluster-name=pdserve",
		"--profiling=false",
	}}, "/healthz", 60*time.Second, func() error { return httpOK(insecureHTTP, "https://127.0.0.1:10257/healthz") })
}

func (l *Lab) upScheduler(ctx context.Context) error {
	kc := l.p("kubeconfig/scheduler.conf")
	return l.startAndWait(ctx, proc{name: "kube-scheduler", bin: l.bins.Path("kube-scheduler"), args: []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false",
	}}, "/healthz", 60*time.Second, func() error { return httpOK(insecureHTTP, "https://127.0.0.1:10259/healthz") })
}

func (l *Lab) ctr(args ...string) *exec.Cmd {
	return exec.Command("ctr", append([]string{"--address", l.containerdSock(), "--namespace", "k8s.io"}, args...)...)
}

func (l *Lab) upContainerd(ctx context.Context) error {
	if err := l.recordNetns(); err != nil {
		return err
	}
	if err := l.shareNetnsDir(); err != nil {
		return err
	}
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return fmt.Errorf("k8slab: containerd: %w", err)
	}
	if err := l.startAndWait(ctx, proc{name: "containerd", bin: bin, args: []string{"--config", l.p("containerd/config.toml")}},
		"the CRI socket", 60*time.Second, func() error {
			out, err := l.ctr("version").CombinedOutput()
			if err != nil {
				return fmt.Errorf("ctr version: %v: %s", err, strings.TrimSpace(string(out)))
			}
			return nil
		}); err != nil {
		return err
	}
	return l.importImages()
}

func (l *Lab) upKubelet(ctx context.Context) error {
	if err := l.startAndWait(ctx, proc{name: "kubelet", bin: l.bins.Path("kubelet"), args: []string{
		"--config=" + l.p("kubelet/config.yaml"), "--kubeconfig=" + l.p("kubeconfig/kubelet.conf"),
		"--hostname-override=" + NodeName, "--node-ip=" + l.nodeIP.String(),
		"--root-dir=" + l.p("kubelet/root"), "--cert-dir=" + l.p("kubelet/pki"), "--v=1",
	}}, "/healthz", 90*time.Second, func() error { return httpOK(plainHTTP, "http://127.0.0.1:10248/healthz") }); err != nil {
		return err
	}
	cs, err := l.Client()
	if err != nil {
		return err
	}
	return l.waitFor(ctx, "kubelet", "node "+NodeName+" Ready", 120*time.Second, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("Ready=%s: %s", c.Status, c.Message)
			}
		}
		return errors.New("no Ready condition yet")
	})
}

func (l *Lab) upKubeProxy(ctx context.Context) error {
	return l.startAndWait(ctx, proc{name: "kube-proxy", bin: l.bins.Path("kube-proxy"), args: []string{
		"--config=" + l.p("kube-proxy.yaml"), "--v=1",
	}}, "/healthz", 60*time.Second, func() error { return httpOK(plainHTTP, "http://127.0.0.1:10256/healthz") })
}

// ensureHostPackages installs the Debian packages the node needs when a
// command of theirs is missing.
func ensureHostPackages(logf func(string, ...any)) error {
	need := map[string]string{"containerd": "containerd", "runc": "runc", "ctr": "containerd", "iptables": "iptables",
		"conntrack": "conntrack", "socat": "socat", "ip": "iproute2"}
	var missing []string
	seen := map[string]bool{}
	for cmd, pkg := range need {
		if _, err := exec.LookPath(cmd); err != nil && !seen[pkg] {
			missing, seen[pkg] = append(missing, pkg), true
		}
	}
	if !exists(cniBinDir+"/bridge") && !seen["containernetworking-plugins"] {
		missing = append(missing, "containernetworking-plugins")
	}
	if len(missing) == 0 {
		return nil
	}
	logf("installing %s with apt-get", strings.Join(missing, " "))
	for _, args := range [][]string{{"update"}, append([]string{"install", "-y", "--no-install-recommends"}, missing...)} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("k8slab: apt-get %s: %w\n%s", args[0], err, out)
		}
	}
	return nil
}

// checkKernel names the kernel feature that is missing, if one is.
func checkKernel() error {
	fs, _ := os.ReadFile("/proc/filesystems")
	if !strings.Contains(string(fs), "overlay") {
		return errors.New("k8slab: the kernel has no overlay filesystem (containerd's overlayfs snapshotter needs it)")
	}
	if !exists("/proc/sys/net/bridge") {
		return errors.New("k8slab: no /proc/sys/net/bridge: the kernel lacks br_netfilter (Services between pods on the bridge need it)")
	}
	for _, c := range []string{"cpu", "cpuacct", "cpuset", "memory", "pids"} {
		if !exists("/sys/fs/cgroup/"+c) && !exists("/sys/fs/cgroup/cgroup.controllers") {
			return fmt.Errorf("k8slab: cgroup controller %s is not mounted under /sys/fs/cgroup", c)
		}
	}
	return nil
}

// kubeProxyOK is a helper for Status.
func dialOK(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
