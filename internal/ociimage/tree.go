package ociimage

import (
	"archive/tar"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Tree is the file system one layer adds: image paths to entries. Paths
// are clean, relative to the root and slash-separated ("usr/local/bin/x");
// the parents of every entry are in the tree too, as directories. A Tree
// is not safe for concurrent use.
type Tree struct {
	entries map[string]*entry
}

// entry is one file, directory, symlink or hard link of a Tree.
type entry struct {
	typ      byte        // tar.TypeReg, TypeDir, TypeSymlink or TypeLink
	mode     fs.FileMode // permission bits, setuid/setgid/sticky included
	uid, gid int
	link     string // symlink target, or the image path of a hard link's file
	data     []byte // a regular file's content when src is empty
	src      string // host file holding a regular file's content
	size     int64  // a regular file's size in bytes
	inode    fileID // host identity, to find hard links; zero when none
}

// fileID is a host file's device and inode.
type fileID struct{ dev, ino uint64 }

// NewTree returns an empty tree.
func NewTree() *Tree { return &Tree{entries: map[string]*entry{}} }

// Len is the number of entries, directories included.
func (t *Tree) Len() int { return len(t.entries) }

// Paths returns the image paths of the tree, sorted; the caller owns the
// slice.
func (t *Tree) Paths() []string {
	ps := make([]string, 0, len(t.entries))
	for p := range t.entries {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// Has reports whether p (an image path, with or without a leading "/") is
// in the tree.
func (t *Tree) Has(p string) bool {
	cp, err := cleanPath(p)
	if err != nil {
		return false
	}
	_, ok := t.entries[cp]
	return ok
}

// cleanPath turns an image path ("/usr/bin/x", "usr/bin/x/") into the
// tree's key ("usr/bin/x"); the root and paths leaving it are errors.
func cleanPath(p string) (string, error) {
	c := path.Clean("/" + filepath.ToSlash(p))
	if c == "/" {
		return "", fmt.Errorf("ociimage: %q: the image root is not a file", p)
	}
	return strings.TrimPrefix(c, "/"), nil
}

// Dir adds the directory p (and its missing parents, 0755 root) with the
// given mode and owner; an existing directory takes the new mode and
// owner.
func (t *Tree) Dir(p string, mode fs.FileMode, uid, gid int) error {
	cp, err := cleanPath(p)
	if err != nil {
		return err
	}
	if err := t.parents(cp); err != nil {
		return err
	}
	if e, ok := t.entries[cp]; ok && e.typ != tar.TypeDir {
		return fmt.Errorf("ociimage: %s: already a file, not a directory", cp)
	}
	t.entries[cp] = &entry{typ: tar.TypeDir, mode: mode.Perm() | mode&(fs.ModeSticky|fs.ModeSetgid), uid: uid, gid: gid}
	return nil
}

// File adds a regular file with content data (which the tree keeps; the
// caller must not change it), owned by root. An existing entry at p is
// replaced.
func (t *Tree) File(p string, data []byte, mode fs.FileMode) error {
	cp, err := cleanPath(p)
	if err != nil {
		return err
	}
	if err := t.put(cp, &entry{typ: tar.TypeReg, mode: mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky), data: data, size: int64(len(data))}); err != nil {
		return err
	}
	return nil
}

// Symlink adds a symbolic link p → target (target as written, relative
// or absolute within the image).
func (t *Tree) Symlink(p, target string) error {
	cp, err := cleanPath(p)
	if err != nil {
		return err
	}
	return t.put(cp, &entry{typ: tar.TypeSymlink, mode: 0o777, link: target})
}

// put stores e at cp after creating cp's parents; a directory at cp is
// only replaced by a directory.
func (t *Tree) put(cp string, e *entry) error {
	if err := t.parents(cp); err != nil {
		return err
	}
	if old, ok := t.entries[cp]; ok && old.typ == tar.TypeDir && e.typ != tar.TypeDir {
		return fmt.Errorf("ociimage: %s: already a directory", cp)
	}
	t.entries[cp] = e
	return nil
}

// parents adds the missing parent directories of cp as 0755 root; a
// parent that is a file is an error.
func (t *Tree) parents(cp string) error {
	for d := path.Dir(cp); d != "."; d = path.Dir(d) {
		if e, ok := t.entries[d]; ok {
			if e.typ != tar.TypeDir {
				return fmt.Errorf("ociimage: %s: parent %s is not a directory", cp, d)
			}
			continue
		}
		t.entries[d] = &entry{typ: tar.TypeDir, mode: 0o755}
	}
	return nil
}

// AddOptions adjust AddHost.
type AddOptions struct {
	// UID and GID own every added entry (0 and 0: root).
	UID, GID int
	// Skip, when set, is asked for each host entry below the source (rel is
	// slash-separated and relative to it; dir says whether it is a
	// directory); true leaves the entry (and, for a directory, all below
	// it) out.
	Skip func(rel string, dir bool) bool
}

// AddHost copies the host file or directory src into the tree at dst, as
// Docker's COPY does: a file becomes dst (or dst/NAME when dst ends in
// "/"), a directory's contents become dst's. Modes are kept (permission,
// setuid, setgid and sticky bits); owners are opts' UID and GID;
// timestamps are not kept (the layer sets one for all). Symbolic links are
// kept as links, hard links within src become tar hard links. Contents are
// read when the layer is written, not now. Only regular files,
// directories and symlinks are accepted.
func (t *Tree) AddHost(src, dst string, opts AddOptions) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("ociimage: add %s: %w", src, err)
	}
	if !fi.IsDir() {
		if strings.HasSuffix(dst, "/") {
			dst = path.Join(dst, filepath.Base(src))
		}
		cp, err := cleanPath(dst)
		if err != nil {
			return err
		}
		return t.addHostEntry(src, cp, fi, opts)
	}
	root, err := cleanPath(dst)
	if err != nil && path.Clean("/"+dst) != "/" {
		return err
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("ociimage: add %s: %w", src, err)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			if root == "" {
				return nil // the image root itself
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			return t.Dir(root, info.Mode(), opts.UID, opts.GID)
		}
		if opts.Skip != nil && opts.Skip(rel, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("ociimage: add %s: %w", p, err)
		}
		return t.addHostEntry(p, path.Join(root, rel), info, opts)
	})
}

