package ociimage

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// PdserveBinaries are the packages of the images' binaries, relative to
// the module root; go build names them coordinator, prefill-worker,
// decode-worker and loadtest.
var PdserveBinaries = []string{"./cmd/coordinator", "./cmd/prefill-worker", "./cmd/decode-worker", "./loadtest"}

// BuildBinaries compiles PdserveBinaries of the module at root into dir
// for linux/amd64 as the images want them: CGO_ENABLED=0 (llama.cpp is
// loaded at run time through purego, which still links them dynamically
// against glibc), -trimpath and -ldflags=-s -w, so that the same commit
// gives the same bytes; -gcflags=all=-dwarf=false, since the linker's -w
// drops the DWARF the compiler would write. GOFLAGS from the environment
// apply (CI's -buildvcs=false leaves the VCS stamp out; .ci/run sets the
// same -trimpath and -gcflags, so that go vet and the other builds of CI
// compile the packages once for all of them).
func BuildBinaries(ctx context.Context, root, dir string) error {
	args := append([]string{"build", "-trimpath", "-gcflags=all=-dwarf=false", "-ldflags=-s -w", "-o", dir + string(filepath.Separator)}, PdserveBinaries...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ociimage: go build: %v\n%s", err, bytes.TrimSpace(out))
	}
	return nil
}

// ChartAppVersion reads appVersion from the chart at root
// (helm/pdserve/Chart.yaml): the images' tag.
func ChartAppVersion(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "helm", "pdserve", "Chart.yaml"))
	if err != nil {
		return "", fmt.Errorf("ociimage: chart: %w", err)
	}
	var c struct {
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil || c.AppVersion == "" {
		return "", fmt.Errorf("ociimage: helm/pdserve/Chart.yaml: no appVersion (%v)", err)
	}
	return c.AppVersion, nil
}

// GitRevision returns HEAD's commit and its committer time in the
// repository at root; "" and the epoch where git or the repository is
// missing.
func GitRevision(ctx context.Context, root string) (string, time.Time) {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "log", "-1", "--format=%H %ct").Output()
	if err != nil {
		return "", epoch
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return "", epoch
	}
	sec, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return f[0], epoch
	}
	return f[0], time.Unix(sec, 0).UTC()
}
