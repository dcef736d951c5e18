package ociimage

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

//go:embed debian.lock
var debianLock []byte

// Deb is one pinned Debian package of debian.lock.
type Deb struct {
	Set       string // "base" or "cuda"
	Package   string
	Version   string
	Arch      string // amd64, or all
	Suite     string // e.g. bookworm, trixie
	Component string // main, non-free, …
	SHA256    string // of the .deb, hex
}

// Distro is the Debian release the base packages come from.
type Distro struct {
	ID, VersionID, Codename string // debian, 12, bookworm
}

// Lock is the parsed debian.lock.
type Lock struct {
	Distro Distro
	Debs   []Deb
}

// ErrFetch wraps every failure to obtain a pinned package (apt-get or
// npm missing, the version gone from the archive, a hash mismatch).
var ErrFetch = errors.New("ociimage: fetch")

// DebianLock returns the pinned packages (the committed debian.lock).
func DebianLock() (*Lock, error) { return parseLock(debianLock) }

func parseLock(b []byte) (*Lock, error) {
	l := &Lock{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		switch {
		case f[0] == "distro" && len(f) == 4:
			l.Distro = Distro{ID: f[1], VersionID: f[2], Codename: f[3]}
		case len(f) == 6:
			suite, comp, ok := strings.Cut(f[4], "/")
			if _, err := hex.DecodeString(f[5]); !ok || err != nil || len(f[5]) != 64 {
				return nil, fmt.Errorf("ociimage: debian.lock line %d: want SET PACKAGE VERSION ARCH SUITE/COMPONENT SHA256", n)
			}
			l.Debs = append(l.Debs, Deb{Set: f[0], Package: f[1], Version: f[2], Arch: f[3], Suite: suite, Component: comp, SHA256: f[5]})
		default:
			return nil, fmt.Errorf("ociimage: debian.lock line %d: want SET PACKAGE VERSION ARCH SUITE/COMPONENT SHA256", n)
		}
	}
	if l.Distro.Codename == "" {
		return nil, errors.New("ociimage: debian.lock: no distro line")
	}
	return l, sc.Err()
}

// Set returns the packages of one set, in the lock's order.
func (l *Lock) Set(set string) []Deb {
	var ds []Deb
	for _, d := range l.Debs {
		if d.Set == set {
			ds = append(ds, d)
		}
	}
	return ds
}

// CacheDir is where downloaded packages are kept between builds:
// $XDG_CACHE_HOME/pdserve, or ~/.cache/pdserve.
func CacheDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("ociimage: cache directory: %w", err)
	}
	return filepath.Join(d, "pdserve"), nil
}

// debName is the cache file name of d: version and hash in the name, so a
// re-pin never reuses a stale file.
func (d Deb) debName() string {
	v := strings.ReplaceAll(d.Version, ":", "%3a")
	return fmt.Sprintf("%s_%s_%s_%s", d.Package, v, d.Arch, d.SHA256[:16])
}

// Fetched is a pinned package in the cache: the .deb, its extracted tree
// and its control fields.
type Fetched struct {
	Deb
	DebPath string // the verified .deb
	Root    string // the extracted file system (dpkg-deb -x)
	Control []byte // dpkg-deb -f: the control fields
}

