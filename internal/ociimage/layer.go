package ociimage

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// layerLevel is the layers' gzip level. Level 6 (klauspost's fast
// matcher) made 115 MB of shared libraries 2.5 % larger than level 9 did
// (lazy matching) in 1/6.6 of the time, 1.2 s against 8.1 s: the images'
// builds and tests spent most of their time in level 9. It is part of the
// layer cache's key (layerKeyVersion), since it changes the bytes.
const layerLevel = 6

// layerKeyVersion names the layer format in the cache key: change it when
// the same tree would be written to other bytes (layerLevel, the tar
// headers), so that a cache filled by another version is not reused.
const layerKeyVersion = "pdserve-layer-v2-gzip6"

func writeLayerTo(t *Tree, mtime time.Time, f io.Writer) (*fileLayer, error) {
	compressed := newHashWriter(f)
	zw, err := gzip.NewWriterLevel(compressed, layerLevel)
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

// layerKey hashes everything writeLayer's output depends on: the format
// version, mtime, and each entry's path, type, mode, owner, link target,
// size and content (read from its host file). Equal keys give equal
// layers.
func layerKey(t *Tree, mtime time.Time) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s %d\n", layerKeyVersion, mtime.UTC().Truncate(time.Second).Unix())
	for _, p := range t.Paths() {
		e := t.entries[p]
		fmt.Fprintf(h, "%q %c %o %d %d %q %d %v ", p, e.typ, e.mode, e.uid, e.gid, e.link, e.size, e.inode != (fileID{}))
		if e.typ == tar.TypeReg {
			ch := sha256.New()
			if e.src == "" {
				ch.Write(e.data)
			} else {
				f, err := os.Open(e.src)
				if err != nil {
					return "", fmt.Errorf("ociimage: layer: %s: %w", p, err)
				}
				_, err = io.Copy(ch, f)
				f.Close()
				if err != nil {
					return "", fmt.Errorf("ociimage: layer: %s: %w", p, err)
				}
			}
			h.Write(ch.Sum(nil))
		}
		h.Write([]byte{'\n'})
	}
	return fmt.Sprintf("%x", h.Sum(nil)), nil
}

// cachedLayer is the metadata file beside a cached layer.
type cachedLayer struct {
	Digest, DiffID string
	Size, Raw      int64
}

// writeLayerCached is writeLayer with a cache of compressed layers in
// cacheDir, keyed by layerKey: a hit (its digest checked again) is used
// in place, a miss is written there. An empty cacheDir writes into dir.
func writeLayerCached(t *Tree, mtime time.Time, dir, cacheDir string) (*fileLayer, error) {
	if cacheDir == "" {
		return writeLayer(t, mtime, dir)
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("ociimage: layer cache: %w", err)
	}
	key, err := layerKey(t, mtime)
	if err != nil {
		return nil, err
	}
	gz := filepath.Join(cacheDir, key+".tar.gz")
	meta := filepath.Join(cacheDir, key+".json")
	if b, err := os.ReadFile(meta); err == nil {
		var m cachedLayer
		if json.Unmarshal(b, &m) == nil {
			if l, err := checkCached(gz, m); err == nil {
				now := time.Now()
				_ = os.Chtimes(gz, now, now)
				_ = os.Chtimes(meta, now, now)
				return l, nil
			}
		}
	}
	l, err := writeLayer(t, mtime, cacheDir)
	if err != nil {
		return nil, err
	}
	if err := os.Rename(l.path, gz); err != nil {
		return nil, fmt.Errorf("ociimage: layer cache: %w", err)
	}
	l.path = gz
	b, _ := json.Marshal(cachedLayer{Digest: l.digest.String(), DiffID: l.diffID.String(), Size: l.size, Raw: l.raw})
	if err := os.WriteFile(meta, b, 0o644); err != nil {
		return nil, fmt.Errorf("ociimage: layer cache: %w", err)
	}
	return l, nil
}

// checkCached returns the cached layer gz if its size and digest are m's.
func checkCached(gz string, m cachedLayer) (*fileLayer, error) {
	digest, err := v1.NewHash(m.Digest)
	if err != nil {
		return nil, err
	}
	diffID, err := v1.NewHash(m.DiffID)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(gz)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, err
	}
	if n != m.Size || fmt.Sprintf("%x", h.Sum(nil)) != digest.Hex {
		return nil, fmt.Errorf("ociimage: layer cache: %s does not match its digest", filepath.Base(gz))
	}
	return &fileLayer{path: gz, digest: digest, diffID: diffID, size: m.Size, raw: m.Raw}, nil
}

// PruneLayerCache removes the least recently used layers of dir (a
// layer's files are touched when it is reused) until the cache holds at
// most maxBytes. Every commit stamps its layers with its own time, so
// without a bound each build would add a full set.
func PruneLayerCache(dir string, maxBytes int64) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type layerFiles struct {
		key   string
		used  time.Time
		bytes int64
	}
	byKey := map[string]*layerFiles{}
	var total int64
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		key, _, _ := strings.Cut(e.Name(), ".")
		l := byKey[key]
		if l == nil {
			l = &layerFiles{key: key}
			byKey[key] = l
		}
		l.bytes += info.Size()
		if info.ModTime().After(l.used) {
			l.used = info.ModTime()
		}
		total += info.Size()
	}
	ls := slices.Collect(maps.Values(byKey))
	slices.SortFunc(ls, func(a, b *layerFiles) int { return a.used.Compare(b.used) })
	for _, l := range ls {
		if total <= maxBytes {
			return
		}
		for _, ext := range []string{".tar.gz", ".json"} {
			os.Remove(filepath.Join(dir, l.key+ext))
		}
		total -= l.bytes
	}
}
