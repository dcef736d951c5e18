package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/internal/ociimage"
)

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// mkimage is the whole command after signal handling; args are the
// arguments without the program name. It returns the exit code: 0 after
// writing the image (or --help), 2 for bad flags, 1 when building failed
// (no partial file is left at --out).
func mkimage(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "pdserve":
			return pdserveCmd(ctx, args[1:], stdout, stderr)
		case "pin":
			return pinCmd(ctx, args[1:], stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "path of the image tarball to write (required)")
	ref := fs.String("ref", "", "the image's name, REPOSITORY:TAG, e.g. registry.k8s.io/pause:3.10 (required); give the registry host too, as containerd's CRI looks images up by their full name")
	base := fs.String("base", "glibc", "what goes underneath: glibc (Debian's glibc, libstdc++, libgcc, CA certificates, tzdata, /etc/passwd with user 65532, /tmp) or none (nothing: for static binaries)")
	var adds, cmdArgs, envs, labels, exposes, allow listFlag
	fs.Var(&adds, "add", "SRC:DST, repeatable, one layer each: the host file or directory SRC at the image path DST, as Docker's COPY (a file into DST/ when DST ends in '/', a directory's contents into DST); modes kept, owner root")
	entrypoint := fs.String("entrypoint", "", "absolute path of the program the image runs")
	fs.Var(&cmdArgs, "arg", "repeatable: a default argument (the image's Cmd), which a pod's args replace")
	user := fs.String("user", "65532:65532", "UID:GID the image runs as (0:0 for root)")
	fs.Var(&envs, "env", "K=V, repeatable: an environment variable (PATH defaults to "+ociimage.DefaultPath+")")
	fs.Var(&labels, "label", "K=V, repeatable: a label of the image config (org.opencontainers.image.source, .version, .revision, .licenses, .title, …)")
	workdir := fs.String("workdir", "", "absolute working directory (default /)")
	fs.Var(&exposes, "expose", "PORT[/tcp|udp|sctp], repeatable: a port the image listens on")
	platform := fs.String("platform", "linux/"+runtime.GOARCH, "OS/ARCH the image's files are for")
	sde := fs.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "the time of every file, the config and the history, in seconds since 1970 (default $SOURCE_DATE_EPOCH, else 0)")
	cache := fs.String("cache", "", "directory of downloaded packages (default $XDG_CACHE_HOME/pdserve or ~/.cache/pdserve)")
	checkELF := fs.Bool("check-elf", true, "fail unless every ELF file of the image finds its interpreter and libraries inside the image")
	fs.Var(&allow, "allow-missing", "repeatable: a library --check-elf lets be absent (e.g. libcuda.so.1, which the NVIDIA container runtime mounts)")
	cliflags.AddVersion(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: mkimage --out FILE.tar --ref NAME:TAG [--base glibc|none] --add SRC:DST... [flags]
       mkimage pdserve [--out-dir DIR] [--only NAMES]  pdserve's images (make images)
       mkimage pin                                     fresh debian.lock lines from apt

Builds an OCI image from files on this machine, with no container engine and
no registry, as a tar that is both an OCI image layout and a docker-archive:
ctr images import, skopeo copy oci-archive:FILE, crane push FILE, docker load
and podman load accept it. Each --add is one layer, above the base. Entries
are sorted and stamped with --source-date-epoch, so the same inputs give the
same digests.

Examples:
  mkimage --out pause.tar --ref registry.k8s.io/pause:3.10 --base none \
      --add ./pause:/pause --entrypoint /pause --user 65535:65535
  mkimage --out x.tar --ref example.com/x:1 --add bin/x:/usr/local/bin/ \
      --entrypoint /usr/local/bin/x --arg --listen --arg :8080 --expose 8080

Flags:
`)
		fs.PrintDefaults()
	}
	if code, ok := cliflags.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	var problems []error
	if *out == "" {
		problems = append(problems, errors.New("--out FILE.tar is required"))
	}
	if *ref == "" {
		problems = append(problems, errors.New("--ref NAME:TAG is required"))
	}
	if *base != "glibc" && *base != "none" {
		problems = append(problems, cliflags.BadFlag("base", *base, errors.New("want glibc or none")))
	}
	if *entrypoint != "" && !strings.HasPrefix(*entrypoint, "/") {
		problems = append(problems, cliflags.BadFlag("entrypoint", *entrypoint, errors.New("not an absolute path")))
	}
	osName, arch, ok := strings.Cut(*platform, "/")
	if !ok || osName == "" || arch == "" {
		problems = append(problems, cliflags.BadFlag("platform", *platform, errors.New("want OS/ARCH, e.g. linux/amd64")))
	}
	created, err := parseEpoch(*sde)
	if err != nil {
		problems = append(problems, cliflags.BadFlag("source-date-epoch", *sde, err))
	}
	labelMap := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			problems = append(problems, cliflags.BadFlag("label", l, errors.New("want K=V")))
			continue
		}
		labelMap[k] = v
	}
	for _, e := range envs {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			problems = append(problems, cliflags.BadFlag("env", e, errors.New("want K=V")))
		}
	}
	type addSpec struct{ src, dst string }
	var addList []addSpec
	for _, a := range adds {
		src, dst, ok := strings.Cut(a, ":")
		if !ok || src == "" || !strings.HasPrefix(dst, "/") {
			problems = append(problems, cliflags.BadFlag("add", a, errors.New("want SRC:DST, DST an absolute image path")))
			continue
		}
		if _, err := os.Lstat(src); err != nil {
			problems = append(problems, cliflags.BadFlag("add", a, err))
			continue
		}
		addList = append(addList, addSpec{src, dst})
	}
	if len(addList) == 0 && *base == "none" && len(problems) == 0 {
		problems = append(problems, errors.New("an image with --base none needs at least one --add"))
	}
	if len(problems) > 0 {
		cliflags.PrintError(stderr, "mkimage", errors.Join(problems...))
		return 2
	}

	spec := ociimage.Spec{
		Ref: *ref, OS: osName, Architecture: arch,
		Cmd: cmdArgs, User: *user, Env: envs, Labels: labelMap,
		WorkingDir: *workdir, ExposedPorts: exposes, Created: created,
	}
	if *entrypoint != "" {
		spec.Entrypoint = []string{*entrypoint}
	}
	if *base == "glibc" {
		dir := *cache
		if dir == "" {
			if dir, err = ociimage.CacheDir(); err != nil {
				fmt.Fprintln(stderr, "mkimage:", err)
				return 1
			}
		}
		t, err := ociimage.GlibcBase(ctx, dir, func(f string, a ...any) { fmt.Fprintf(stderr, "mkimage: "+f+"\n", a...) })
		if err != nil {
			fmt.Fprintln(stderr, "mkimage:", err)
			return 1
		}
		spec.Layers = append(spec.Layers, ociimage.Layer{Tree: t, CreatedBy: "pdserve glibc base (" + ociimage.BaseDescription() + ")"})
	}
	for _, a := range addList {
		t := ociimage.NewTree()
		if err := t.AddHost(a.src, a.dst, ociimage.AddOptions{}); err != nil {
			fmt.Fprintln(stderr, "mkimage:", err)
			return 1
		}
		spec.Layers = append(spec.Layers, ociimage.Layer{Tree: t, CreatedBy: "mkimage --add " + filepath.Base(a.src) + ":" + a.dst})
	}
	if *checkELF {
		trees := make([]*ociimage.Tree, len(spec.Layers))
		for i, l := range spec.Layers {
			trees[i] = l.Tree
		}
		rep, err := ociimage.CheckELF(trees, spec.Env, allow)
		if err != nil {
			fmt.Fprintln(stderr, "mkimage:", err)
			return 1
		}
		if len(rep.Unresolved) > 0 {
			for _, u := range rep.Unresolved {
				fmt.Fprintf(stderr, "mkimage: %s: %s, which the image lacks\n", *ref, u)
			}
			fmt.Fprintln(stderr, "mkimage: add the libraries, use --base glibc, or --allow-missing LIB (or --check-elf=false) for what the runtime provides")
			return 1
		}
	}
	digest, err := buildAndWrite(spec, *out)
	if err != nil {
		fmt.Fprintln(stderr, "mkimage:", err)
		return 1
	}
	fi, _ := os.Stat(*out)
	fmt.Fprintf(stdout, "%s %s %s %s\n", *out, *ref, digest, humanBytes(fi.Size()))
	return 0
}

// buildAndWrite builds spec in a temporary directory next to out and
// writes the archive; it returns the manifest digest.
func buildAndWrite(spec ociimage.Spec, out string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".mkimage-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	img, err := ociimage.Build(spec, tmp)
	if err != nil {
		return "", err
	}
	d, err := ociimage.WriteArchive(out, img)
	if err != nil {
		return "", err
	}
	return d.String(), nil
}

// parseEpoch reads whole seconds since 1970; "" is the epoch.
func parseEpoch(s string) (time.Time, error) {
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, errors.New("want whole seconds since 1970")
	}
	return time.Unix(n, 0).UTC(), nil
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
}
