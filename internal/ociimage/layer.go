package ociimage

import (
	"archive/tar"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
)

// fileLayer is a gzip-compressed layer tarball in a file, with its digests
// computed once when it was written. It implements v1.Layer.
type fileLayer struct {
	path   string
	digest v1.Hash // of the compressed bytes
	diffID v1.Hash // of the uncompressed tar
	size   int64   // compressed bytes
	raw    int64   // uncompressed bytes
}

var _ v1.Layer = (*fileLayer)(nil)

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }

func (l *fileLayer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, f}, nil
}

// hashWriter counts and hashes what passes through it.
type hashWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func newHashWriter(w io.Writer) *hashWriter { return &hashWriter{w: w, h: sha256.New()} }

func (hw *hashWriter) Write(p []byte) (int, error) {
	n, err := hw.w.Write(p)
	hw.h.Write(p[:n])
	hw.n += int64(n)
	return n, err
}

func (hw *hashWriter) sum() v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", hw.h.Sum(nil))}
}

// writeLayer writes t as a gzip-compressed tar into a new file in dir:
// entries in byte order of their paths (so parents come first), every
// timestamp mtime (whole seconds), owners numeric with no names, hard links
// to the first path of the same host file. The same tree and mtime give
// the same bytes.
func writeLayer(t *Tree, mtime time.Time, dir string) (*fileLayer, error) {
	f, err := os.CreateTemp(dir, "layer-*.tar.gz")
	if err != nil {
		return nil, fmt.Errorf("ociimage: layer: %w", err)
	}
	l, err := writeLayerTo(t, mtime, f)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return nil, err
	}
	l.path = f.Name()
	return l, nil
}

func writeLayerTo(t *Tree, mtime time.Time, f io.Writer) (*fileLayer, error) {
	compressed := newHashWriter(f)
	zw, err := gzip.NewWriterLevel(compressed, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	raw := newHashWriter(zw)
	tw := tar.NewWriter(raw)
	mtime = mtime.UTC().Truncate(time.Second)
	firstOf := map[fileID]string{}
	for _, p := range t.Paths() {
		e := t.entries[p]
		hdr := &tar.Header{
			Name:    p,
			Mode:    int64(e.mode.Perm()),
			Uid:     e.uid,
			Gid:     e.gid,
			ModTime: mtime,
		}
		hdr.Mode |= tarModeBits(e.mode)
		switch e.typ {
		case tar.TypeDir:
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case tar.TypeSymlink:
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = e.link
		case tar.TypeReg:
			if e.inode != (fileID{}) {
				if first, ok := firstOf[e.inode]; ok {
					hdr.Typeflag = tar.TypeLink
					hdr.Linkname = first
					break
				}
				firstOf[e.inode] = p
			}
			hdr.Typeflag = tar.TypeReg
			hdr.Size = e.size
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("ociimage: layer: %s: %w", p, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		if err := copyContent(tw, e, p); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: layer: %w", err)
	}
	return &fileLayer{digest: compressed.sum(), diffID: raw.sum(), size: compressed.n, raw: raw.n}, nil
}

// tarModeBits maps the setuid, setgid and sticky bits of m to tar's.
func tarModeBits(m os.FileMode) int64 {
	var b int64
	if m&os.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// copyContent writes e's content, exactly e.size bytes, to tw.
func copyContent(tw io.Writer, e *entry, p string) error {
	if e.src == "" {
		_, err := tw.Write(e.data)
		return err
	}
	f, err := os.Open(e.src)
	if err != nil {
		return fmt.Errorf("ociimage: layer: %s: %w", p, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("ociimage: layer: %s: %s: %w", p, e.src, errNotRegular)
	}
	n, err := io.Copy(tw, io.LimitReader(f, e.size))
	if err != nil {
		return fmt.Errorf("ociimage: layer: %s: %w", p, err)
	}
	if n != e.size || fi.Size() != e.size {
		return fmt.Errorf("ociimage: layer: %s: %s changed size (%d bytes when added, %d now)", p, e.src, e.size, fi.Size())
	}
	return nil
}
