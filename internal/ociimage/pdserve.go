package ociimage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// LlamaLibDir is where the worker images hold llama.cpp's libraries; the
// images set PDSERVE_LLAMA_LIB to it, and the chart's image.llamacpp.libDir
// says the same.
const LlamaLibDir = "/opt/pdserve/llama/lib"

// PdserveImageNames are pdserve's images, in build order.
var PdserveImageNames = []string{"coordinator", "prefill-worker", "decode-worker", "loadtest", "worker-cpu", "worker-cuda"}

// PdserveOptions are the inputs of pdserve's images.
type PdserveOptions struct {
	// Registry is the repository prefix of the names, e.g. ghcr.io/pdserve.
	Registry string
	// Version is the tag and org.opencontainers.image.version (the chart's
	// appVersion).
	Version string
	// Revision is the commit, for org.opencontainers.image.revision ("":
	// no label).
	Revision string
	// Source is org.opencontainers.image.source.
	Source string
	// LicenseFile is pdserve's LICENSE (the repository root's), copied
	// into every image as /usr/share/doc/pdserve/LICENSE.
	LicenseFile string
	// BinDir holds the binaries coordinator, prefill-worker, decode-worker
	// and loadtest (CGO_ENABLED=0, -trimpath).
	BinDir string
	// LlamaCPULib is the prebuilt CPU llama.cpp (what `make llama`
	// installs in third_party/llama/lib).
	LlamaCPULib string
	// LlamaLicense is llama.cpp's LICENSE file (third_party/llama/src/LICENSE),
	// copied into the worker images.
	LlamaLicense string
	// CacheDir holds downloaded packages (see CacheDir).
	CacheDir string
	// Created: see Spec.Created.
	Created time.Time
	// Logf, if set, is told about downloads.
	Logf func(string, ...any)
}

// PdserveImage is one of pdserve's images: its spec, and the libraries its
// ELF check lets be absent (the driver's, mounted at run time).
type PdserveImage struct {
	Name         string
	Spec         Spec
	AllowMissing []string
}

// ErrMissingPart is returned (wrapped) when a part of an image cannot be
// had on this machine: a binary not built, the CPU llama.cpp not
// installed, or a package that cannot be fetched (see ErrFetch).
var ErrMissingPart = errors.New("ociimage: missing part")

// PdserveLicense is pdserve's licence (SPDX), the repository's LICENSE: it
// leads every image's org.opencontainers.image.licenses, joined by AND with
// the licences of the third-party parts the image holds.
const PdserveLicense = "Apache-2.0"

