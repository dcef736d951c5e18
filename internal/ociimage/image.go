package ociimage

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DefaultPath is the PATH of an image whose Env does not set one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Spec describes one image: its layers, bottom first, and its runtime
// configuration.
type Spec struct {
	// Ref names the image, "REPOSITORY:TAG" (e.g. ghcr.io/pdserve/coordinator:0.1.0);
	// the archive's index names it so (see WriteArchive).
	Ref string
	// Layers, bottom first; at least one.
	Layers []Layer
	// OS and Architecture of the image (GOOS/GOARCH spelling: linux, amd64).
	OS, Architecture string
	// Entrypoint and Cmd as in the OCI image config (exec form).
	Entrypoint, Cmd []string
	// User, "UID:GID" or "UID"; empty runs as root.
	User string
	// Env, "KEY=VALUE" each; PATH=DefaultPath is added unless set.
	Env []string
	// Labels of the image config (org.opencontainers.image.* and others).
	Labels map[string]string
	// WorkingDir, absolute; empty is the root.
	WorkingDir string
	// ExposedPorts, "PORT" or "PORT/PROTO" (tcp when none).
	ExposedPorts []string
	// Created is the image's and every history entry's timestamp, and the
	// mtime of every file in the layers (whole seconds, UTC). Set it to
	// the commit's time (SOURCE_DATE_EPOCH) or leave it zero for the Unix
	// epoch: either way the same inputs give the same digests.
	Created time.Time
	// LayerCache, if set, is a directory of compressed layers kept between
	// builds, by content (see PruneLayerCache): a layer built before is
	// reused instead of compressed again.
	LayerCache string
}

// Layer is one layer of a Spec.
type Layer struct {
	// Tree is the files the layer adds.
	Tree *Tree
	// CreatedBy is recorded in the image history (what made the layer).
	CreatedBy string
}

// Image is a built image: the go-containerregistry image and the name it
// goes by. Its layers live in files under the directory Build was given,
// which must outlive the Image.
type Image struct {
	Ref string
	v1.Image
}

// Build writes the layers of s as gzip-compressed tarballs into tmpDir
// (which the caller creates and removes) and returns the image, with OCI
// media types. The same Spec (same files, same contents) gives the same
// manifest digest.
func Build(s Spec, tmpDir string) (*Image, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	created := s.Created.UTC().Truncate(time.Second)
	if s.Created.IsZero() {
		created = time.Unix(0, 0).UTC()
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = s.OS, s.Architecture
	cf.Config = s.containerConfig()
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("ociimage: %s: %w", s.Ref, err)
	}
	adds := make([]mutate.Addendum, 0, len(s.Layers))
	for i, l := range s.Layers {
		fl, err := writeLayerCached(l.Tree, created, tmpDir, s.LayerCache)
		if err != nil {
			return nil, fmt.Errorf("ociimage: %s: layer %d (%s): %w", s.Ref, i, l.CreatedBy, err)
		}
		adds = append(adds, mutate.Addendum{
			Layer:     fl,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: l.CreatedBy},
		})
	}
	img, err = mutate.Append(img, adds...)
	if err != nil {
		return nil, fmt.Errorf("ociimage: %s: %w", s.Ref, err)
	}
	img, err = mutate.CreatedAt(img, v1.Time{Time: created})
	if err != nil {
		return nil, fmt.Errorf("ociimage: %s: %w", s.Ref, err)
	}
	return &Image{Ref: s.Ref, Image: img}, nil
}

func (s *Spec) validate() error {
	if _, err := name.NewTag(s.Ref, name.StrictValidation); err != nil {
		return fmt.Errorf("ociimage: image name %q: want REPOSITORY:TAG: %w", s.Ref, err)
	}
	if len(s.Layers) == 0 {
		return fmt.Errorf("ociimage: %s: no layers", s.Ref)
	}
	if s.OS == "" || s.Architecture == "" {
		return fmt.Errorf("ociimage: %s: OS and architecture are required", s.Ref)
	}
	for _, e := range s.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("ociimage: %s: env %q: want KEY=VALUE", s.Ref, e)
		}
	}
	if s.WorkingDir != "" && !strings.HasPrefix(s.WorkingDir, "/") {
		return fmt.Errorf("ociimage: %s: working directory %q is not absolute", s.Ref, s.WorkingDir)
	}
	for _, p := range s.ExposedPorts {
		if _, err := exposedPort(p); err != nil {
			return fmt.Errorf("ociimage: %s: %w", s.Ref, err)
		}
	}
	return nil
}

// exposedPort normalizes "8080" to "8080/tcp" and checks "PORT/PROTO".
func exposedPort(p string) (string, error) {
	port, proto, ok := strings.Cut(p, "/")
	if !ok {
		proto = "tcp"
	}
	var n int
	if _, err := fmt.Sscanf(port, "%d", &n); err != nil || n < 1 || n > 65535 || fmt.Sprint(n) != port {
		return "", fmt.Errorf("exposed port %q: want PORT[/tcp|udp|sctp], PORT in 1..65535", p)
	}
	switch proto {
	case "tcp", "udp", "sctp":
	default:
		return "", fmt.Errorf("exposed port %q: protocol %q is not tcp, udp or sctp", p, proto)
	}
	return port + "/" + proto, nil
}

func (s *Spec) containerConfig() v1.Config {
	env := slices.Clone(s.Env)
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		env = append([]string{"PATH=" + DefaultPath}, env...)
	}
	c := v1.Config{
		Entrypoint: slices.Clone(s.Entrypoint),
		Cmd:        slices.Clone(s.Cmd),
		User:       s.User,
		Env:        env,
		WorkingDir: s.WorkingDir,
	}
	if len(s.Labels) > 0 {
		c.Labels = maps.Clone(s.Labels)
	}
	if len(s.ExposedPorts) > 0 {
		c.ExposedPorts = map[string]struct{}{}
		for _, p := range s.ExposedPorts {
			n, _ := exposedPort(p)
			c.ExposedPorts[n] = struct{}{}
		}
	}
	return c
}

// SourceDateEpoch returns the time SOURCE_DATE_EPOCH names (seconds since
// the Unix epoch), or the epoch itself when it is unset.
func SourceDateEpoch() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	var sec int64
	if _, err := fmt.Sscanf(v, "%d", &sec); err != nil || fmt.Sprint(sec) != v || sec < 0 {
		return time.Time{}, fmt.Errorf("ociimage: SOURCE_DATE_EPOCH=%q: want whole seconds since 1970", v)
	}
	return time.Unix(sec, 0).UTC(), nil
}
