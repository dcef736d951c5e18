package k8slab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// hostNet is what Up changed on the host, saved in net.json so that Down
// restores it.
type hostNet struct {
	Sysctls     map[string]string `json:"sysctls"`      // path → value before Up
	NetnsBefore []string          `json:"netns_before"` // cni-* netns that existed before containerd started
	NetnsKnown  bool              `json:"netns_known"`
}

var labSysctls = map[string]string{
	"/proc/sys/net/ipv4/ip_forward":                 "1",
	"/proc/sys/net/bridge/bridge-nf-call-iptables":  "1",
	"/proc/sys/net/bridge/bridge-nf-call-ip6tables": "1",
}

// masqRule is the one NAT rule the lab adds: pods reaching outside the
// pod network leave with the node's address.
var masqRule = []string{"POSTROUTING", "-s", PodCIDR, "!", "-d", PodCIDR, "-m", "comment", "--comment", CNINetwork, "-j", "MASQUERADE"}

func (l *Lab) loadHostNet() (hostNet, error) {
	var h hostNet
	data, err := os.ReadFile(l.p("net.json"))
	if errors.Is(err, os.ErrNotExist) {
		return hostNet{Sysctls: map[string]string{}}, nil
	}
	if err != nil {
		return h, fmt.Errorf("k8slab: net.json: %w", err)
	}
	if err := json.Unmarshal(data, &h); err != nil {
		return h, fmt.Errorf("k8slab: net.json: %w", err)
	}
	if h.Sysctls == nil {
		h.Sysctls = map[string]string{}
	}
	return h, nil
}

func (l *Lab) saveHostNet(h hostNet) error {
	data, _ := json.MarshalIndent(h, "", "  ")
	if err := os.WriteFile(l.p("net.json"), data, 0o644); err != nil {
		return fmt.Errorf("k8slab: net.json: %w", err)
	}
	return nil
}

// setupHostNetwork turns on forwarding and bridge netfilter (saving the
// values before) and adds the masquerade rule unless present.
func (l *Lab) setupHostNetwork() error {
	h, err := l.loadHostNet()
	if err != nil {
		return err
	}
	for path, want := range labSysctls {
		cur, err := os.ReadFile(path)
		if err != nil {
			if strings.Contains(path, "ip6tables") {
				continue
			}
			return fmt.Errorf("k8slab: sysctl %s: %w", path, err)
		}
		if _, saved := h.Sysctls[path]; !saved {
			h.Sysctls[path] = strings.TrimSpace(string(cur))
		}
		if strings.TrimSpace(string(cur)) != want {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				return fmt.Errorf("k8slab: sysctl %s=%s: %w", path, want, err)
			}
		}
	}
	if err := l.saveHostNet(h); err != nil {
		return err
	}
	if exec.Command("iptables", append([]string{"-w", "-t", "nat", "-C"}, masqRule...)...).Run() != nil {
		if err := run("iptables", append([]string{"-w", "-t", "nat", "-A"}, masqRule...)...); err != nil {
			return fmt.Errorf("k8slab: masquerade rule: %w", err)
		}
	}
	return nil
}

const netnsDir = "/var/run/netns"

func cniNetns() []string {
	ents, _ := os.ReadDir(netnsDir)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "cni-") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// recordNetns remembers the cni-* network namespaces that exist before the
// lab's containerd first starts, so that Down removes only its own.
func (l *Lab) recordNetns() error {
	h, err := l.loadHostNet()
	if err != nil || h.NetnsKnown {
		return err
	}
	h.NetnsBefore, h.NetnsKnown = cniNetns(), true
	return l.saveHostNet(h)
}

// teardownNetwork releases every pod address with CNI DEL (portmap's and
// the bridge's, which also frees the host-local lease), removes the
// network namespaces containerd made, the bridge and the masquerade rule,
// and restores the sysctls. It goes on after an error and returns them all.
func (l *Lab) teardownNetwork() error {
	var errs []error
	h, err := l.loadHostNet()
	if err != nil {
		errs = append(errs, err)
	}
	// CNI DEL for each address host-local still holds (file name = IP,
	// content = container ID and interface).
	leases, _ := filepath.Glob(l.p("cni/ipam/" + CNINetwork + "/*"))
	for _, f := range leases {
		base := filepath.Base(f)
		if strings.HasPrefix(base, "last_reserved_ip") || base == "lock" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		id, ifname, _ := strings.Cut(strings.TrimSpace(string(data)), "\n")
		ifname = strings.TrimSpace(ifname)
		if ifname == "" {
			ifname = "eth0"
		}
		if err := l.cniDel(strings.TrimSpace(id), ifname); err != nil {
			errs = append(errs, err)
		}
	}
	before := map[string]bool{}
	for _, n := range h.NetnsBefore {
		before[n] = true
	}
	if h.NetnsKnown {
		for _, n := range cniNetns() {
			if before[n] {
				continue
			}
			p := filepath.Join(netnsDir, n)
			_ = unix.Unmount(p, unix.MNT_DETACH)
			if err := os.Remove(p); err != nil {
				errs = append(errs, fmt.Errorf("k8slab: netns %s: %w", n, err))
			}
		}
	}
	if exists("/sys/class/net/" + BridgeName) {
		if err := run("ip", "link", "del", BridgeName); err != nil {
			errs = append(errs, fmt.Errorf("k8slab: bridge: %w", err))
		}
	}
	for exec.Command("iptables", append([]string{"-w", "-t", "nat", "-C"}, masqRule...)...).Run() == nil {
		if err := run("iptables", append([]string{"-w", "-t", "nat", "-D"}, masqRule...)...); err != nil {
			errs = append(errs, fmt.Errorf("k8slab: masquerade rule: %w", err))
			break
		}
	}
	for path, v := range h.Sysctls {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("k8slab: restore %s=%s: %w", path, v, err))
		}
	}
	return errors.Join(errs...)
}