// FetchDebs returns the packages ds from the cache under cacheDir,
// downloading the missing ones with apt-get download (a temporary apt
// configuration adds the suites and components the system's sources lack,
// with the system's own mirrors and keyring) and extracting them with
// dpkg-deb. A file whose SHA-256 differs from the lock's is refused. logf,
// if set, is told about each download. Errors wrap ErrFetch.
func FetchDebs(ctx context.Context, cacheDir string, ds []Deb, logf func(format string, args ...any)) ([]Fetched, error) {
	dir := filepath.Join(cacheDir, "debs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFetch, err)
	}
	var missing []Deb
	for _, d := range ds {
		if err := verifyFile(filepath.Join(dir, d.debName()+".deb"), d.SHA256); err != nil {
			missing = append(missing, d)
		}
	}
	if len(missing) > 0 {
		if err := aptDownload(ctx, dir, missing, logf); err != nil {
			return nil, err
		}
	}
	out := make([]Fetched, 0, len(ds))
	for _, d := range ds {
		f, err := extractDeb(ctx, dir, d)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// verifyFile checks that the file p exists and has the SHA-256 want.
func verifyFile(p, want string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s: sha256 %s, want %s", filepath.Base(p), got, want)
	}
	return nil
}

// aptDownload fetches ds into dir (named by debName) and verifies them.
func aptDownload(ctx context.Context, dir string, ds []Deb, logf func(string, ...any)) error {
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("%w: apt-get is needed to download %s (a Debian or Ubuntu machine): %v", ErrFetch, debList(ds), err)
	}
	tmp, err := os.MkdirTemp(dir, ".download-")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrFetch, err)
	}
	defer os.RemoveAll(tmp)
	// apt drops to the _apt user to download: it must be able to write.
	if err := os.Chmod(tmp, 0o777); err != nil {
		return fmt.Errorf("%w: %v", ErrFetch, err)
	}
	sys, err := systemSources()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrFetch, err)
	}
	// Group by the sources each needs: the system's own, or a temporary
	// apt configuration for a suite/component it lacks.
	groups := map[string][]Deb{}
	var keys []string
	for _, d := range ds {
		k := ""
		if !sys.has(d.Suite, d.Component) {
			k = d.Suite + "/" + d.Component
		}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], d)
	}
	slices.Sort(keys)
	for _, k := range keys {
		g := groups[k]
		var opts []string
		if k != "" {
			suite, comp, _ := strings.Cut(k, "/")
			o, err := tempAptConfig(ctx, tmp, sys, suite, comp)
			if err != nil {
				return err
			}
			opts = o
		}
		args := append(slices.Clone(opts), "download")
		for _, d := range g {
			args = append(args, d.Package+":"+d.Arch+"="+d.Version)
		}
		if logf != nil {
			logf("apt-get download %s", debList(g))
		}
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%w: apt-get download %s: %v\n%s\n(a pinned version the archive no longer has: re-pin with `go run ./cmd/mkimage pin`)", ErrFetch, debList(g), err, bytes.TrimSpace(out))
		}
	}
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrFetch, err)
	}
	for _, d := range ds {
		// apt-get names the file PACKAGE_VERSION_ARCH.deb, with ':' as %3a.
		want := fmt.Sprintf("%s_%s_%s.deb", d.Package, strings.ReplaceAll(d.Version, ":", "%3a"), d.Arch)
		if !slices.ContainsFunc(ents, func(e os.DirEntry) bool { return e.Name() == want }) {
			return fmt.Errorf("%w: apt-get download left no %s", ErrFetch, want)
		}
		p := filepath.Join(tmp, want)
		if err := verifyFile(p, d.SHA256); err != nil {
			return fmt.Errorf("%w: %s=%s: %v (debian.lock pins another build: re-pin only if you trust the new one)", ErrFetch, d.Package, d.Version, err)
		}
		if err := os.Rename(p, filepath.Join(dir, d.debName()+".deb")); err != nil {
			return fmt.Errorf("%w: %v", ErrFetch, err)
		}
	}
	return nil
}

func debList(ds []Deb) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.Package + "=" + d.Version
	}
	return strings.Join(s, " ")
}

// aptSource is one "deb" entry of the system's apt sources.
type aptSource struct {
	uris, suites, components []string
	signedBy                 string
}

type aptSources []aptSource

// has reports whether some entry serves suite with component.
func (s aptSources) has(suite, comp string) bool {
	for _, e := range s {
		if slices.Contains(e.suites, suite) && slices.Contains(e.components, comp) {
			return true
		}
	}
	return false
}

