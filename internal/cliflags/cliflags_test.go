package cliflags

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		ok       bool
		stderr   string
		wantFlag int
	}{
		{[]string{"--n", "3"}, 0, true, "", 3},
		{[]string{"-h"}, 0, false, "Usage", 0},
		{[]string{"--nope"}, 2, false, "flag provided but not defined", 0},
		{[]string{"--n", "x"}, 2, false, "invalid value", 0},
		{[]string{"--n", "1", "extra"}, 2, false, `tool: unexpected arguments ["extra"]`, 1},
	} {
		var out strings.Builder
		fs := flag.NewFlagSet("tool", flag.ContinueOnError)
		fs.SetOutput(&out)
		fs.Usage = func() { io.WriteString(&out, "Usage: tool\n") }
		n := fs.Int("n", 0, "a number")
		code, ok := Parse(fs, tc.args, &out)
		if code != tc.code || ok != tc.ok || *n != tc.wantFlag || !strings.Contains(out.String(), tc.stderr) {
			t.Errorf("Parse(%q) = %d, %v, n=%d, output %q; want %d, %v, n=%d, output containing %q", tc.args, code, ok, *n, out.String(), tc.code, tc.ok, tc.wantFlag, tc.stderr)
		}
	}
}
