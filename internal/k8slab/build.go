package k8slab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// component is one build module under scripts/k8s/build and what it makes.
type component struct {
	name    string   // directory under scripts/k8s/build and cache key prefix
	version string   // pinned version, the rest of the cache key
	recipe  string   // when set, ends the cache key: names a build of other than upstream's main
	bins    []target // binaries written into the cache's bin/
	ldflags string   // extra -ldflags (-s -w is always there)
	extra   func(ctx context.Context, mod, dir string) error
}

type target struct{ out, pkg string }

func components(v Versions) []component {
	k8sX := ""
	major, minor := "1", strings.Split(strings.TrimPrefix(v.Kubernetes, "v"), ".")[1]
	for _, p := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		k8sX += fmt.Sprintf(" -X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean -X %s.buildDate=1970-01-01T00:00:00Z",
			p, v.Kubernetes, p, major, p, minor, p, p)
	}
	k := "k8s.io/kubernetes/cmd/"
	return []component{
		{name: "kubernetes", version: v.Kubernetes, ldflags: k8sX, bins: []target{
			{"kube-apiserver", k + "kube-apiserver"}, {"kube-controller-manager", k + "kube-controller-manager"},
			{"kube-scheduler", k + "kube-scheduler"}, {"kubelet", k + "kubelet"},
			{"kube-proxy", k + "kube-proxy"}, {"kubectl", k + "kubectl"},
		}},
		{name: "etcd", version: v.Etcd, bins: []target{{"etcd", "go.etcd.io/etcd/server/v3"}}},
		{name: "kwok", version: v.Kwok, ldflags: " -X sigs.k8s.io/kwok/pkg/consts.Version=" + v.Kwok,
			bins: []target{{"kwok", "sigs.k8s.io/kwok/cmd/kwok"}}, extra: copyKwokStages},
		// It runs in an image with no libc (every binary is static).
		// The build module's own main: CoreDNS with the Corefile's
		// plugins only (see its main.go).
		{name: "coredns", version: v.CoreDNS, recipe: "lab-plugins",
			bins: []target{{"coredns", "github.com/pdserve/pdserve/scripts/k8s/build/coredns"}}},
	}
}

// Bins are the paths of the built binaries, by name (kube-apiserver,
// kubectl, etcd, kwok, coredns, …), and of kwok's stage manifests.
type Bins struct {
	paths      map[string]string
	KwokStages string // directory of kwok's node and pod stage YAMLs
}

// Path returns the binary's path; it panics on an unknown name (a
// programming error).
func (b Bins) Path(name string) string {
	p, ok := b.paths[name]
	if !ok {
		panic("k8slab: no binary " + name)
	}
	return p
}

// CacheDir is where Build keeps the binaries of one component version:
// $XDG_CACHE_HOME/pdserve/k8s (or ~/.cache/pdserve/k8s) unless root is set.
func CacheDir(root string) (string, error) {
	if root != "" {
		return root, nil
	}
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "pdserve", "k8s"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("k8slab: cache dir: %w", err)
	}
	return filepath.Join(home, ".cache", "pdserve", "k8s"), nil
}

