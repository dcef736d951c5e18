package k8slab

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// ComponentState is one component's process state.
type ComponentState struct {
	Name    string
	Pid     int
	Running bool
	Log     string
}

// Status reports each component's process, in start order, and whether
// the API server answers /readyz (nil error).
func (l *Lab) Status(ctx context.Context) ([]ComponentState, error) {
	kbin := filepath.Join(l.opt.Cache, "kubernetes-"+l.opt.Kubernetes, "bin")
	containerd, _ := exec.LookPath("containerd")
	comps := []struct{ name, bin string }{
		{"etcd", filepath.Join(l.opt.Cache, "etcd-"+l.opt.Etcd, "bin", "etcd")},
		{"kube-apiserver", filepath.Join(kbin, "kube-apiserver")},
		{"kube-controller-manager", filepath.Join(kbin, "kube-controller-manager")},
		{"kube-scheduler", filepath.Join(kbin, "kube-scheduler")},
		{"containerd", containerd},
		{"kubelet", filepath.Join(kbin, "kubelet")},
		{"kube-proxy", filepath.Join(kbin, "kube-proxy")},
		{"kwok", filepath.Join(l.opt.Cache, "kwok-"+l.opt.Kwok, "bin", "kwok")},
	}
	var out []ComponentState
	for _, c := range comps {
		pid, ok := l.running(c.name, c.bin)
		out = append(out, ComponentState{Name: c.name, Pid: pid, Running: ok, Log: l.LogFile(c.name)})
	}
	if err := l.apiReady(ctx); err != nil {
		return out, fmt.Errorf("k8slab: API server not ready: %w", err)
	}
	return out, nil
}

// Env is the shell lines that point kubectl at the lab.
func (l *Lab) Env() string {
	return strings.Join([]string{
		"export KUBECONFIG=" + l.Kubeconfig(),
		"export PATH=" + filepath.Dir(l.Kubectl()) + ":$PATH",
	}, "\n")
}
