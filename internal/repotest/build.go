package repotest

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// BuildArgs returns the arguments of `go build` that write pkgs' binaries
// into dir the way this test binary was built: with -race under -race, so
// that the build reuses the packages `go test -race ./...` compiled
// instead of compiling every dependency a second time without it (a
// coordinator's 900 packages: minutes of a cold 2-core machine), and the
// binaries are checked for races too. The binaries carry no VCS stamp
// (-buildvcs=false, as CI builds): their version line is the same in any
// checkout. Nor DWARF (-ldflags=-w, as make test links the test
// binaries): stack traces and race reports use the symbol table, and the
// link is faster (the coordinator's test binary under -race: 9.7 s → 6.2 s).
func BuildArgs(dir string, pkgs ...string) []string {
	args := []string{"build", "-buildvcs=false", "-ldflags=-w", "-o", dir + string(filepath.Separator)}
	if Race {
		args = append(args, "-race")
	}
	return append(args, pkgs...)
}

// Build builds pkgs (package paths relative to the module root, e.g.
// ./cmd/coordinator) into dir with BuildArgs, or fails the test with the
// go command's output. It fails where the go tool is not on PATH.
func Build(t testing.TB, dir string, pkgs ...string) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is not on PATH, cannot build %s: %v", strings.Join(pkgs, " "), err)
	}
	args := BuildArgs(dir, pkgs...)
	cmd := exec.CommandContext(context.Background(), goTool, args...)
	cmd.Dir = Root(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
