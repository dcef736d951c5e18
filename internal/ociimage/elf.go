package ociimage

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
)

// DefaultLibDirs are the directories glibc's loader searches last, without
// an ld.so.cache (the images have none), on Debian's multiarch x86-64 and
// arm64 layouts.
var DefaultLibDirs = []string{
	"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu",
	"lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu",
	"lib", "usr/lib",
}

// Unresolved is a dependency of an ELF file of an image that the image
// does not hold.
type Unresolved struct {
	File string // image path of the ELF file ("usr/local/bin/coordinator")
	Need string // the interpreter's path, or a DT_NEEDED name
}

func (u Unresolved) String() string { return "/" + u.File + " needs " + u.Need }

// ELFReport is what CheckELF found.
type ELFReport struct {
	// Checked is the number of ELF files looked at.
	Checked int
	// Unresolved lists each dependency not found in the image, by file.
	Unresolved []Unresolved
	// Allowed lists the unresolved ones that were allowed (e.g. the GPU
	// driver's libcuda.so.1, which the container runtime mounts).
	Allowed []Unresolved
}

// CheckELF looks at every ELF file of the image whose layers are trees,
// bottom first (later layers win), as glibc's loader would: the
// interpreter (PT_INTERP) must exist, and every DT_NEEDED library must be
// found through the file's DT_RPATH, the LD_LIBRARY_PATH of env (the
// image's Env, "K=V" each), its DT_RUNPATH ($ORIGIN expanded) or
// DefaultLibDirs, with symlinks followed inside the image. Needs named in
// allow are reported as Allowed instead of Unresolved.
func CheckELF(layers []*Tree, env []string, allow []string) (*ELFReport, error) {
	fsys := NewTree()
	for _, l := range layers {
		if err := fsys.Merge(l); err != nil {
			return nil, err
		}
	}
	var ldPath []string
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "LD_LIBRARY_PATH="); ok {
			for _, d := range strings.Split(v, ":") {
				if d != "" {
					ldPath = append(ldPath, strings.TrimPrefix(path.Clean("/"+d), "/"))
				}
			}
		}
	}
	r := &ELFReport{}
	for _, p := range fsys.Paths() {
		e := fsys.entries[p]
		if e.typ != tar.TypeReg {
			continue
		}
		f, closer, err := openELF(e)
		if err != nil {
			return nil, fmt.Errorf("ociimage: elf: /%s: %w", p, err)
		}
		if f == nil {
			continue
		}
		r.Checked++
		needs, err := elfNeeds(fsys, p, f, ldPath)
		closer()
		if err != nil {
			return nil, fmt.Errorf("ociimage: elf: /%s: %w", p, err)
		}
		for _, n := range needs {
			u := Unresolved{File: p, Need: n}
			if slices.Contains(allow, n) {
				r.Allowed = append(r.Allowed, u)
			} else {
				r.Unresolved = append(r.Unresolved, u)
			}
		}
	}
	return r, nil
}

// openELF opens e as an ELF file; nil (and no error) when it is not one.
func openELF(e *entry) (*elf.File, func(), error) {
	var ra io.ReaderAt
	closer := func() {}
	if e.src == "" {
		ra = bytes.NewReader(e.data)
	} else {
		f, err := os.Open(e.src)
		if err != nil {
			return nil, nil, err
		}
		ra, closer = f, func() { f.Close() }
	}
	magic := make([]byte, 4)
	if _, err := ra.ReadAt(magic, 0); err != nil || string(magic) != elf.ELFMAG {
		closer()
		return nil, nil, nil
	}
	f, err := elf.NewFile(ra)
	if err != nil {
		closer()
		return nil, nil, err
	}
	return f, closer, nil
}

// elfNeeds returns the dependencies of the ELF file p that fsys lacks.
func elfNeeds(fsys *Tree, p string, f *elf.File, ldPath []string) ([]string, error) {
	var missing []string
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(prog.Open())
		if err != nil {
			return nil, err
		}
		interp := strings.TrimRight(string(b), "\x00")
		if _, ok := fsys.resolve(interp); !ok {
			missing = append(missing, interp)
		}
	}
	needed, err := f.DynString(elf.DT_NEEDED)
	if err != nil {
		return missing, nil // a static file has no dynamic section
	}
	rpath, _ := f.DynString(elf.DT_RPATH)
	runpath, _ := f.DynString(elf.DT_RUNPATH)
	origin := path.Dir(p)
	expand := func(list []string) []string {
		var out []string
		for _, l := range list {
			for _, d := range strings.Split(l, ":") {
				if d == "" {
					continue
				}
				d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", "/"+origin), "$ORIGIN", "/"+origin)
				out = append(out, strings.TrimPrefix(path.Clean("/"+d), "/"))
			}
		}
		return out
	}
	var dirs []string
	if len(runpath) == 0 {
		dirs = append(dirs, expand(rpath)...)
	}
	dirs = append(dirs, ldPath...)
	dirs = append(dirs, expand(runpath)...)
	dirs = append(dirs, DefaultLibDirs...)
	for _, n := range needed {
		if strings.Contains(n, "/") {
			if _, ok := fsys.resolve(n); !ok {
				missing = append(missing, n)
			}
			continue
		}
		found := false
		for _, d := range dirs {
			if e, ok := fsys.resolve(path.Join(d, n)); ok && e.typ == tar.TypeReg {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, n)
		}
	}
	return missing, nil
}

// resolve follows symlinks (within the tree, at most 40) from the image
// path p to an entry that is not a symlink.
func (t *Tree) resolve(p string) (*entry, bool) {
	cur := strings.TrimPrefix(path.Clean("/"+p), "/")
	for range 40 {
		// Resolve the parents first: a directory may be a symlink too.
		parts := strings.Split(cur, "/")
		resolved := ""
		restart := false
		for i, part := range parts {
			next := path.Join(resolved, part)
			e, ok := t.entries[next]
			if !ok {
				return nil, false
			}
			if e.typ == tar.TypeSymlink {
				target := e.link
				if !strings.HasPrefix(target, "/") {
					target = path.Join("/"+resolved, target)
				}
				rest := strings.Join(parts[i+1:], "/")
				cur = strings.TrimPrefix(path.Clean(path.Join(target, rest)), "/")
				restart = true
				break
			}
			resolved = next
		}
		if !restart {
			e := t.entries[resolved]
			if e.typ == tar.TypeLink {
				return t.resolve(e.link)
			}
			return e, true
		}
	}
	return nil, false
}
