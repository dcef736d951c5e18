package ociimage

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// smallTree is a tree with a file, an executable, a directory owned by
// someone else, a symlink and bytes, added in an order unlike the sorted
// one.
func smallTree(t *testing.T, dir string) *Tree {
	t.Helper()
	src := filepath.Join(dir, "src")
	for p, c := range map[string]string{"z/last": "z", "a/first": "a", "m/bin/tool": "#!x"} {
		if err := os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(src, "m/bin/tool"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../a/first", filepath.Join(src, "z/link")); err != nil {
		t.Fatal(err)
	}
	tr := NewTree()
	if err := tr.File("/etc/motd", []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tr.AddHost(src, "/opt/x", AddOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Dir("/home/nonroot", 0o700, NonRootUID, NonRootUID); err != nil {
		t.Fatal(err)
	}
	return tr
}

func smallSpec(tr *Tree) Spec {
	return Spec{
		Ref: "example.com/pdserve/small:1", OS: "linux", Architecture: "amd64",
		Layers:     []Layer{{Tree: tr, CreatedBy: "test"}},
		Entrypoint: []string{"/opt/x/m/bin/tool"}, User: "65532:65532",
		Labels:  map[string]string{"org.opencontainers.image.title": "small"},
		Created: time.Unix(1700000000, 0),
	}
}

// TestLayerEntries: entries sorted, parents first, one timestamp, numeric
// owners, modes and links kept.
func TestLayerEntries(t *testing.T) {
	dir := t.TempDir()
	l, err := writeLayer(smallTree(t, dir), time.Unix(1700000000, 0), dir)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.ModTime.Unix() != 1700000000 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: mtime %v, owner names %q %q", h.Name, h.ModTime, h.Uname, h.Gname)
		}
		e := h.Name + " " + h.FileInfo().Mode().String()
		if h.Uid != 0 || h.Gid != 0 {
			e += " u" + strconv.Itoa(h.Uid)
		}
		if h.Linkname != "" {
			e += " -> " + h.Linkname
		}
		got = append(got, e)
	}
	want := []string{
		"etc/ drwxr-xr-x", "etc/motd -rw-r--r--",
		"home/ drwxr-xr-x", "home/nonroot/ drwx------ u65532",
		"opt/ drwxr-xr-x", "opt/x/ drwxr-xr-x",
		"opt/x/a/ drwxr-xr-x", "opt/x/a/first -rw-r--r--",
		"opt/x/m/ drwxr-xr-x", "opt/x/m/bin/ drwxr-xr-x", "opt/x/m/bin/tool -rwxr-xr-x",
		"opt/x/z/ drwxr-xr-x", "opt/x/z/last -rw-r--r--", "opt/x/z/link Lrwxrwxrwx -> ../a/first",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
}

// TestArchiveReproducibleAndReadable: the same spec twice gives the same
// bytes; the tar reads back as an OCI layout with the image's name, and
// as a docker-archive (what crane push and docker load read) with the
// same config and layers; both push to a registry (go-containerregistry's
// own, in process) and pull back the same config.
func TestArchiveReproducibleAndReadable(t *testing.T) {
	dir := t.TempDir()
	var digests []v1.Hash
	var paths []string
	for i := range 2 {
		tmp := t.TempDir()
		img, err := Build(smallSpec(smallTree(t, t.TempDir())), tmp)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "small"+strconv.Itoa(i)+".tar")
		d, err := WriteArchive(p, img)
		if err != nil {
			t.Fatal(err)
		}
		digests, paths = append(digests, d), append(paths, p)
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds, two digests: %v", digests)
	}
	a, _ := os.ReadFile(paths[0])
	b, _ := os.ReadFile(paths[1])
	if string(a) != string(b) {
		t.Fatal("two builds, different tarballs")
	}

	oci, ref, err := ReadArchive(paths[0], t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := oci.Digest(); d != digests[0] || ref != "example.com/pdserve/small:1" {
		t.Errorf("OCI layout: digest %v name %q, want %v example.com/pdserve/small:1", d, ref, digests[0])
	}
	tag, _ := name.NewTag("example.com/pdserve/small:1")
	docker, err := tarball.ImageFromPath(paths[0], &tag)
	if err != nil {
		t.Fatalf("docker-archive view: %v", err)
	}
	cfgOCI, _ := oci.ConfigName()
	cfgDocker, err := docker.ConfigName()
	if err != nil || cfgDocker != cfgOCI {
		t.Errorf("docker-archive config %v (%v), OCI %v", cfgDocker, err, cfgOCI)
	}
	lo, _ := oci.Layers()
	ld, _ := docker.Layers()
	if len(lo) != 1 || len(ld) != 1 {
		t.Fatalf("layers: OCI %d, docker %d, want 1", len(lo), len(ld))
	}
	do, _ := lo[0].Digest()
	dd, _ := ld[0].Digest()
	if do != dd {
		t.Errorf("layer digest OCI %v, docker %v", do, dd)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct {
		name string
		img  v1.Image
	}{{"oci", oci}, {"docker", docker}} {
		r, err := name.NewTag(host+"/pdserve/small:"+tc.name, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(r, tc.img, remote.WithContext(context.Background())); err != nil {
			t.Fatalf("push %s: %v", tc.name, err)
		}
		got, err := remote.Image(r)
		if err != nil {
			t.Fatalf("pull %s: %v", tc.name, err)
		}
		if c, _ := got.ConfigName(); c != cfgOCI {
			t.Errorf("pulled %s: config %v, want %v", tc.name, c, cfgOCI)
		}
	}
	pushed, _ := remote.Image(mustTag(t, host+"/pdserve/small:oci"))
	if d, _ := pushed.Digest(); d != digests[0] {
		t.Errorf("pushed from the OCI layout: digest %v, want the archive's %v", d, digests[0])
	}
}

func mustTag(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// TestCheckELF: a missing library, a missing interpreter and a library
// found through $ORIGIN and a symlinked directory.
func TestCheckELF(t *testing.T) {
	pg := buildPurego(t, t.TempDir())
	tr := NewTree()
	if err := tr.AddHost(pg, "/usr/local/bin/p", AddOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := CheckELF([]*Tree{tr}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var needs []string
	for _, u := range rep.Unresolved {
		needs = append(needs, u.String())
	}
	want := []string{
		"/usr/local/bin/p needs /lib64/ld-linux-x86-64.so.2",
		"/usr/local/bin/p needs libdl.so.2",
		"/usr/local/bin/p needs libpthread.so.0",
		"/usr/local/bin/p needs libc.so.6",
	}
	if diff := cmp.Diff(want, needs); diff != "" {
		t.Errorf("unresolved, no libraries in the image (-want +got):\n%s", diff)
	}

	// The libraries under lib/x86_64-linux-gnu behind a symlinked lib64;
	// allowed ones are reported apart.
	libs := NewTree()
	for _, l := range []string{"ld-linux-x86-64.so.2", "libdl.so.2", "libpthread.so.0"} {
		if err := libs.File("/usr/lib/x86_64-linux-gnu/"+l, []byte("not ELF"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := libs.Symlink("/lib64", "usr/lib/x86_64-linux-gnu"); err != nil {
		t.Fatal(err)
	}
	rep, err = CheckELF([]*Tree{libs, tr}, nil, []string{"libc.so.6"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Unresolved) != 0 || len(rep.Allowed) != 1 || rep.Allowed[0].Need != "libc.so.6" || rep.Checked != 1 {
		t.Errorf("report %+v: want libc.so.6 allowed, nothing else", rep)
	}
}

// TestGlibcImage: the glibc base with a program linked as pdserve's
// binaries are, built twice (same digest), checked (user, labels,
// nothing written outside the expected directories, every ELF resolved)
// and run: as 65532 under chroot on a read-only root where the test is
// root, through the image's own loader elsewhere.
func TestGlibcImage(t *testing.T) {
	base := testBase(t)
	pg := buildPurego(t, t.TempDir())
	spec := func() Spec {
		app := NewTree()
		if err := app.AddHost(pg, "/usr/local/bin/", AddOptions{}); err != nil {
			t.Fatal(err)
		}
		return Spec{
			Ref: "example.com/pdserve/glibc-test:1", OS: "linux", Architecture: "amd64",
			Layers:     []Layer{{Tree: base, CreatedBy: "base"}, {Tree: app, CreatedBy: "app"}},
			Entrypoint: []string{"/usr/local/bin/purego"}, User: "65532:65532",
			Labels: map[string]string{"org.opencontainers.image.title": "glibc-test"},
		}
	}
	var digest v1.Hash
	var img v1.Image
	for i := range 2 {
		b, err := Build(spec(), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		d, err := b.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && d != digest {
			t.Fatalf("two builds, two digests: %v %v", digest, d)
		}
		digest, img = d, b
	}
	s := spec()
	rep, err := CheckELF([]*Tree{s.Layers[0].Tree, s.Layers[1].Tree}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Unresolved) > 0 {
		t.Errorf("unresolved: %v", rep.Unresolved)
	}
	checkLayers(t, img)
	rootfs := t.TempDir()
	if err := Unpack(img, rootfs); err != nil {
		t.Fatal(err)
	}
	r := newRunner(t, rootfs, []string{"PATH=" + DefaultPath})
	out, err := r.command(context.Background(), "/usr/local/bin/purego").CombinedOutput()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	want := fmt.Sprintf("uid=%d gid=%d root-writable=false\n", os.Getuid(), os.Getgid())
	if r.chroot {
		want = "uid=65532 gid=65532 root-writable=false\n"
	}
	if string(out) != want {
		t.Errorf("the program says %q, want %q", out, want)
	}
	if l := r.list(t, "/usr/local/bin/purego"); strings.Contains(l, "not found") || !strings.Contains(l, "libc.so.6 =>") {
		t.Errorf("ld.so --list:\n%s", l)
	}
	t.Logf("ran it %s; read-only root: %v", map[bool]string{true: "under chroot as 65532", false: "through the image's loader"}[r.chroot], r.readOnly)
}

// allowedPrefixes are where the images' layers may put files: a file
// anywhere else is a change to the recipe that this test must see.
var allowedPrefixes = []string{
	"etc/", "lib/", "lib64/", "usr/lib/", "usr/share/", "usr/local/bin/", "var/lib/dpkg/status.d/",
	"opt/pdserve/", "home/", "root/", "tmp/",
}

// checkLayers fails the test for a layer entry outside allowedPrefixes,
// or anything not owned by root but the non-root user's home.
func checkLayers(t *testing.T, img v1.Image) {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range ls {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			dir := h.Typeflag == tar.TypeDir
			ok := false
			for _, p := range allowedPrefixes {
				if strings.HasPrefix(h.Name, p) || (dir && strings.HasPrefix(p, h.Name)) {
					ok = true
				}
			}
			if !ok {
				t.Errorf("layer %d: %s is outside the expected directories", i, h.Name)
			}
			if (h.Uid != 0 || h.Gid != 0) && h.Name != "home/nonroot/" {
				t.Errorf("layer %d: %s owned by %d:%d", i, h.Name, h.Uid, h.Gid)
			}
			if h.ModTime.IsZero() {
				t.Errorf("layer %d: %s without a timestamp", i, h.Name)
			}
		}
		rc.Close()
	}
}

// TestLayerCache: a second build reuses the cached layer (same digest,
// the cached file), a damaged cache entry is rebuilt, and pruning removes
// the least recently used layers first.
func TestLayerCache(t *testing.T) {
	cache := t.TempDir()
	tr := smallTree(t, t.TempDir())
	mtime := time.Unix(1700000000, 0)
	a, err := writeLayerCached(tr, mtime, t.TempDir(), cache)
	if err != nil {
		t.Fatal(err)
	}
	b, err := writeLayerCached(tr, mtime, t.TempDir(), cache)
	if err != nil {
		t.Fatal(err)
	}
	if a.digest != b.digest || a.path != b.path || filepath.Dir(a.path) != cache {
		t.Errorf("second build: %v at %s, first %v at %s; want the cached one", b.digest, b.path, a.digest, a.path)
	}
	if err := os.WriteFile(a.path, []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := writeLayerCached(tr, mtime, t.TempDir(), cache)
	if err != nil {
		t.Fatal(err)
	}
	if c.digest != a.digest {
		t.Errorf("rebuilt after damage: %v, want %v", c.digest, a.digest)
	}
	other, err := writeLayerCached(tr, mtime.Add(time.Second), t.TempDir(), cache)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	for _, ext := range []string{".tar.gz", ".json"} {
		if err := os.Chtimes(strings.TrimSuffix(a.path, ".tar.gz")+ext, old, old); err != nil {
			t.Fatal(err)
		}
	}
	meta, err := os.Stat(strings.TrimSuffix(other.path, ".tar.gz") + ".json")
	if err != nil {
		t.Fatal(err)
	}
	PruneLayerCache(cache, other.size+meta.Size()) // room for the recent one only
	if _, err := os.Stat(a.path); !os.IsNotExist(err) {
		t.Errorf("the least recently used layer is still there (%v)", err)
	}
	if _, err := os.Stat(other.path); err != nil {
		t.Errorf("the recent layer went: %v", err)
	}
}
