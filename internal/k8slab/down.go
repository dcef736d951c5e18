package k8slab

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Down stops every component of the lab, kills the pods' processes,
// tears down the pod network (see teardownNetwork) and kube-proxy's
// iptables rules, unmounts what containerd and the kubelet mounted under
// the state directory, removes the kubepods cgroups and then the state
// directory, except logs/. It is safe to call when nothing runs. It goes
// on after an error and returns every error it met.
func (l *Lab) Down() error {
	if os.Geteuid() != 0 {
		return errors.New("k8slab: down needs root")
	}
	if !exists(l.p("")) {
		return nil
	}
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	kbin := filepath.Join(l.opt.Cache, "kubernetes-"+l.opt.Kubernetes, "bin")
	add(l.stop("kwok", filepath.Join(l.opt.Cache, "kwok-"+l.opt.Kwok, "bin", "kwok"), 10*time.Second))
	add(l.stop("kube-proxy", filepath.Join(kbin, "kube-proxy"), 10*time.Second))
	if exists(filepath.Join(kbin, "kube-proxy")) {
		if out, err := exec.Command(filepath.Join(kbin, "kube-proxy"), "--cleanup").CombinedOutput(); err != nil {
			add(fmt.Errorf("k8slab: kube-proxy --cleanup: %w: %s", err, lastLine(out)))
		}
	}
	add(l.stop("kubelet", filepath.Join(kbin, "kubelet"), 15*time.Second))
	if containerd, err := exec.LookPath("containerd"); err == nil {
		if _, ok := l.running("containerd", containerd); ok {
			l.killTasks()
		}
		killCgroupProcs()
		l.killShims()
		add(l.stop("containerd", containerd, 15*time.Second))
	}
	add(l.teardownNetwork())
	removeKubeletChains()
	add(l.unmountState())
	add(removeKubepodsCgroups())
	add(l.stop("kube-scheduler", filepath.Join(kbin, "kube-scheduler"), 10*time.Second))
	add(l.stop("kube-controller-manager", filepath.Join(kbin, "kube-controller-manager"), 10*time.Second))
	add(l.stop("kube-apiserver", filepath.Join(kbin, "kube-apiserver"), 20*time.Second))
	add(l.stop("etcd", filepath.Join(l.opt.Cache, "etcd-"+l.opt.Etcd, "bin", "etcd"), 15*time.Second))
	if len(errs) == 0 {
		ents, _ := os.ReadDir(l.p(""))
		for _, e := range ents {
			if e.Name() == "logs" {
				continue
			}
			add(os.RemoveAll(l.p(e.Name())))
		}
	}
	return errors.Join(errs...)
}

// killTasks asks containerd to kill and delete every task of the k8s.io
// namespace, so that it unmounts their root filesystems itself.
func (l *Lab) killTasks() {
	out, err := l.ctr("tasks", "ls", "-q").Output()
	if err != nil {
		return
	}
	ids := strings.Fields(string(out))
	for _, id := range ids {
		_ = l.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", id).Run()
	}
	for _, id := range ids {
		for i := 0; i < 20 && l.ctr("tasks", "delete", "--force", id).Run() != nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func cgroupKubepods() []string {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	if exists("/sys/fs/cgroup/kubepods") {
		dirs = append(dirs, "/sys/fs/cgroup/kubepods")
	}
	if exists("/sys/fs/cgroup/unified/kubepods") {
		dirs = append(dirs, "/sys/fs/cgroup/unified/kubepods")
	}
	return dirs
}

// killCgroupProcs SIGKILLs every process left in a kubepods cgroup.
func killCgroupProcs() {
	for round := 0; round < 20; round++ {
		n := 0
		for _, root := range cgroupKubepods() {
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
					return nil
				}
				data, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(data)) {
					if pid, err := strconv.Atoi(f); err == nil {
						_ = syscall.Kill(pid, syscall.SIGKILL)
						n++
					}
				}
				return nil
			})
		}
		if n == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killShims SIGKILLs the containerd-shim-runc-v2 processes of this lab's
// containerd (those whose -address is the lab's socket).
func (l *Lab) killShims() {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) == 0 || !strings.HasSuffix(args[0], "containerd-shim-runc-v2") {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == l.containerdSock() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// unmountState detaches every mount under the state directory, deepest
// first.
func (l *Lab) unmountState() error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("k8slab: mountinfo: %w", err)
	}
	defer f.Close()
	prefix := l.p("") + "/"
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			mp := unescapeMount(fields[4])
			if strings.HasPrefix(mp, prefix) {
				mps = append(mps, mp)
			}
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	var errs []error
	for _, mp := range mps {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("k8slab: unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeKubepodsCgroups removes the kubelet's cgroups, leaves first.
func removeKubepodsCgroups() error {
	var errs []error
	for _, root := range cgroupKubepods() {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("k8slab: rmdir cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

func lastLine(out []byte) string {
	s := strings.TrimSpace(string(out))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