// PdserveImage returns the spec of the named image (see
// PdserveImageNames). What each holds, above the glibc base, runs as
// 65532:65532 and writes nothing outside /tmp and /home/nonroot:
//
//	coordinator     /usr/local/bin/coordinator (entrypoint), port 8080
//	prefill-worker  /usr/local/bin/prefill-worker (entrypoint), 9000 and 9090
//	decode-worker   /usr/local/bin/decode-worker (entrypoint), 9000 and 9090
//	loadtest        /usr/local/bin/pdserve-loadtest (entrypoint)
//	worker-cpu      the three binaries and the prebuilt CPU llama.cpp in
//	                /opt/pdserve/llama/lib (PDSERVE_LLAMA_LIB); no
//	                entrypoint: the chart names the binary; 8080, 9000, 9090
//	worker-cuda     the same with the CUDA build of llama.cpp (its CUDA 12
//	                backend) and the CUDA 12 runtime (libcudart, libcublas,
//	                libcublasLt) from Debian's non-free packages;
//	                PDSERVE_LLAMA_DEVICE=gpu, so a worker without a GPU
//	                refuses to start (--llama-device cpu overrides);
//	                libcuda.so.1 comes from the node's driver
//
// Each image holds pdserve's LICENSE in /usr/share/doc/pdserve, and its
// org.opencontainers.image.licenses label is PdserveLicense AND the
// licences of its third-party parts. Each binary, the llama.cpp directory,
// the CUDA runtime and the LICENSE is a layer of its own, so images that share one share its digest. Errors wrap
// ErrMissingPart or ErrFetch.
func (o PdserveOptions) PdserveImage(ctx context.Context, base *Tree, name string) (*PdserveImage, error) {
	labels := map[string]string{
		"org.opencontainers.image.title":   name,
		"org.opencontainers.image.version": o.Version,
		"org.opencontainers.image.source":  o.Source,
		"org.opencontainers.image.vendor":  "pdserve",
	}
	if o.Revision != "" {
		labels["org.opencontainers.image.revision"] = o.Revision
	}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	img := &PdserveImage{Name: name, Spec: Spec{
		Ref: strings.TrimSuffix(o.Registry, "/") + "/" + name + ":" + o.Version,
		OS:  "linux", Architecture: "amd64",
		User:    fmt.Sprintf("%d:%d", NonRootUID, NonRootUID),
		Created: o.Created,
		Layers:  []Layer{{Tree: base, CreatedBy: "pdserve glibc base (" + BaseDescription() + ")"}},
	}}
	lt := NewTree()
	if err := lt.AddHost(o.LicenseFile, "/usr/share/doc/pdserve/LICENSE", AddOptions{}); err != nil {
		return nil, fmt.Errorf("%w: %s: pdserve's licence: %v", ErrMissingPart, name, err)
	}
	img.Spec.Layers = append(img.Spec.Layers, Layer{Tree: lt, CreatedBy: "COPY LICENSE /usr/share/doc/pdserve/"})
	third := []string{"LGPL-2.1-or-later", "GPL-3.0-or-later WITH GCC-exception-3.1", "MPL-2.0"} // glibc; libstdc++, libgcc; CA certificates
	bin := func(file, dst string) error {
		src := filepath.Join(o.BinDir, file)
		if _, err := os.Stat(src); err != nil {
			return fmt.Errorf("%w: %s: the binary %s is not built (make images builds it): %v", ErrMissingPart, name, file, err)
		}
		t := NewTree()
		if err := t.AddHost(src, dst, AddOptions{}); err != nil {
			return err
		}
		img.Spec.Layers = append(img.Spec.Layers, Layer{Tree: t, CreatedBy: "COPY " + file + " " + dst})
		return nil
	}
	workers := func() error {
		for _, b := range []string{"coordinator", "prefill-worker", "decode-worker"} {
			if err := bin(b, "/usr/local/bin/"+b); err != nil {
				return err
			}
		}
		env = append(env, "PDSERVE_LLAMA_LIB="+LlamaLibDir)
		img.Spec.ExposedPorts = []string{"8080", "9000", "9090"}
		third = append(third, "MIT") // llama.cpp
		t := NewTree()
		if err := t.AddHost(o.LlamaLicense, "/usr/share/doc/llama.cpp/LICENSE", AddOptions{}); err != nil {
			return fmt.Errorf("%w: %s: llama.cpp's licence: %v (run make llama)", ErrMissingPart, name, err)
		}
		img.Spec.Layers = append(img.Spec.Layers, Layer{Tree: t, CreatedBy: "COPY llama.cpp LICENSE /usr/share/doc/llama.cpp/"})
		return nil
	}
	switch name {
	case "coordinator", "prefill-worker", "decode-worker":
		if err := bin(name, "/usr/local/bin/"+name); err != nil {
			return nil, err
		}
		img.Spec.Entrypoint = []string{"/usr/local/bin/" + name}
		img.Spec.ExposedPorts = []string{"9000", "9090"}
		if name == "coordinator" {
			img.Spec.ExposedPorts = []string{"8080"}
		}
	case "loadtest":
		if err := bin("loadtest", "/usr/local/bin/pdserve-loadtest"); err != nil {
			return nil, err
		}
		img.Spec.Entrypoint = []string{"/usr/local/bin/pdserve-loadtest"}
	case "worker-cpu":
		if ents, err := filepath.Glob(filepath.Join(o.LlamaCPULib, "libllama*.so")); err != nil || len(ents) == 0 {
			return nil, fmt.Errorf("%w: %s: no llama.cpp libraries in %s (run make llama)", ErrMissingPart, name, o.LlamaCPULib)
		}
		t := NewTree()
		if err := t.AddHost(o.LlamaCPULib, LlamaLibDir, AddOptions{}); err != nil {
			return nil, err
		}
		img.Spec.Layers = append(img.Spec.Layers, Layer{Tree: t, CreatedBy: "COPY llama.cpp (node-llama-cpp linux-x64, CPU) " + LlamaLibDir})
		if err := workers(); err != nil {
			return nil, err
		}
	case "worker-cuda":
		lock, err := DebianLock()
		if err != nil {
			return nil, err
		}
		debs, err := FetchDebs(ctx, o.CacheDir, lock.Set("cuda"), o.Logf)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: the CUDA runtime: %w", ErrMissingPart, name, err)
		}
		cuda := NewTree()
		if err := AddDebs(cuda, debs); err != nil {
			return nil, err
		}
		var names []string
		for _, d := range debs {
			names = append(names, d.Package+" "+d.Version)
		}
		img.Spec.Layers = append(img.Spec.Layers, Layer{Tree: cuda, CreatedBy: "CUDA runtime (" + strings.Join(names, ", ") + ")"})
		llama, err := o.cudaLlama(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrMissingPart, name, err)
		}
		img.Spec.Layers = append(img.Spec.Layers, Layer{Tree: llama, CreatedBy: "COPY llama.cpp (node-llama-cpp linux-x64-cuda, CUDA 12 backend) " + LlamaLibDir})
		if err := workers(); err != nil {
			return nil, err
		}
		// The NVIDIA container runtime mounts the driver where these ask
		// for it (as nvidia/cuda images set them).
		env = append(env, "PDSERVE_LLAMA_DEVICE=gpu", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
		third = append(third, "LicenseRef-NVIDIA-CUDA-EULA")
		img.AllowMissing = []string{"libcuda.so.1"}
	default:
		return nil, fmt.Errorf("ociimage: no pdserve image %q (images: %s)", name, strings.Join(PdserveImageNames, ", "))
	}
	img.Spec.Env = env
	labels["org.opencontainers.image.licenses"] = strings.Join(append([]string{PdserveLicense}, third...), " AND ")
	img.Spec.Labels = labels
	return img, nil
}

