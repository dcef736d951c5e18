package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/internal/ociimage"
)

// layerCacheBytes bounds the layer cache: a bit over two full sets of
// layers (the CUDA image's are about 560 MiB).
const layerCacheBytes = 2 << 30

// pdserveCmd builds pdserve's images (make images): the binaries from the
// module at --root, then one tarball per image in --out-dir, each checked
// with CheckELF. An image whose parts cannot be had here is reported
// by name and reason; the others are still written, and the exit code is
// then 1.
func pdserveCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mkimage pdserve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	outDir := fs.String("out-dir", "bin/images", "directory of the tarballs, NAME.tar each, and of images.txt (NAME REF DIGEST BYTES per line)")
	only := fs.String("only", "", "comma-separated images to build (default all: "+strings.Join(ociimage.PdserveImageNames, ",")+")")
	root := fs.String("root", ".", "the module root (go.mod, LICENSE, helm/pdserve/Chart.yaml, third_party/llama)")
	binDir := fs.String("bin-dir", "", "take the binaries from this directory instead of building them (coordinator, prefill-worker, decode-worker, loadtest)")
	registry := fs.String("registry", "ghcr.io/pdserve", "repository prefix of the image names (the chart's image.registry default)")
	version := fs.String("version", "", "tag and org.opencontainers.image.version (default: appVersion of helm/pdserve/Chart.yaml)")
	revision := fs.String("revision", "", "org.opencontainers.image.revision (default: git HEAD)")
	source := fs.String("source", "https://github.com/pdserve/pdserve", "org.opencontainers.image.source")
	sde := fs.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "seconds since 1970 for every timestamp (default $SOURCE_DATE_EPOCH, else HEAD's commit time)")
	cache := fs.String("cache", "", "directory of downloaded packages and of compressed layers kept for reuse (the least recently used go beyond 2 GiB) (default $XDG_CACHE_HOME/pdserve or ~/.cache/pdserve)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: mkimage pdserve [flags]

Builds pdserve's images as OCI tarballs: coordinator, prefill-worker,
decode-worker, loadtest, worker-cpu (the three binaries and the CPU llama.cpp
of make llama) and worker-cuda (the same with the CUDA build of llama.cpp and
the CUDA 12 runtime from Debian's non-free packages). The same commit gives the
same digests. See docs/images.md.

Flags:
`)
		fs.PrintDefaults()
	}
	if code, ok := cliflags.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	names := ociimage.PdserveImageNames
	if *only != "" {
		names = strings.Split(*only, ",")
		for _, n := range names {
			if !slices.Contains(ociimage.PdserveImageNames, n) {
				cliflags.PrintError(stderr, "mkimage pdserve", cliflags.BadFlag("only", *only, fmt.Errorf("no image %q (images: %s)", n, strings.Join(ociimage.PdserveImageNames, ", "))))
				return 2
			}
		}
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "mkimage pdserve:", err)
		return 1
	}
	logf := func(f string, a ...any) { fmt.Fprintf(stderr, "mkimage pdserve: "+f+"\n", a...) }

	rev, commitTime := ociimage.GitRevision(ctx, *root)
	if *revision != "" {
		rev = *revision
	}
	created := commitTime
	if *sde != "" {
		t, err := parseEpoch(*sde)
		if err != nil {
			cliflags.PrintError(stderr, "mkimage pdserve", cliflags.BadFlag("source-date-epoch", *sde, err))
			return 2
		}
		created = t
	}
	if *version == "" {
		v, err := ociimage.ChartAppVersion(*root)
		if err != nil {
			return fail(err)
		}
		*version = v
	}
	if *cache == "" {
		d, err := ociimage.CacheDir()
		if err != nil {
			return fail(err)
		}
		*cache = d
	}
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		return fail(err)
	}
	tmp, err := os.MkdirTemp(*outDir, ".mkimage-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmp)
	if *binDir == "" {
		*binDir = filepath.Join(tmp, "bin")
		logf("go build -trimpath (CGO_ENABLED=0) %s", strings.Join(ociimage.PdserveBinaries, " "))
		if err := ociimage.BuildBinaries(ctx, *root, *binDir); err != nil {
			return fail(err)
		}
	}
	base, err := ociimage.GlibcBase(ctx, *cache, logf)
	if err != nil {
		return fail(err)
	}
	o := ociimage.PdserveOptions{
		Registry: *registry, Version: *version, Revision: rev, Source: *source, LicenseFile: filepath.Join(*root, "LICENSE"),
		BinDir: *binDir, LlamaCPULib: filepath.Join(*root, "third_party", "llama", "lib"),
		LlamaLicense: filepath.Join(*root, "third_party", "llama", "src", "LICENSE"),
		CacheDir:     *cache, Created: created, Logf: logf,
	}
	layers := filepath.Join(*cache, "layers")
	ociimage.PruneLayerCache(layers, layerCacheBytes)
	var index []string
	var missing []string
	for _, n := range names {
		img, err := o.PdserveImage(ctx, base, n)
		if errors.Is(err, ociimage.ErrMissingPart) {
			missing = append(missing, fmt.Sprintf("%s: %v", n, err))
			fmt.Fprintf(stderr, "mkimage pdserve: NOT BUILT %s: %v\n", n, err)
			continue
		}
		if err != nil {
			return fail(err)
		}
		trees := make([]*ociimage.Tree, len(img.Spec.Layers))
		for i, l := range img.Spec.Layers {
			trees[i] = l.Tree
		}
		rep, err := ociimage.CheckELF(trees, img.Spec.Env, img.AllowMissing)
		if err != nil {
			return fail(err)
		}
		if len(rep.Unresolved) > 0 {
			for _, u := range rep.Unresolved {
				fmt.Fprintf(stderr, "mkimage pdserve: %s: %s, which the image lacks\n", n, u)
			}
			return fail(fmt.Errorf("%s: %d unresolved ELF dependencies", n, len(rep.Unresolved)))
		}
		allowed := map[string]int{}
		for _, u := range rep.Allowed {
			allowed[u.Need]++
		}
		for _, lib := range slices.Sorted(maps.Keys(allowed)) {
			fmt.Fprintf(stderr, "mkimage pdserve: %s: %s is left to the node (%d files need it): the NVIDIA container runtime mounts the driver's\n", n, lib, allowed[lib])
		}
		out := filepath.Join(*outDir, n+".tar")
		dir, err := os.MkdirTemp(tmp, n+"-")
		if err != nil {
			return fail(err)
		}
		img.Spec.LayerCache = layers
		b, err := ociimage.Build(img.Spec, dir)
		if err != nil {
			return fail(err)
		}
		d, err := ociimage.WriteArchive(out, b)
		if err != nil {
			return fail(err)
		}
		os.RemoveAll(dir)
		fi, err := os.Stat(out)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "%-40s %-45s %s %10s  (%d ELF files checked)\n", out, img.Spec.Ref, d, humanBytes(fi.Size()), rep.Checked)
		index = append(index, fmt.Sprintf("%s %s %s %d", n, img.Spec.Ref, d, fi.Size()))
	}
	if err := os.WriteFile(filepath.Join(*outDir, "images.txt"), []byte(strings.Join(index, "\n")+"\n"), 0o644); err != nil {
		return fail(err)
	}
	if len(missing) > 0 {
		fmt.Fprintf(stderr, "mkimage pdserve: %d image(s) NOT BUILT (the others are in %s):\n", len(missing), *outDir)
		for _, m := range missing {
			fmt.Fprintln(stderr, "  "+m)
		}
		return 1
	}
	return 0
}
