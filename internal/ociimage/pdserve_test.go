package ociimage

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/gguf"
)

// EnvImagesDir names the directory of `make images`' tarballs that
// TestPdserveImages checks (.ci/run sets it after make images).
const EnvImagesDir = "PDSERVE_IMAGES_DIR"

// TestPdserveImages checks the tarballs `make images` wrote into
// $PDSERVE_IMAGES_DIR: each image's name, config (user 65532, labels,
// entrypoint, env, ports), that its layers write only where expected,
// that every ELF file finds its interpreter and libraries inside the image
// (libcuda.so.1 excepted in worker-cuda: the driver's), and that it runs:
// every binary's --version, the image's loader listing every llama.cpp
// library, and in the worker images a prefill worker on a tiny GGUF — the
// CPU image serving with llama.cpp's default devices; the CUDA image,
// which requires a GPU by default, saying in one line that there is none
// and exiting 1, and serving with --llama-device cpu.
func TestPdserveImages(t *testing.T) {
	dir := os.Getenv(EnvImagesDir)
	if dir == "" {
		t.Skipf("$%s is not set: .ci/run sets it after make images (make images && %s=bin/images go test -run TestPdserveImages ./internal/ociimage)", EnvImagesDir, EnvImagesDir)
	}
	root := repotest.Root(t)
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root, dir)
	}
	version, err := ChartAppVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	_, vocab := repotest.Llama(t)
	for _, n := range PdserveImageNames {
		t.Run(n, func(t *testing.T) {
			p := filepath.Join(dir, n+".tar")
			if _, err := os.Stat(p); err != nil {
				needOrSkip(t, n+" was not built", err)
			}
			img, ref, err := ReadArchive(p, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			checkPdserveConfig(t, n, ref, version, img)
			checkLayers(t, img)
			rootfs := t.TempDir()
			if err := Unpack(img, rootfs); err != nil {
				t.Fatal(err)
			}
			cf, _ := img.ConfigFile()
			fsys := NewTree()
			if err := fsys.AddHost(rootfs, "/", AddOptions{}); err != nil {
				t.Fatal(err)
			}
			var allow []string
			if n == "worker-cuda" {
				allow = []string{"libcuda.so.1"}
			}
			rep, err := CheckELF([]*Tree{fsys}, cf.Config.Env, allow)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Unresolved) > 0 {
				t.Errorf("unresolved in the unpacked image: %v", rep.Unresolved)
			}
			r := newRunner(t, rootfs, cf.Config.Env)
			bins := map[string][]string{
				"coordinator": {"coordinator"}, "prefill-worker": {"prefill-worker"}, "decode-worker": {"decode-worker"},
				"loadtest": {"pdserve-loadtest"},
			}[n]
			if strings.HasPrefix(n, "worker-") {
				bins = []string{"coordinator", "prefill-worker", "decode-worker"}
			}
			for _, b := range bins {
				out, err := r.command(context.Background(), "/usr/local/bin/"+b, "--version").CombinedOutput()
				if err != nil || !strings.Contains(string(out), "go1.") {
					t.Errorf("%s --version: %v\n%s", b, err, out)
				}
			}
			if !strings.HasPrefix(n, "worker-") {
				return
			}
			libs, _ := filepath.Glob(filepath.Join(rootfs, LlamaLibDir, "*.so"))
			if n == "worker-cuda" {
				cuda, _ := filepath.Glob(filepath.Join(rootfs, "usr/lib/x86_64-linux-gnu/libcu*.so.*"))
				libs = append(libs, cuda...)
			}
			if len(libs) < 5 {
				t.Fatalf("%d llama.cpp libraries in %s", len(libs), LlamaLibDir)
			}
			// The loader stops listing at the first library it cannot find:
			// a stand-in for the driver's libcuda.so.1 (which the NVIDIA
			// container runtime mounts) lets it list the rest.
			var stub []string
			if n == "worker-cuda" {
				d := filepath.Join(r.root, "tmp", "driver-stub")
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(filepath.Join(rootfs, "lib/x86_64-linux-gnu/libdl.so.2"))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(d, "libcuda.so.1"), b, 0o644); err != nil {
					t.Fatal(err)
				}
				stub = []string{"/tmp/driver-stub"}
			}
			for _, l := range libs {
				rel := "/" + strings.TrimPrefix(l, rootfs+"/")
				out := r.list(t, rel, stub...)
				for _, line := range strings.Split(out, "\n") {
					if strings.Contains(line, "not found") && !strings.Contains(line, "libcuda.so.1") {
						t.Errorf("ld.so --list %s: %s", rel, strings.TrimSpace(line))
					}
				}
				if n == "worker-cuda" && strings.HasSuffix(rel, "/libggml-cuda.so") {
					for _, need := range []string{"libcudart.so.12 => ", "libcublas.so.12 => ", "libcublasLt.so.12 => "} {
						if !strings.Contains(out, need) {
							t.Errorf("ld.so --list libggml-cuda.so lacks %q:\n%s", need, out)
						}
					}
				}
			}
			model := filepath.Join(r.root, "tmp", "m.gguf")
			if err := gguf.WriteRandom(model, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
				Layers: 1, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 64, Type: gguf.F32, Seed: 1}); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(model, 0o644); err != nil {
				t.Fatal(err)
			}
			modelPath := "/tmp/m.gguf"
			if !r.chroot {
				modelPath = model
			}
			worker := []string{"--engine=llamacpp", "--model=" + modelPath, "--ctx-size=64", "--grpc-addr=127.0.0.1:0", "--metrics-addr=127.0.0.1:0"}
			if !r.chroot {
				worker = append(worker, "--llama-lib="+filepath.Join(rootfs, LlamaLibDir))
			}
			if n == "worker-cuda" {
				// PDSERVE_LLAMA_DEVICE=gpu from the image: no GPU here.
				cmd := r.command(context.Background(), "/usr/local/bin/prefill-worker", worker...)
				var stderr strings.Builder
				cmd.Stderr = &stderr
				err := cmd.Run()
				ee, ok := err.(*exec.ExitError)
				lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
				last := lines[len(lines)-1]
				if !ok || ee.ExitCode() != 1 || !strings.HasPrefix(last, "prefill-worker: no GPU: llama.cpp (") {
					t.Errorf("worker-cuda on a machine without a GPU: %v, last line %q; want exit 1 and 'prefill-worker: no GPU: …'", err, last)
				}
				t.Logf("worker-cuda without a GPU says: %s", last)
				worker = append(worker, "--llama-device=cpu")
			}
			serveUntilStarted(t, r, worker)
		})
	}
}

