package layering

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
)

const module = "github.com/pdserve/pdserve/"

// pkgInfo is what go list says of one package: its direct imports and
// every package it links (transitively), test files aside.
type pkgInfo struct {
	imports, deps []string
}

// list runs go list on pkgs (paths relative to the module) from the module
// root, or fails the test.
func list(t *testing.T, pkgs ...string) map[string]pkgInfo {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to list the imports: %v", err)
	}
	args := []string{"list", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}|{{join .Deps \" \"}}"}
	for _, p := range pkgs {
		args = append(args, "./"+p)
	}
	cmd := exec.Command(goTool, args...)
	cmd.Dir = repotest.Root(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	m := make(map[string]pkgInfo)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		if len(f) != 3 {
			t.Fatalf("go list line %q", sc.Text())
		}
		m[strings.TrimPrefix(f[0], module)] = pkgInfo{imports: strip(strings.Fields(f[1])), deps: strip(strings.Fields(f[2]))}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// strip makes the module's packages of paths relative to the module;
// other paths (the standard library, other modules) stay whole.
func strip(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = strings.TrimPrefix(p, module)
	}
	return out
}

// rule says what a package, and every package under it, must not link.
type rule struct {
	pkg    string
	direct bool // only pkg itself, and only its direct imports count, not what they link
	// not are the packages it must not link (or import): the module's
	// relative to it, others whole; one ending in "/..." is that package
	// and every package under it.
	not []string
}

// matches reports whether package q of a rule's not matches path p.
func matches(q, p string) bool {
	if tree, ok := strings.CutSuffix(q, "/..."); ok {
		return p == tree || strings.HasPrefix(p, tree+"/")
	}
	return p == q
}

// pattern is the go list pattern of the packages r covers.
func (r rule) pattern() string {
	if r.direct {
		return r.pkg
	}
	return r.pkg + "/..."
}

// violations returns "P links Q" (or "P imports Q" for a direct rule) for
// each package P that r covers in infos and each Q of r.not that P links,
// sorted; and false when infos holds no package r covers.
func violations(infos map[string]pkgInfo, r rule) (bad []string, found bool) {
	for p, info := range infos {
		if p != r.pkg && (r.direct || !strings.HasPrefix(p, r.pkg+"/")) {
			continue
		}
		found = true
		got, what := info.deps, "links"
		if r.direct {
			got, what = info.imports, "imports"
		}
		for _, q := range r.not {
			for _, g := range got {
				if matches(q, g) {
					bad = append(bad, p+" "+what+" "+g)
				}
			}
		}
	}
	slices.Sort(bad)
	return bad, found
}

// TestLayering: no package links, or imports, what lies above it or beside
// it in another role (see the package doc). A rule covers the package and
// every package under it, and counts what they link (go list's Deps, the
// packages of go list -deps), not only what they import.
func TestLayering(t *testing.T) {
	workers := []string{"pkg/prefill", "pkg/decode", "pkg/workerrun", "pkg/enginebuild"}
	rules := []rule{
		{pkg: "pkg/coordinator", not: append(slices.Clone(workers), "pkg/kvtransfer", "pkg/engine/sim", "pkg/standalone", "pkg/coordinatorrun")},
		{pkg: "pkg/coordinatorrun", direct: true, not: workers},
		{pkg: "pkg/frontend", not: []string{"pkg/coordinator", "pkg/engine/ref", "pkg/engine/sim", "pkg/engine/llamacpp", "pkg/enginecfg"}},
		{pkg: "pkg/tokenizer", not: []string{"pkg/engine", "pkg/engine/ref", "pkg/engine/sim", "pkg/engine/llamacpp", "pkg/enginecfg"}},
		{pkg: "pkg/sampling", not: []string{"pkg/engine"}},
		{pkg: "pkg/prefill", not: []string{"pkg/coordinator", "pkg/decode", "pkg/frontend", "pkg/router"}},
		{pkg: "pkg/decode", not: []string{"pkg/coordinator", "pkg/prefill", "pkg/frontend", "pkg/router"}},
		// The decode worker's batch speaks Go types only: the service
		// maps them to the wire.
		{pkg: "pkg/decode/batch", not: []string{"api/...", "google.golang.org/grpc/...", "pkg/wire", "pkg/kvtransfer", "pkg/grpcauth"}},
		// So does the prefill worker's.
		{pkg: "pkg/prefill/batch", not: []string{"api/...", "google.golang.org/grpc/...", "pkg/wire", "pkg/kvtransfer", "pkg/grpcauth"}},
		{pkg: "pkg/workerrun", not: []string{"pkg/coordinator", "pkg/coordinatorrun", "pkg/standalone", "pkg/frontend", "pkg/router"}},
		{pkg: "pkg/kvtransfer", not: []string{"pkg/coordinator", "pkg/prefill", "pkg/decode", "pkg/workerrun"}},
		{pkg: "pkg/grpcnet", not: []string{"pkg/coordinator", "pkg/workerrun", "pkg/kvtransfer", "pkg/engine"}},
		{pkg: "pkg/logging", not: []string{"pkg/coordinator", "pkg/workerrun", "pkg/engine"}},
		{pkg: "pkg/enginecfg", not: []string{"pkg/engine/sim", "pkg/workerrun", "pkg/coordinator"}},
		// The flow core speaks its own Go types: the shell converts the
		// wire and maps failures to HTTP.
		{pkg: "pkg/coordinator/flow", not: []string{"pkg/frontend", "api/...", "pkg/wire", "google.golang.org/grpc/...", "google.golang.org/genproto/..."}},
	}
	// Nothing links client-go's whole clientset or its fake (every API
	// group's client, about 150 generated packages, a minute of make
	// test's compile): the planner's actuators use actuator.Client, the
	// tests actuatortest, the lab its own Client.
	for _, tree := range []string{"cmd", "pkg", "internal", "loadtest", "helm"} {
		rules = append(rules, rule{pkg: tree, not: []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/kubernetes/fake"}})
	}
	var pkgs []string
	for _, r := range rules {
		pkgs = append(pkgs, r.pattern())
	}
	infos := list(t, pkgs...)
	for _, r := range rules {
		t.Run(r.pkg, func(t *testing.T) {
			bad, found := violations(infos, r)
			if !found {
				t.Fatalf("go list did not report %s", r.pkg)
			}
			for _, b := range bad {
				t.Error(b)
			}
		})
	}
}

// TestTestsLinkNoWholeClientset: no test file imports client-go's whole
// clientset or its fake either (TestLayering sees what packages link, not
// their tests; a test's import would put the clientset back into make
// test's compile). The Kubernetes end-to-end tests, behind the k8se2e
// build tag, are outside make test and may.
func TestTestsLinkNoWholeClientset(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{join .TestImports \" \"}} {{join .XTestImports \" \"}}", "./...")
	cmd.Dir = repotest.Root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	n := 0
	for line := range strings.Lines(string(out)) {
		p, imports, _ := strings.Cut(strings.TrimSpace(line), "|")
		n++
		for _, q := range strings.Fields(imports) {
			if q == "k8s.io/client-go/kubernetes" || q == "k8s.io/client-go/kubernetes/fake" {
				t.Errorf("a test of %s imports %s: use actuator.Client and actuatortest", strings.TrimPrefix(p, module), q)
			}
		}
	}
	if n < 50 {
		t.Fatalf("go list listed %d packages", n)
	}
}

// TestViolationsCountLinks: a rule sees a package linked through another
// (A imports B, B imports C: A links C) and one linked by a package under
// the rule's; a direct rule sees only its package's imports.
func TestViolationsCountLinks(t *testing.T) {
	infos := map[string]pkgInfo{
		"pkg/a":     {imports: []string{"pkg/b"}, deps: []string{"pkg/b", "pkg/c"}},
		"pkg/a/sub": {imports: []string{"pkg/d"}, deps: []string{"pkg/d"}},
		"pkg/ab":    {imports: []string{"pkg/c"}, deps: []string{"pkg/c"}},
		"pkg/b":     {imports: []string{"pkg/c"}, deps: []string{"pkg/c"}},
	}
	for _, tc := range []struct {
		r    rule
		want []string
	}{
		{rule{pkg: "pkg/a", not: []string{"pkg/c", "pkg/d"}}, []string{"pkg/a links pkg/c", "pkg/a/sub links pkg/d"}},
		{rule{pkg: "pkg/a", direct: true, not: []string{"pkg/c", "pkg/d"}}, nil},
		{rule{pkg: "pkg/a", direct: true, not: []string{"pkg/b"}}, []string{"pkg/a imports pkg/b"}},
		{rule{pkg: "pkg/b", not: []string{"pkg/..."}}, []string{"pkg/b links pkg/c"}},
		{rule{pkg: "pkg/b", not: []string{"pkg/c/...", "pkg"}}, []string{"pkg/b links pkg/c"}},
		{rule{pkg: "pkg/ab", not: []string{"pkg/a/..."}}, nil},
		{rule{pkg: "pkg/a", not: []string{"pkg/..."}}, []string{"pkg/a links pkg/b", "pkg/a links pkg/c", "pkg/a/sub links pkg/d"}},
	} {
		got, found := violations(infos, tc.r)
		if !found || !slices.Equal(got, tc.want) {
			t.Errorf("violations(%+v) = %q, %v; want %q, true", tc.r, got, found, tc.want)
		}
	}
	if _, found := violations(infos, rule{pkg: "pkg/x"}); found {
		t.Errorf("violations found pkg/x in %v", infos)
	}
}