// addHostEntry adds one host entry at the image path cp.
func (t *Tree) addHostEntry(p, cp string, fi fs.FileInfo, opts AddOptions) error {
	mode := fi.Mode()
	perm := mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	switch {
	case mode.IsDir():
		return t.Dir(cp, perm, opts.UID, opts.GID)
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return fmt.Errorf("ociimage: add %s: %w", p, err)
		}
		return t.put(cp, &entry{typ: tar.TypeSymlink, mode: 0o777, link: target, uid: opts.UID, gid: opts.GID})
	case mode.IsRegular():
		e := &entry{typ: tar.TypeReg, mode: perm, src: p, size: fi.Size(), uid: opts.UID, gid: opts.GID}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			e.inode = fileID{dev: uint64(st.Dev), ino: uint64(st.Ino)} //nolint:unconvert // Dev's type differs between architectures
		}
		return t.put(cp, e)
	default:
		return fmt.Errorf("ociimage: add %s: %v is neither a file, a directory nor a symlink", p, mode.Type())
	}
}

// Merge copies every entry of o into t (o's entries win; a directory is
// never replaced by a file). Host-backed files stay host-backed.
func (t *Tree) Merge(o *Tree) error {
	for _, p := range o.Paths() {
		e := *o.entries[p]
		if e.typ == tar.TypeDir {
			if err := t.Dir(p, e.mode, e.uid, e.gid); err != nil {
				return err
			}
			continue
		}
		if err := t.put(p, &e); err != nil {
			return err
		}
	}
	return nil
}

// Remove deletes p and everything below it; absent paths are no error.
func (t *Tree) Remove(p string) {
	cp, err := cleanPath(p)
	if err != nil {
		return
	}
	for k := range t.entries {
		if k == cp || strings.HasPrefix(k, cp+"/") {
			delete(t.entries, k)
		}
	}
}

// ReadFile returns the content of the regular file p of the tree.
func (t *Tree) ReadFile(p string) ([]byte, error) {
	cp, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	e, ok := t.entries[cp]
	if !ok || e.typ != tar.TypeReg {
		return nil, fmt.Errorf("ociimage: %s: %w", cp, fs.ErrNotExist)
	}
	if e.src == "" {
		return e.data, nil
	}
	return os.ReadFile(e.src)
}

// errNotRegular is returned when a host file changed type between adding
// and writing.
var errNotRegular = errors.New("not a regular file any more")
