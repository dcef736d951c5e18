package k8slab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// labImage is an image the lab builds with cmd/mkimage from one static
// binary.
type labImage struct {
	file string // tarball under images/
	ref  string
	bin  string   // the binary: a built path, or a main package to build
	pkg  string   // main package (relative to Repo) when bin is to be built
	args []string // extra mkimage flags
}

func (l *Lab) labImages() []labImage {
	return []labImage{
		{file: "pause.tar", ref: PauseImage, pkg: "./internal/k8slab/pause",
			args: []string{"--add", "@:/pause", "--entrypoint", "/pause", "--user", "65535:65535"}},
		{file: "probe.tar", ref: ProbeImage, pkg: "./internal/k8slab/probe",
			args: []string{"--add", "@:/probe", "--entrypoint", "/probe", "--user", "65532:65532"}},
		{file: "coredns.tar", ref: CoreDNSImage + l.opt.CoreDNS, bin: l.bins.Path("coredns"),
			args: []string{"--add", "@:/coredns", "--entrypoint", "/coredns", "--user", "65532:65532", "--expose", "53/udp", "--expose", "53/tcp"}},
	}
}

// buildImages writes the pause, probe and CoreDNS image tarballs with
// cmd/mkimage (built from this repository) unless they exist and are
// newer than the binary they hold.
func (l *Lab) buildImages(ctx context.Context) error {
	if !exists(filepath.Join(l.opt.Repo, "cmd", "mkimage")) {
		return fmt.Errorf("k8slab: images: cmd/mkimage is not in this tree yet; the lab's pause and CoreDNS images are built with it")
	}
	dir := l.p("images")
	mkimage := filepath.Join(dir, "mkimage")
	if err := l.goBuild(ctx, mkimage, "./cmd/mkimage"); err != nil {
		return err
	}
	for _, im := range l.labImages() {
		out := filepath.Join(dir, im.file)
		if exists(out) && !newer(im.bin, out) {
			continue
		}
		bin := im.bin
		if im.pkg != "" {
			bin = filepath.Join(dir, strings.TrimSuffix(im.file, ".tar"))
			if err := l.goBuild(ctx, bin, im.pkg); err != nil {
				return err
			}
		}
		args := []string{"--out", out + ".tmp", "--ref", im.ref, "--base", "none"}
		for _, a := range im.args {
			args = append(args, strings.ReplaceAll(a, "@", bin))
		}
		cmd := exec.CommandContext(ctx, mkimage, args...)
		if o, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("k8slab: images: mkimage %s: %w\n%s", im.ref, err, o)
		}
		if err := os.Rename(out+".tmp", out); err != nil {
			return fmt.Errorf("k8slab: images: %w", err)
		}
	}
	return nil
}

// newer reports whether file bin (none when "") changed after file out
// was written: a rebuilt CoreDNS (another build recipe) gets a new image.
func newer(bin, out string) bool {
	if bin == "" {
		return false
	}
	b, errB := os.Stat(bin)
	o, errO := os.Stat(out)
	return errB == nil && errO == nil && b.ModTime().After(o.ModTime())
}

// goBuild builds a static binary of this repository's package pkg.
func (l *Lab) goBuild(ctx context.Context, out, pkg string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-gcflags=all=-dwarf=false", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = l.opt.Repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("k8slab: go build %s: %w\n%s", pkg, err, o)
	}
	return nil
}

// importImages imports the lab's images and every tarball in bin/images
// (make images) into the node's containerd (namespace k8s.io, where the
// CRI looks), skipping a tarball already imported with the same size and
// modification time.
func (l *Lab) importImages() error {
	var tars []string
	for _, im := range l.labImages() {
		tars = append(tars, l.p("images/"+im.file))
	}
	more, _ := filepath.Glob(filepath.Join(l.opt.Repo, "bin", "images", "*.tar"))
	tars = append(tars, more...)
	for _, t := range tars {
		st, err := os.Stat(t)
		if err != nil {
			return fmt.Errorf("k8slab: import: %w", err)
		}
		stamp := l.p("images/imported-" + strings.ReplaceAll(strings.TrimPrefix(t, "/"), "/", "_"))
		want := fmt.Sprintf("%d %d", st.Size(), st.ModTime().UnixNano())
		if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
			continue
		}
		out, err := l.ctr("images", "import", t).CombinedOutput()
		if err != nil {
			return fmt.Errorf("k8slab: ctr images import %s: %w: %s", t, err, strings.TrimSpace(string(out)))
		}
		l.logf("imported %s: %s", filepath.Base(t), strings.TrimSpace(string(out)))
		if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
			return fmt.Errorf("k8slab: import: %w", err)
		}
	}
	return nil
}
