package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/internal/ociimage"
)

// pinCmd prints debian.lock's package lines at the versions apt offers
// now, to replace those of internal/ociimage/debian.lock when the archive
// has dropped a pinned version.
func pinCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mkimage pin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: mkimage pin

Prints the package lines of internal/ociimage/debian.lock at the versions apt
offers now (apt-cache show; run apt-get update first), with their SHA-256 from
the archive's signed index. Paste them over the old lines when a pinned
version is gone from the archive, and review the diff.
`)
	}
	if code, ok := cliflags.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	lock, err := ociimage.DebianLock()
	if err != nil {
		fmt.Fprintln(stderr, "mkimage pin:", err)
		return 1
	}
	ds, err := ociimage.Repin(ctx, lock.Debs)
	if err != nil {
		fmt.Fprintln(stderr, "mkimage pin:", err)
		return 1
	}
	for i, d := range ds {
		mark := ""
		if d.Version != lock.Debs[i].Version || d.SHA256 != lock.Debs[i].SHA256 {
			mark = "  # was " + lock.Debs[i].Version
		}
		fmt.Fprintln(stdout, d.LockLine()+mark)
	}
	return 0
}
