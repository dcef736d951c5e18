package cliflags

import (
	"errors"
	"flag"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// AddVersion registers --version on fs: Parse then prints Version(fs.Name())
// to stdout and stops with exit code 0, whatever the other flags say.
func AddVersion(fs *flag.FlagSet) {
	fs.Var(&versionFlag{}, "version", "print the version (module version, VCS revision, Go version) and exit")
}

// versionFlag is --version: a boolean flag that remembers it was given.
type versionFlag struct{ set bool }

func (v *versionFlag) String() string   { return "false" }
func (v *versionFlag) IsBoolFlag() bool { return true }
func (v *versionFlag) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("parse error") // as the flag package's own booleans say
	}
	v.set = b
	return nil
}

// Version returns the version line of the binary name, from the build
// information the Go toolchain stamped into it:
//
//	coordinator (devel) revision 4154476e2f1a…+dirty go1.25.0 linux/amd64
//
// The module version is "(devel)" for a build from a checkout (a version
// such as v1.2.0 when built with go install MODULE@VERSION). The revision
// is there when the build recorded the VCS state (go build in a Git
// checkout; not with -buildvcs=false, nor go run), "+dirty" when the
// working tree had changes.
func Version(name string) string {
	bi, _ := debug.ReadBuildInfo()
	return formatVersion(name, bi)
}

func formatVersion(name string, bi *debug.BuildInfo) string {
	mod, rev, dirty := "(unknown)", "", false
	if bi != nil {
		if bi.Main.Version != "" {
			mod = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	parts := []string{name, mod}
	if rev != "" {
		if dirty {
			rev += "+dirty"
		}
		parts = append(parts, "revision", rev)
	}
	return strings.Join(append(parts, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH), " ")
}