// systemSources reads the "deb" entries of /etc/apt/sources.list (one-line
// format) and /etc/apt/sources.list.d/*.list and *.sources (deb822).
func systemSources() (aptSources, error) {
	var out aptSources
	lists, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
	for _, p := range append([]string{"/etc/apt/sources.list"}, lists...) {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			line, _, _ = strings.Cut(line, "#")
			f := strings.Fields(line)
			if len(f) < 3 || f[0] != "deb" {
				continue
			}
			f = f[1:]
			var signed string
			if strings.HasPrefix(f[0], "[") { // [signed-by=… arch=…]
				for len(f) > 0 {
					opt := strings.Trim(f[0], "[]")
					if v, ok := strings.CutPrefix(opt, "signed-by="); ok {
						signed = v
					}
					end := strings.HasSuffix(f[0], "]")
					f = f[1:]
					if end {
						break
					}
				}
			}
			if len(f) < 3 {
				continue
			}
			out = append(out, aptSource{uris: f[:1], suites: f[1:2], components: f[2:], signedBy: signed})
		}
	}
	d822, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	for _, p := range d822 {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, para := range strings.Split(string(b), "\n\n") {
			fields := map[string]string{}
			for _, line := range strings.Split(para, "\n") {
				if strings.HasPrefix(line, "#") {
					continue
				}
				k, v, ok := strings.Cut(line, ":")
				if ok && !strings.HasPrefix(line, " ") {
					fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
				}
			}
			if !slices.Contains(strings.Fields(fields["types"]), "deb") || strings.EqualFold(fields["enabled"], "no") {
				continue
			}
			out = append(out, aptSource{
				uris:       strings.Fields(fields["uris"]),
				suites:     strings.Fields(fields["suites"]),
				components: strings.Fields(fields["components"]),
				signedBy:   fields["signed-by"],
			})
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no apt sources found in /etc/apt")
	}
	return out, nil
}

// tempAptConfig writes an apt configuration under dir whose one source is
// suite/comp on the mirrors (and keyring) of the system's main archive
// (the entry serving the system's release without a -security or
// -updates suffix), runs apt-get update on it and returns the apt-get
// options that select it. The system's configuration is not changed.
func tempAptConfig(ctx context.Context, dir string, sys aptSources, suite, comp string) ([]string, error) {
	var main *aptSource
	for i, e := range sys {
		for _, s := range e.suites {
			if !strings.Contains(s, "-") && !strings.Contains(s, "/") {
				main = &sys[i]
				break
			}
		}
		if main != nil {
			break
		}
	}
	if main == nil {
		return nil, fmt.Errorf("%w: no main Debian archive among the system's apt sources to fetch %s/%s from", ErrFetch, suite, comp)
	}
	root := filepath.Join(dir, "apt-"+suite+"-"+comp)
	for _, d := range []string{"sources.list.d", "preferences.d", "lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrFetch, err)
		}
	}
	src := fmt.Sprintf("Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\n", strings.Join(main.uris, " "), suite, comp)
	if main.signedBy != "" {
		src += "Signed-By: " + main.signedBy + "\n"
	}
	if err := os.WriteFile(filepath.Join(root, "sources.list.d", "pdserve.sources"), []byte(src), 0o644); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFetch, err)
	}
	opts := []string{
		"-o", "Dir::Etc::SourceList=/dev/null",
		"-o", "Dir::Etc::SourceParts=" + filepath.Join(root, "sources.list.d"),
		"-o", "Dir::Etc::Preferences=/dev/null",
		"-o", "Dir::Etc::PreferencesParts=" + filepath.Join(root, "preferences.d"),
		"-o", "Dir::State::Lists=" + filepath.Join(root, "lists"),
		"-o", "Dir::Cache=" + filepath.Join(root, "cache"),
		"-o", "Dir::State::status=/dev/null",
		"-o", "APT::Sandbox::User=root",
	}
	cmd := exec.CommandContext(ctx, "apt-get", append(slices.Clone(opts), "-q", "update")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: apt-get update for %s/%s: %v\n%s", ErrFetch, suite, comp, err, bytes.TrimSpace(out))
	}
	return opts, nil
}

// extractDeb unpacks the cached .deb of d (once) into the cache and reads
// its control fields.
func extractDeb(ctx context.Context, dir string, d Deb) (Fetched, error) {
	deb := filepath.Join(dir, d.debName()+".deb")
	root := filepath.Join(dir, d.debName())
	f := Fetched{Deb: d, DebPath: deb, Root: filepath.Join(root, "root")}
	control := filepath.Join(root, "control")
	if b, err := os.ReadFile(control); err == nil {
		f.Control = b
		return f, nil // complete: control is written last
	}
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		return f, fmt.Errorf("%w: dpkg-deb is needed to unpack %s: %v", ErrFetch, filepath.Base(deb), err)
	}
	os.RemoveAll(root)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return f, fmt.Errorf("%w: %v", ErrFetch, err)
	}
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, f.Root).CombinedOutput(); err != nil {
		return f, fmt.Errorf("%w: dpkg-deb -x %s: %v\n%s", ErrFetch, filepath.Base(deb), err, out)
	}
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-f", deb).Output()
	if err != nil {
		return f, fmt.Errorf("%w: dpkg-deb -f %s: %v", ErrFetch, filepath.Base(deb), err)
	}
	if err := os.WriteFile(control, out, 0o644); err != nil {
		return f, fmt.Errorf("%w: %v", ErrFetch, err)
	}
	f.Control = out
	return f, nil
}