// cniDel runs the network's plugins' DEL in reverse order, as the CNI
// runtime would, without a netns (the plugins tolerate that; the netns
// goes away after and takes the veth with it).
func (l *Lab) cniDel(containerID, ifname string) error {
	var conf struct {
		CNIVersion string            `json:"cniVersion"`
		Name       string            `json:"name"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(l.cniConfig()), &conf); err != nil {
		return fmt.Errorf("k8slab: cni config: %w", err)
	}
	var errs []error
	for i := len(conf.Plugins) - 1; i >= 0; i-- {
		var pl map[string]any
		if err := json.Unmarshal(conf.Plugins[i], &pl); err != nil {
			return fmt.Errorf("k8slab: cni config: %w", err)
		}
		pl["cniVersion"], pl["name"] = conf.CNIVersion, conf.Name
		stdin, _ := json.Marshal(pl)
		typ, _ := pl["type"].(string)
		cmd := exec.Command(filepath.Join(cniBinDir, typ))
		cmd.Env = append(os.Environ(), "CNI_COMMAND=DEL", "CNI_CONTAINERID="+containerID, "CNI_NETNS=",
			"CNI_IFNAME="+ifname, "CNI_PATH="+cniBinDir)
		cmd.Stdin = strings.NewReader(string(stdin))
		if out, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("k8slab: CNI DEL %s %s: %w: %s", typ, containerID, err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// removeKubeletChains removes the iptables chains the kubelet itself
// creates (kube-proxy --cleanup leaves them): KUBE-FIREWALL, hooked into
// INPUT and OUTPUT, and the KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT
// markers, for IPv4 and IPv6.
func removeKubeletChains() {
	for _, ipt := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(ipt); err != nil {
			continue
		}
		for _, hook := range []string{"INPUT", "OUTPUT"} {
			for exec.Command(ipt, "-w", "-t", "filter", "-D", hook, "-j", "KUBE-FIREWALL").Run() == nil {
			}
		}
		for _, table := range []string{"filter", "nat", "mangle"} {
			for _, chain := range []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"} {
				if exec.Command(ipt, "-w", "-t", table, "-F", chain).Run() == nil {
					_ = exec.Command(ipt, "-w", "-t", table, "-X", chain).Run()
				}
			}
		}
	}
}

// shareNetnsDir makes the directory of the pods' network namespaces a
// shared mount point of its own before containerd mounts any there, as
// iproute2 does: `ip netns add` (the netlab tests, netbench, chaos), when
// it finds the directory not a mount point, bind-mounts it onto itself.
// Done while pods run, that mount hides containerd's netns mounts under
// it: containerd's unmount then misses them and its unlink fails ("remove
// netns: unlinkat /var/run/netns/cni-…: device or resource busy"), and
// every pod stays Terminating. With the directory already a shared mount
// point, ip netns only marks it shared again.
func (l *Lab) shareNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return fmt.Errorf("k8slab: %w", err)
	}
	dir, err := filepath.EvalSymlinks(netnsDir)
	if err != nil {
		return fmt.Errorf("k8slab: %w", err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("k8slab: %w", err)
	}
	isMount, below := false, 0
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		switch {
		case f[4] == dir:
			isMount = true
		case strings.HasPrefix(f[4], dir+"/"):
			below++
		}
	}
	if !isMount {
		if below > 0 {
			// A bind now would hide those as ip netns would: leave it.
			l.logf("warning: %s is not a mount point and holds %d network namespaces already: not made shared (a later `ip netns add` can hide them from containerd; make k8s-down first)", netnsDir, below)
			return nil
		}
		if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("k8slab: bind-mount %s onto itself: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("k8slab: make %s shared: %w", dir, err)
	}
	return nil
}