// cudaLlama is the tree of /opt/pdserve/llama/lib in worker-cuda: the
// libraries of the pinned linux-x64-cuda package but its CUDA 13 backend,
// and the CUDA 12 backend of linux-x64-cuda-ext in its place (the runtime
// to be had here is CUDA 12), and node-llama-cpp's licence (MIT).
func (o PdserveOptions) cudaLlama(ctx context.Context) (*Tree, error) {
	var dirs []string
	for _, n := range []string{"@node-llama-cpp/linux-x64-cuda", "@node-llama-cpp/linux-x64-cuda-ext"} {
		p, err := NpmPinned(n)
		if err != nil {
			return nil, err
		}
		d, err := FetchNpm(ctx, o.CacheDir, p, o.Logf)
		if err != nil {
			return nil, err
		}
		dirs = append(dirs, d)
	}
	bins := filepath.Join(dirs[0], "bins", "linux-x64-cuda")
	libs, err := filepath.Glob(filepath.Join(bins, "*.so"))
	if err != nil || len(libs) == 0 {
		return nil, fmt.Errorf("no libraries in %s", bins)
	}
	slices.Sort(libs)
	t := NewTree()
	for _, l := range libs {
		if filepath.Base(l) == "libggml-cuda.so" {
			continue // CUDA 13
		}
		if err := t.AddHost(l, LlamaLibDir+"/", AddOptions{}); err != nil {
			return nil, err
		}
	}
	fallback := filepath.Join(dirs[1], "bins", "linux-x64-cuda", "fallback", "libggml-cuda.so")
	if err := t.AddHost(fallback, LlamaLibDir+"/libggml-cuda.so", AddOptions{}); err != nil {
		return nil, err
	}
	if err := t.AddHost(filepath.Join(dirs[0], "LICENSE"), "/usr/share/doc/node-llama-cpp/LICENSE", AddOptions{}); err != nil {
		return nil, err
	}
	return t, nil
}
