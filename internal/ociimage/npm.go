package ociimage

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha512"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

//go:embed npm.lock
var npmLock []byte

// NpmPackage is one pinned npm package of npm.lock.
type NpmPackage struct {
	Name, Version string
	Integrity     string // "sha512-BASE64" of the .tgz, as the registry gives it
}

// NpmLock returns the pinned npm packages (the committed npm.lock).
func NpmLock() ([]NpmPackage, error) {
	var ps []NpmPackage
	sc := bufio.NewScanner(bytes.NewReader(npmLock))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 || !strings.HasPrefix(f[2], "sha512-") {
			return nil, fmt.Errorf("ociimage: npm.lock line %d: want NAME VERSION sha512-…", n)
		}
		ps = append(ps, NpmPackage{Name: f[0], Version: f[1], Integrity: f[2]})
	}
	return ps, sc.Err()
}

// NpmPinned returns the pinned package called name.
func NpmPinned(name string) (NpmPackage, error) {
	ps, err := NpmLock()
	if err != nil {
		return NpmPackage{}, err
	}
	for _, p := range ps {
		if p.Name == name {
			return p, nil
		}
	}
	return NpmPackage{}, fmt.Errorf("ociimage: npm.lock pins no %s", name)
}

func (p NpmPackage) sha512Hex() (string, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(p.Integrity, "sha512-"))
	if err != nil || len(b) != sha512.Size {
		return "", fmt.Errorf("ociimage: %s@%s: bad integrity %q", p.Name, p.Version, p.Integrity)
	}
	return hex.EncodeToString(b), nil
}

// FetchNpm returns the directory of the unpacked package p (its "package"
// folder) in the cache under cacheDir, downloading it with `npm pack`
// when missing and verifying its integrity. No package script runs.
// Errors wrap ErrFetch.
func FetchNpm(ctx context.Context, cacheDir string, p NpmPackage, logf func(string, ...any)) (string, error) {
	sum, err := p.sha512Hex()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, "npm")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("%w: %v", ErrFetch, err)
	}
	base := strings.NewReplacer("@", "", "/", "-").Replace(p.Name) + "-" + p.Version + "-" + sum[:16]
	tgz := filepath.Join(dir, base+".tgz")
	root := filepath.Join(dir, base)
	done := filepath.Join(root, ".complete")
	if _, err := os.Stat(done); err == nil {
		return filepath.Join(root, "package"), nil
	}
	if err := verifySHA512(tgz, sum); err != nil {
		if _, err := exec.LookPath("npm"); err != nil {
			return "", fmt.Errorf("%w: npm is needed to download %s@%s (Debian package npm, or Node.js): %v", ErrFetch, p.Name, p.Version, err)
		}
		tmp, err := os.MkdirTemp(dir, ".download-")
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrFetch, err)
		}
		defer os.RemoveAll(tmp)
		if logf != nil {
			logf("npm pack %s@%s", p.Name, p.Version)
		}
		cmd := exec.CommandContext(ctx, "npm", "pack", "--silent", "--ignore-scripts", "--pack-destination", tmp, p.Name+"@"+p.Version)
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("%w: npm pack %s@%s: %v\n%s", ErrFetch, p.Name, p.Version, err, bytes.TrimSpace(out))
		}
		got, _ := filepath.Glob(filepath.Join(tmp, "*.tgz"))
		if len(got) != 1 {
			return "", fmt.Errorf("%w: npm pack %s@%s left %d tarballs", ErrFetch, p.Name, p.Version, len(got))
		}
		if err := verifySHA512(got[0], sum); err != nil {
			return "", fmt.Errorf("%w: %s@%s: %v (npm.lock pins another tarball)", ErrFetch, p.Name, p.Version, err)
		}
		if err := os.Rename(got[0], tgz); err != nil {
			return "", fmt.Errorf("%w: %v", ErrFetch, err)
		}
	}
	os.RemoveAll(root)
	if err := untarGz(tgz, root); err != nil {
		return "", fmt.Errorf("%w: unpack %s: %v", ErrFetch, filepath.Base(tgz), err)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		return "", fmt.Errorf("%w: %v", ErrFetch, err)
	}
	return filepath.Join(root, "package"), nil
}

func verifySHA512(p, want string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha512.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s: sha512 %s…, want %s…", filepath.Base(p), got[:16], want[:16])
	}
	return nil
}

// untarGz unpacks the regular files and directories of an npm tarball
// into dst (npm tarballs hold nothing else), refusing paths that leave it.
func untarGz(src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	return untarFiles(zr, dst)
}
