package ociimage

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The non-root user of the images, as distroless names it.
const (
	NonRootUID  = 65532
	NonRootName = "nonroot"
)

const passwd = `root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
`

const group = `root:x:0:
tty:x:5:
staff:x:50:
nogroup:x:65534:
nonroot:x:65532:
`

// nsswitch.conf as Debian's base-files has it, for the files and dns
// sources only (the image has no other NSS modules).
const nsswitch = `passwd:         files
group:          files
shadow:         files
hosts:          files dns
networks:       files
protocols:      files
services:       files
ethers:         files
rpc:            files
`

// GlibcBase returns the tree of the glibc base: the base set of the
// lock's Debian packages (fetched into cacheDir; see FetchDebs), minus
// their documentation, plus what their maintainer scripts or base-files
// would have made: /etc/ssl/certs/ca-certificates.crt (the Mozilla
// bundle of ca-certificates, concatenated in name order as
// update-ca-certificates does), /etc/passwd and /etc/group with root,
// nobody and nonroot (65532), /etc/nsswitch.conf, /etc/os-release, the
// home of nonroot (0700, 65532), /root (0700) and /tmp (1777). Errors from
// fetching wrap ErrFetch.
func GlibcBase(ctx context.Context, cacheDir string, logf func(string, ...any)) (*Tree, error) {
	lock, err := DebianLock()
	if err != nil {
		return nil, err
	}
	fs, err := FetchDebs(ctx, cacheDir, lock.Set("base"), logf)
	if err != nil {
		return nil, err
	}
	t := NewTree()
	if err := AddDebs(t, fs); err != nil {
		return nil, err
	}
	var bundle []byte
	for _, f := range fs {
		if f.Package != "ca-certificates" {
			continue
		}
		crts, err := filepath.Glob(filepath.Join(f.Root, "usr/share/ca-certificates/mozilla/*.crt"))
		if err != nil {
			return nil, err
		}
		slices.Sort(crts)
		for _, c := range crts {
			b, err := os.ReadFile(c)
			if err != nil {
				return nil, fmt.Errorf("ociimage: CA bundle: %w", err)
			}
			bundle = append(bundle, b...)
			if !bytes.HasSuffix(b, []byte("\n")) {
				bundle = append(bundle, '\n')
			}
		}
	}
	if len(bundle) == 0 {
		return nil, fmt.Errorf("ociimage: glibc base: no certificates in ca-certificates")
	}
	d := lock.Distro
	osRelease := fmt.Sprintf("PRETTY_NAME=\"pdserve base (%s %s packages)\"\nNAME=\"pdserve base\"\nID=%s\nVERSION_ID=\"%s\"\nVERSION_CODENAME=%s\n",
		strings.ToUpper(d.ID[:1])+d.ID[1:], d.VersionID, d.ID, d.VersionID, d.Codename)
	for _, f := range []struct {
		path string
		data string
	}{
		{"etc/ssl/certs/ca-certificates.crt", string(bundle)},
		{"etc/passwd", passwd},
		{"etc/group", group},
		{"etc/nsswitch.conf", nsswitch},
		{"etc/os-release", osRelease},
	} {
		if err := t.File(f.path, []byte(f.data), 0o644); err != nil {
			return nil, err
		}
	}
	for _, d := range []struct {
		path     string
		mode     os.FileMode
		uid, gid int
	}{
		{"home/" + NonRootName, 0o700, NonRootUID, NonRootUID},
		{"root", 0o700, 0, 0},
		{"tmp", 0o777 | os.ModeSticky, 0, 0},
	} {
		if err := t.Dir(d.path, d.mode, d.uid, d.gid); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// BaseDescription names the base's release and packages, for image
// history: "debian 12 bookworm: libc6 2.36-9+deb12u14, …".
func BaseDescription() string {
	lock, err := DebianLock()
	if err != nil {
		return "unknown"
	}
	var ps []string
	for _, d := range lock.Set("base") {
		ps = append(ps, d.Package+" "+d.Version)
	}
	return fmt.Sprintf("%s %s %s: %s", lock.Distro.ID, lock.Distro.VersionID, lock.Distro.Codename, strings.Join(ps, ", "))
}
