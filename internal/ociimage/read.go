package ociimage

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// ReadArchive reads an archive WriteArchive wrote (or any single-image OCI
// layout tar), unpacked into dir (which the caller creates and removes:
// the image's blobs are read from there), and returns the image and the
// name its index gives it.
func ReadArchive(archive, dir string) (v1.Image, string, error) {
	if err := untarFlat(archive, dir); err != nil {
		return nil, "", fmt.Errorf("ociimage: read %s: %w", archive, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", fmt.Errorf("ociimage: read %s: %w", archive, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, "", err
	}
	if len(im.Manifests) != 1 {
		return nil, "", fmt.Errorf("ociimage: read %s: %d manifests, want 1", archive, len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		return nil, "", err
	}
	return img, im.Manifests[0].Annotations[annotationContainerdName], nil
}

// untarFlat unpacks the regular files and directories of src into dst.
func untarFlat(src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	return untarFiles(f, dst)
}

// untarFiles unpacks a tar stream of regular files and directories into
// dst: every path is cleaned under dst (none can leave it), a file keeps
// whether it is executable (0755, else 0644), a global pax header is
// skipped, and any other entry type is refused by name.
func untarFiles(r io.Reader, dst string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)
		p := filepath.Join(dst, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeXGlobalHeader:
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			mode := os.FileMode(0o644)
			if h.Mode&0o111 != 0 {
				mode = 0o755
			}
			out, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unexpected entry type %q", h.Name, h.Typeflag)
		}
	}
}

// Unpack writes the file system of img (its layers flattened) into dir:
// files, directories, symlinks and hard links with their modes; owners
// too when the caller may set them (root), so that the image's user sees
// what it would in a container. Paths leaving dir are refused.
func Unpack(img v1.Image, dir string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	chown := os.Geteuid() == 0
	type dirMode struct {
		p    string
		mode os.FileMode
	}
	var dirs []dirMode // set last: a read-only directory would refuse its files
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("ociimage: unpack: %w", err)
		}
		name := path.Clean("/" + h.Name)
		if name == "/" {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		mode := h.FileInfo().Mode()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
			dirs = append(dirs, dirMode{p, mode})
		case tar.TypeReg:
			out, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := os.Chmod(p, mode&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		case tar.TypeLink:
			target := path.Clean("/" + h.Linkname)
			if strings.HasPrefix(target, "/..") {
				return fmt.Errorf("ociimage: unpack: %s: hard link out of the image", h.Name)
			}
			if err := os.Link(filepath.Join(dir, filepath.FromSlash(target)), p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("ociimage: unpack: %s: unexpected entry type %q", h.Name, h.Typeflag)
		}
		if chown && h.Typeflag != tar.TypeLink {
			if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
				return err
			}
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Chmod(dirs[i].p, dirs[i].mode&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
			return err
		}
	}
	return nil
}
