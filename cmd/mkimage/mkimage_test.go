package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestMkimageBaseNone builds a one-file image with every config flag,
// twice, and reads it back as an OCI layout.
func TestMkimageBaseNone(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "pause")
	if err := os.WriteFile(prog, []byte("#!not really\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := func(out string) []string {
		return []string{"--out", out, "--ref", "registry.k8s.io/pause:3.10", "--base", "none",
			"--add", prog + ":/pause", "--entrypoint", "/pause", "--arg", "-v", "--user", "65535:65535",
			"--env", "A=b", "--label", "org.opencontainers.image.title=pause", "--workdir", "/",
			"--expose", "8080", "--source-date-epoch", "1700000000"}
	}
	var digests []string
	for _, name := range []string{"a.tar", "b.tar"} {
		var stdout, stderr bytes.Buffer
		out := filepath.Join(dir, name)
		if code := mkimage(context.Background(), args(out), &stdout, &stderr); code != 0 {
			t.Fatalf("mkimage = %d, stderr:\n%s", code, stderr.String())
		}
		f := strings.Fields(stdout.String())
		if len(f) < 3 || !strings.HasPrefix(f[2], "sha256:") {
			t.Fatalf("stdout %q: want PATH REF DIGEST SIZE", stdout.String())
		}
		digests = append(digests, f[2])
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds, two digests: %v", digests)
	}
	a, _ := os.ReadFile(filepath.Join(dir, "a.tar"))
	b, _ := os.ReadFile(filepath.Join(dir, "b.tar"))
	if !bytes.Equal(a, b) {
		t.Fatal("two builds, different tarballs")
	}

	// Unpack and read it as an OCI layout.
	lay := filepath.Join(dir, "layout")
	untar(t, filepath.Join(dir, "a.tar"), lay)
	idx, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest.String() != digests[0] {
		t.Fatalf("index %+v: want one manifest %s", im.Manifests, digests[0])
	}
	if got := im.Manifests[0].Annotations["io.containerd.image.name"]; got != "registry.k8s.io/pause:3.10" {
		t.Errorf("containerd name %q", got)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(cf.Config)
	want := `{"Cmd":["-v"],"Entrypoint":["/pause"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","A=b"],"Labels":{"org.opencontainers.image.title":"pause"},"User":"65535:65535","WorkingDir":"/","ExposedPorts":{"8080/tcp":{}}}`
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if cf.Created.Unix() != 1700000000 {
		t.Errorf("created %v, want 1700000000", cf.Created)
	}
	ls, _ := img.Layers()
	if len(ls) != 1 {
		t.Errorf("%d layers, want 1 (no base)", len(ls))
	}
}

func TestMkimageFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"nothing", nil, "--out FILE.tar is required"},
		{"bad base", []string{"--out", "x.tar", "--ref", "a/b:1", "--base", "alpine"}, "want glibc or none"},
		{"bad add", []string{"--out", "x.tar", "--ref", "a/b:1", "--add", "x"}, "want SRC:DST"},
		{"relative entrypoint", []string{"--out", "x.tar", "--ref", "a/b:1", "--base", "none", "--add", "mkimage.go:/x", "--entrypoint", "x"}, "not an absolute path"},
		{"none without add", []string{"--out", "x.tar", "--ref", "a/b:1", "--base", "none"}, "needs at least one --add"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := mkimage(context.Background(), tc.args, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2; stderr %s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.want)
			}
		})
	}
}

func TestMkimageHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := mkimage(context.Background(), []string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, f := range []string{"--out", "--ref", "--base", "--add", "--entrypoint", "--arg", "--user", "--env", "--label", "--workdir", "--expose"} {
		if !strings.Contains(stdout.String(), "-"+strings.TrimLeft(f, "-")) {
			t.Errorf("--help lacks %s", f)
		}
	}
}

// untar extracts the regular files and directories of the tar src into dst.
func untar(t *testing.T, src, dst string) {
	t.Helper()
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dst, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