// serveUntilStarted starts the image's prefill worker with args, waits
// for its "worker started" log line, stops it with SIGTERM and expects a
// clean exit.
func serveUntilStarted(t *testing.T, r *runner, args []string) {
	t.Helper()
	cmd := r.command(context.Background(), "/usr/local/bin/prefill-worker", args...)
	out := newLockedBuffer()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	poll.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		select {
		case err := <-done:
			t.Fatalf("prefill-worker %v exited before it started: %v\n%s", args, err, out.String())
		default:
		}
		if !strings.Contains(out.String(), `"msg":"worker started"`) {
			return errString("no worker started line yet")
		}
		return nil
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("prefill-worker stopped with %v:\n%s", err, out.String())
	}
}

// TestPdserveImageLicense: an image carries the repository's LICENSE and
// a licences label led by PdserveLicense, never NOASSERTION; without the
// LICENSE it is not built.
func TestPdserveImageLicense(t *testing.T) {
	root := repotest.Root(t)
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "loadtest"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := PdserveOptions{Registry: "r", Version: "v", Source: "s", BinDir: bin, LicenseFile: filepath.Join(root, "LICENSE")}
	img, err := o.PdserveImage(context.Background(), NewTree(), "loadtest")
	if err != nil {
		t.Fatal(err)
	}
	want := "Apache-2.0 AND LGPL-2.1-or-later AND GPL-3.0-or-later WITH GCC-exception-3.1 AND MPL-2.0"
	if got := img.Spec.Labels["org.opencontainers.image.licenses"]; got != want {
		t.Errorf("licenses label %q, want %q", got, want)
	}
	var has bool
	for _, l := range img.Spec.Layers {
		has = has || l.Tree.Has("/usr/share/doc/pdserve/LICENSE")
	}
	if !has {
		t.Errorf("no layer holds /usr/share/doc/pdserve/LICENSE")
	}
	lic, err := os.ReadFile(o.LicenseFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(lic), "Apache License") || !strings.Contains(string(lic), "Version 2.0, January 2004") {
		t.Errorf("%s is not the Apache License 2.0", o.LicenseFile)
	}
	o.LicenseFile = filepath.Join(t.TempDir(), "LICENSE")
	if _, err := o.PdserveImage(context.Background(), NewTree(), "loadtest"); !errors.Is(err, ErrMissingPart) {
		t.Errorf("without a LICENSE: %v, want ErrMissingPart", err)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// checkPdserveConfig checks name, user, labels, entrypoint, env and ports.
func checkPdserveConfig(t *testing.T, n, ref, version string, img v1.Image) {
	t.Helper()
	if want := "ghcr.io/pdserve/" + n + ":" + version; ref != want && !strings.HasSuffix(ref, "/"+n+":"+version) {
		t.Errorf("name %q, want %q (or another registry)", ref, want)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("user %q platform %s/%s, want 65532:65532 linux/amd64", c.User, cf.OS, cf.Architecture)
	}
	for _, l := range []string{"source", "version", "licenses", "title"} {
		if c.Labels["org.opencontainers.image."+l] == "" {
			t.Errorf("no label org.opencontainers.image.%s: %v", l, c.Labels)
		}
	}
	if lic := c.Labels["org.opencontainers.image.licenses"]; !strings.HasPrefix(lic, PdserveLicense+" AND ") {
		t.Errorf("label org.opencontainers.image.licenses %q, want %s AND the third-party parts'", lic, PdserveLicense)
	}
	if c.Labels["org.opencontainers.image.version"] != version || c.Labels["org.opencontainers.image.title"] != n {
		t.Errorf("labels %v: want version %s, title %s", c.Labels, version, n)
	}
	entry := map[string]string{"coordinator": "/usr/local/bin/coordinator", "prefill-worker": "/usr/local/bin/prefill-worker",
		"decode-worker": "/usr/local/bin/decode-worker", "loadtest": "/usr/local/bin/pdserve-loadtest"}[n]
	if got := strings.Join(c.Entrypoint, " "); got != entry {
		t.Errorf("entrypoint %q, want %q", got, entry)
	}
	ports := slices.Sorted(maps.Keys(c.ExposedPorts))
	wantPorts := map[string][]string{"coordinator": {"8080/tcp"}, "prefill-worker": {"9000/tcp", "9090/tcp"},
		"decode-worker": {"9000/tcp", "9090/tcp"}, "worker-cpu": {"8080/tcp", "9000/tcp", "9090/tcp"},
		"worker-cuda": {"8080/tcp", "9000/tcp", "9090/tcp"}}[n]
	if diff := cmp.Diff(wantPorts, ports); diff != "" {
		t.Errorf("exposed ports (-want +got):\n%s", diff)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		k, v, _ := strings.Cut(e, "=")
		env[k] = v
	}
	if strings.HasPrefix(n, "worker-") && env["PDSERVE_LLAMA_LIB"] != LlamaLibDir {
		t.Errorf("env %v: want PDSERVE_LLAMA_LIB=%s", c.Env, LlamaLibDir)
	}
	if wantDev := map[bool]string{true: "gpu"}[n == "worker-cuda"]; env["PDSERVE_LLAMA_DEVICE"] != wantDev {
		t.Errorf("env %v: PDSERVE_LLAMA_DEVICE %q, want %q", c.Env, env["PDSERVE_LLAMA_DEVICE"], wantDev)
	}
}
