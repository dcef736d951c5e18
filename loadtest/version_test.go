package main

import (
	"bytes"
	"testing"

	"github.com/pdserve/pdserve/internal/cliflags"
)

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "-version", "version"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{arg}, &stdout, &stderr); code != exitOK || stdout.String() != cliflags.Version("loadtest")+"\n" || stderr.Len() != 0 {
			t.Errorf("loadtest %s: exit %d, stdout %q, stderr %q; want exit 0 and the version line", arg, code, stdout.String(), stderr.String())
		}
	}
}
