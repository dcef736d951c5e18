package ociimage

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// needOrSkip skips the test for a missing outside dependency (apt-get,
// dpkg-deb, npm, a download), or fails it under CI=true: CI must exercise
// the image recipe, never skip it silently.
func needOrSkip(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: %v (CI=true: a missing dependency fails)", what, err)
	}
	t.Skipf("%s: %v", what, err)
}

// testCache is the package cache tests share with make images.
func testCache(t *testing.T) string {
	t.Helper()
	d, err := CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// testBase returns the glibc base, fetched (once per machine) into the
// user's cache.
func testBase(t *testing.T) *Tree {
	t.Helper()
	for _, tool := range []string{"apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			needOrSkip(t, "the glibc base needs "+tool, err)
		}
	}
	b, err := GlibcBase(context.Background(), testCache(t), t.Logf)
	if errors.Is(err, ErrFetch) {
		needOrSkip(t, "the glibc base", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// buildPurego compiles testdata/purego (linked like pdserve's binaries)
// into dir and returns its path.
func buildPurego(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "purego")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./testdata/purego")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build testdata/purego: %v\n%s", err, b)
	}
	return out
}

// runner runs programs of an unpacked image: under chroot as the image's
// user where the test runs as root, with the root file system mounted
// read-only (a read-only bind of the rootfs, a tmpfs on /tmp, as the
// chart's pods have), else through the image's own dynamic loader with
// --library-path pointed inside the image.
type runner struct {
	rootfs   string // the unpacked image
	root     string // where programs see "/": a read-only bind of rootfs, or rootfs
	chroot   bool
	readOnly bool
	uid, gid uint32
	env      []string
}

// newRunner prepares rootfs for running; the mounts are undone when the
// test ends.
func newRunner(t *testing.T, rootfs string, env []string) *runner {
	t.Helper()
	r := &runner{rootfs: rootfs, root: rootfs, uid: NonRootUID, gid: NonRootUID, env: env}
	if os.Geteuid() != 0 {
		t.Logf("not root: running programs through the image's loader, not under chroot")
		return r
	}
	r.chroot = true
	mnt := t.TempDir()
	if err := syscall.Mount(rootfs, mnt, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		t.Logf("bind mount: %v: running on a writable root", err)
		return r
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	if err := syscall.Mount("", mnt, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Logf("read-only remount: %v: running on a writable root", err)
		r.root = mnt
		return r
	}
	if err := syscall.Mount("tmpfs", filepath.Join(mnt, "tmp"), "tmpfs", 0, "mode=1777"); err != nil {
		t.Fatalf("tmpfs on /tmp: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(filepath.Join(mnt, "tmp"), syscall.MNT_DETACH) })
	r.root, r.readOnly = mnt, true
	return r
}

// command returns the command running the image's program prog (an
// absolute image path) with args.
func (r *runner) command(ctx context.Context, prog string, args ...string) *exec.Cmd {
	if r.chroot {
		cmd := exec.CommandContext(ctx, prog, args...)
		cmd.Path = prog
		cmd.Dir = "/"
		cmd.Env = r.env
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: r.root, Credential: &syscall.Credential{Uid: r.uid, Gid: r.gid}}
		return cmd
	}
	var libPath []string
	for _, d := range append(envLibPath(r.env), DefaultLibDirs...) {
		libPath = append(libPath, filepath.Join(r.root, d))
	}
	loader := filepath.Join(r.root, "lib64", "ld-linux-x86-64.so.2")
	cmd := exec.CommandContext(ctx, loader, append([]string{"--library-path", strings.Join(libPath, ":"), filepath.Join(r.root, prog)}, args...)...)
	cmd.Env = r.env
	return cmd
}

// list runs the image's loader with --list on the image file lib (as ldd
// does) and returns its output; extra are image directories searched
// first.
func (r *runner) list(t *testing.T, lib string, extra ...string) string {
	t.Helper()
	var cmd *exec.Cmd
	if r.chroot {
		cmd = r.command(context.Background(), "/lib64/ld-linux-x86-64.so.2", "--library-path", strings.Join(append(extra, envLibPath(r.env)...), ":"), "--list", lib)
	} else {
		var libPath []string
		for _, d := range append(append(extra, envLibPath(r.env)...), DefaultLibDirs...) {
			libPath = append(libPath, filepath.Join(r.root, d))
		}
		cmd = exec.Command(filepath.Join(r.root, "lib64", "ld-linux-x86-64.so.2"), "--library-path", strings.Join(libPath, ":"), "--list", filepath.Join(r.root, lib))
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // exit status 1 when something is not found: the output says what
	return out.String()
}

// envLibPath is LD_LIBRARY_PATH of env, as image paths.
func envLibPath(env []string) []string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "LD_LIBRARY_PATH="); ok {
			return strings.Split(v, ":")
		}
	}
	return nil
}

// lockedBuffer is a bytes.Buffer safe for a process's writes and the
// test's reads.
type lockedBuffer struct {
	mu chan struct{}
	b  bytes.Buffer
}

func newLockedBuffer() *lockedBuffer { return &lockedBuffer{mu: make(chan struct{}, 1)} }

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu <- struct{}{}
	defer func() { <-l.mu }()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu <- struct{}{}
	defer func() { <-l.mu }()
	return l.b.String()
}