// skipDebPath leaves out of an image what only a package manager, a
// shell or a person at a terminal uses: documentation (but each
// package's copyright, kept for its licence), manual pages, lintian and
// bug-report data, maintainer tools, libstdc++'s debugger scripts, and
// glibc's iconv modules (gconv: nothing in the images calls iconv).
func skipDebPath(rel string, dir bool) bool {
	switch {
	case rel == "usr/share/man", rel == "usr/share/info", rel == "usr/share/lintian",
		rel == "usr/share/bug", rel == "usr/share/locale", rel == "usr/sbin",
		rel == "etc/ca-certificates", rel == "usr/share/ca-certificates",
		rel == "usr/share/gcc", rel == "usr/share/gdb", rel == "usr/lib/x86_64-linux-gnu/gconv":
		return true
	case strings.HasPrefix(rel, "usr/share/doc/"):
		parts := strings.Split(rel, "/") // usr share doc PACKAGE FILE…
		return len(parts) > 5 || (len(parts) == 5 && parts[4] != "copyright")
	}
	return false
}

// AddDebs adds the file systems of the fetched packages to t (documentation
// and maintainer tools left out, see skipDebPath), owned by root, and a
// /var/lib/dpkg/status.d/PACKAGE file of control fields for each, as
// distroless images have, so that image scanners know what is inside.
func AddDebs(t *Tree, fs []Fetched) error {
	for _, f := range fs {
		if err := t.AddHost(f.Root, "/", AddOptions{Skip: skipDebPath}); err != nil {
			return err
		}
		ctl := append(bytes.TrimRight(slices.Clone(f.Control), "\n"), []byte("\nStatus: install ok installed\n")...)
		if err := t.File("/var/lib/dpkg/status.d/"+f.Package, ctl, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Repin returns the lock's packages at the versions apt offers now (the
// candidate of the system's sources, or of a temporary configuration for
// a suite/component they lack), with those versions' SHA-256 from the
// archive's index. Nothing is downloaded; the caller writes the lines.
// Errors wrap ErrFetch.
func Repin(ctx context.Context, ds []Deb) ([]Deb, error) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return nil, fmt.Errorf("%w: apt-cache is needed: %v", ErrFetch, err)
	}
	sys, err := systemSources()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFetch, err)
	}
	tmp, err := os.MkdirTemp("", "pdserve-pin-")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFetch, err)
	}
	defer os.RemoveAll(tmp)
	opts := map[string][]string{}
	out := make([]Deb, 0, len(ds))
	for _, d := range ds {
		var o []string
		if !sys.has(d.Suite, d.Component) {
			k := d.Suite + "/" + d.Component
			if _, ok := opts[k]; !ok {
				if opts[k], err = tempAptConfig(ctx, tmp, sys, d.Suite, d.Component); err != nil {
					return nil, err
				}
			}
			o = opts[k]
		}
		args := append(append([]string{}, o...), "show", "--no-all-versions", d.Package+":"+d.Arch)
		b, err := exec.CommandContext(ctx, "apt-cache", args...).Output()
		if err != nil {
			return nil, fmt.Errorf("%w: apt-cache show %s: %v (run apt-get update first)", ErrFetch, d.Package, err)
		}
		nd := d
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Version: "); ok {
				nd.Version = v
			}
			if v, ok := strings.CutPrefix(line, "SHA256: "); ok {
				nd.SHA256 = v
			}
		}
		out = append(out, nd)
	}
	return out, nil
}

// LockLine formats d as a debian.lock line.
func (d Deb) LockLine() string {
	return fmt.Sprintf("%s %s %s %s %s/%s %s", d.Set, d.Package, d.Version, d.Arch, d.Suite, d.Component, d.SHA256)
}