// Build makes sure every pinned binary is in the cache, building a
// component's missing binaries from its build module under
// repo/scripts/k8s/build (go build -trimpath -ldflags=-s -w
// -gcflags=all=-dwarf=false, into a temporary directory renamed into
// place). A warm cache builds nothing.
// Progress goes to logf.
func Build(ctx context.Context, repo, cache string, v Versions, logf func(string, ...any)) (Bins, error) {
	b := Bins{paths: map[string]string{}}
	for _, c := range components(v) {
		key := c.name + "-" + c.version
		if c.recipe != "" {
			key += "-" + c.recipe
		}
		dir := filepath.Join(cache, key)
		bin := filepath.Join(dir, "bin")
		for _, t := range c.bins {
			b.paths[t.out] = filepath.Join(bin, t.out)
		}
		if c.name == "kwok" {
			b.KwokStages = filepath.Join(dir, "stages")
		}
		if complete(bin, c.bins) && (c.extra == nil || exists(filepath.Join(dir, "stages"))) {
			continue
		}
		mod := filepath.Join(repo, "scripts", "k8s", "build", c.name)
		tmp := filepath.Join(dir, "bin.tmp")
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			return b, fmt.Errorf("k8slab: build %s: %w", c.name, err)
		}
		start := time.Now()
		logf("building %s %s (cold build, minutes) into %s", c.name, c.version, bin)
		// One go build for all of a component's binaries: it links one
		// while it compiles another's packages, where a build per binary
		// left a core idle during each link.
		// -s -w: the binaries carry no symbol table or DWARF; so the
		// compiler writes no DWARF either (-dwarf=false), which the
		// linker would drop: 8% of a cold build's time (kwok: 200 s →
		// 184 s on 2 cores).
		args := []string{"build", "-trimpath", "-gcflags=all=-dwarf=false", "-ldflags=-s -w" + c.ldflags, "-o", tmp + string(filepath.Separator)}
		for _, t := range c.bins {
			args = append(args, t.pkg)
		}
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = mod
		// Every component static (CGO_ENABLED=0), as upstream releases
		// them: etcd, kwok and CoreDNS are, and so are Kubernetes'
		// binaries but the kubelet, which upstream's
		// KUBE_STATIC_OVERRIDES builds static too (hack/lib/golang.sh).
		// With cgo the lab compiled the standard library and net's
		// dependants in a configuration of their own; static, with
		// -trimpath and no compiler DWARF, it is .ci/run's, whose
		// builds of pdserve compiled it already (85 s of CPU cold).
		cmd.Env = append(withoutEnv(os.Environ(), "CGO_ENABLED"), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("k8slab: build %s: %w\n%s", c.name, err, out)
		}
		for _, t := range c.bins {
			if name := execName(t.pkg); name != t.out {
				if err := os.Rename(filepath.Join(tmp, name), filepath.Join(tmp, t.out)); err != nil {
					return b, fmt.Errorf("k8slab: build %s: %w", c.name, err)
				}
			}
		}
		if c.extra != nil {
			if err := c.extra(ctx, mod, dir); err != nil {
				return b, fmt.Errorf("k8slab: build %s: %w", c.name, err)
			}
		}
		_ = os.RemoveAll(bin)
		if err := os.Rename(tmp, bin); err != nil {
			return b, fmt.Errorf("k8slab: build %s: %w", c.name, err)
		}
		logf("built %s %s in %s", c.name, c.version, time.Since(start).Round(time.Second))
	}
	return b, nil
}

// execName is the name go build -o DIR/ gives the binary of package pkg:
// its last element, or the one before a major version suffix (server for
// go.etcd.io/etcd/server/v3).
func execName(pkg string) string {
	elem := path.Base(pkg)
	if v, ok := strings.CutPrefix(elem, "v"); ok && v != "" && strings.Trim(v, "0123456789") == "" && path.Dir(pkg) != "." {
		return path.Base(path.Dir(pkg))
	}
	return elem
}

func complete(bin string, ts []target) bool {
	for _, t := range ts {
		if !exists(filepath.Join(bin, t.out)) {
			return false
		}
	}
	return true
}

// withoutEnv returns env without the entries of key.
func withoutEnv(env []string, key string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(e string) bool { return strings.HasPrefix(e, key+"=") })
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// copyKwokStages copies the node and pod "fast" stages (and the node
// heartbeat with leases) from the kwok module, the stages kwokctl
// configures by default, into dir/stages.
func copyKwokStages(ctx context.Context, mod, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok")
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("locate kwok module: %w", err)
	}
	src := filepath.Join(strings.TrimSpace(string(out)), "kustomize", "stage")
	dst := filepath.Join(dir, "stages")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, f := range []string{"node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
		"pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, filepath.Base(f)), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
