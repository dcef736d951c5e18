package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations of the archive's index.json: the full name for containerd
// (ctr images import), the tag alone for OCI tools (skopeo oci-archive:).
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// WriteArchive writes img to path (through a temporary file in the same
// directory, renamed at the end) as a tar that is at once an OCI image
// layout (oci-layout, index.json, blobs/sha256/…) and a docker-archive
// (manifest.json naming the same blobs), so that `ctr images import`,
// `skopeo copy oci-archive:…`, `crane push`, `docker load` and `podman
// load` all accept it. Entries are sorted, with fixed timestamps and
// owners: the same image gives the same bytes. It returns the manifest's
// digest.
func WriteArchive(path string, img *Image) (v1.Hash, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("ociimage: archive: %w", err)
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	d, err := writeArchiveTo(f, img)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return v1.Hash{}, fmt.Errorf("ociimage: archive %s: %w", path, err)
	}
	return d, nil
}

type blob struct {
	name string // blobs/sha256/HEX
	size int64
	open func() (io.ReadCloser, error)
}

func writeArchiveTo(w io.Writer, img *Image) (v1.Hash, error) {
	tag, err := name.NewTag(img.Ref, name.StrictValidation)
	if err != nil {
		return v1.Hash{}, err
	}
	rawManifest, err := img.RawManifest()
	if err != nil {
		return v1.Hash{}, err
	}
	manifestDigest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return v1.Hash{}, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	mtime := cf.Created.Time.UTC()

	blobs := map[string]blob{}
	addBytes := func(h v1.Hash, b []byte) string {
		n := "blobs/" + h.Algorithm + "/" + h.Hex
		blobs[n] = blob{name: n, size: int64(len(b)), open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }}
		return n
	}
	addBytes(manifestDigest, rawManifest)
	configPath := addBytes(configName, rawConfig)
	layers, err := img.Layers()
	if err != nil {
		return v1.Hash{}, err
	}
	var layerPaths []string
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return v1.Hash{}, err
		}
		size, err := l.Size()
		if err != nil {
			return v1.Hash{}, err
		}
		n := "blobs/" + d.Algorithm + "/" + d.Hex
		blobs[n] = blob{name: n, size: size, open: l.Compressed}
		layerPaths = append(layerPaths, n)
	}

	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: types.OCIManifestSchema1,
			Digest:    manifestDigest,
			Size:      int64(len(rawManifest)),
			Annotations: map[string]string{
				annotationContainerdName: img.Ref,
				annotationRefName:        tag.TagStr(),
			},
			Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
		}},
	}
	rawIndex, err := json.Marshal(index)
	if err != nil {
		return v1.Hash{}, err
	}
	dockerManifest, err := json.Marshal([]struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: configPath, RepoTags: []string{img.Ref}, Layers: layerPaths}})
	if err != nil {
		return v1.Hash{}, err
	}

	tw := tar.NewWriter(w)
	dir := func(n string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: n, Mode: 0o755, ModTime: mtime})
	}
	file := func(n string, size int64, open func() (io.ReadCloser, error)) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Size: size, Mode: 0o644, ModTime: mtime}); err != nil {
			return err
		}
		r, err := open()
		if err != nil {
			return err
		}
		defer r.Close()
		m, err := io.Copy(tw, r)
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		if m != size {
			return fmt.Errorf("%s: %d bytes, want %d", n, m, size)
		}
		return nil
	}
	fromBytes := func(b []byte) func() (io.ReadCloser, error) {
		return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	if err := dir("blobs/"); err != nil {
		return v1.Hash{}, err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return v1.Hash{}, err
	}
	names := make([]string, 0, len(blobs))
	for n := range blobs {
		if !strings.HasPrefix(n, "blobs/sha256/") {
			return v1.Hash{}, fmt.Errorf("ociimage: archive: blob %s: only sha256 digests", n)
		}
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		b := blobs[n]
		if err := file(n, b.size, b.open); err != nil {
			return v1.Hash{}, err
		}
	}
	ociLayout := []byte(`{"imageLayoutVersion":"1.0.0"}`)
	for _, e := range []struct {
		name string
		data []byte
	}{{"index.json", rawIndex}, {"manifest.json", dockerManifest}, {"oci-layout", ociLayout}} {
		if err := file(e.name, int64(len(e.data)), fromBytes(e.data)); err != nil {
			return v1.Hash{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return v1.Hash{}, err
	}
	return manifestDigest, nil
}

// epoch is the Unix epoch, the timestamp when no SOURCE_DATE_EPOCH is set.
var epoch = time.Unix(0, 0).UTC()
