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

// strip keeps the module's packages of paths, relative to the module.
func strip(paths []string) []string {
	var out []string
	for _, p := range paths {
		if rel, ok := strings.CutPrefix(p, module); ok {
			out = append(out, rel)
		}
	}
	return out
}

// TestLayering: no package links, or imports, what lies above it or beside
// it in another role (see the package doc).
func TestLayering(t *testing.T) {
	workers := []string{"pkg/prefill", "pkg/decode", "pkg/workerrun", "pkg/enginebuild"}
	rules := []struct {
		pkg    string
		direct bool     // only direct imports count, not what they link
		not    []string // packages it must not link (or import)
	}{
		{pkg: "pkg/coordinator", not: append(slices.Clone(workers), "pkg/kvtransfer", "pkg/engine/sim", "pkg/standalone", "pkg/coordinatorrun")},
		{pkg: "pkg/coordinatorrun", direct: true, not: workers},
		{pkg: "pkg/frontend", not: []string{"pkg/coordinator", "pkg/engine/ref", "pkg/engine/sim", "pkg/engine/llamacpp", "pkg/enginecfg"}},
		{pkg: "pkg/tokenizer", not: []string{"pkg/engine", "pkg/engine/ref", "pkg/engine/sim", "pkg/engine/llamacpp", "pkg/enginecfg"}},
		{pkg: "pkg/sampling", not: []string{"pkg/engine"}},
		{pkg: "pkg/prefill", not: []string{"pkg/coordinator", "pkg/decode", "pkg/frontend", "pkg/router"}},
		{pkg: "pkg/decode", not: []string{"pkg/coordinator", "pkg/prefill", "pkg/frontend", "pkg/router"}},
		{pkg: "pkg/workerrun", not: []string{"pkg/coordinator", "pkg/coordinatorrun", "pkg/standalone", "pkg/frontend", "pkg/router"}},
		{pkg: "pkg/kvtransfer", not: []string{"pkg/coordinator", "pkg/prefill", "pkg/decode", "pkg/workerrun"}},
		{pkg: "pkg/grpcnet", not: []string{"pkg/coordinator", "pkg/workerrun", "pkg/kvtransfer", "pkg/engine"}},
		{pkg: "pkg/logging", not: []string{"pkg/coordinator", "pkg/workerrun", "pkg/engine"}},
		{pkg: "pkg/enginecfg", not: []string{"pkg/engine/sim", "pkg/workerrun", "pkg/coordinator"}},
	}
	var pkgs []string
	for _, r := range rules {
		pkgs = append(pkgs, r.pkg)
	}
	infos := list(t, pkgs...)
	for _, tc := range rules {
		t.Run(tc.pkg, func(t *testing.T) {
			info, ok := infos[tc.pkg]
			if !ok {
				t.Fatalf("go list did not report %s", tc.pkg)
			}
			got, what := info.deps, "links"
			if tc.direct {
				got, what = info.imports, "imports"
			}
			for _, p := range tc.not {
				if slices.Contains(got, p) {
					t.Errorf("%s %s %s", tc.pkg, what, p)
				}
			}
		})
	}
}
