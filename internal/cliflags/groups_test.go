package cliflags

import (
	"bytes"
	"flag"
	"slices"
	"strings"
	"testing"
)

// TestPrintGroups: each flag is printed once, under the first group that
// names it (in full or by prefix), with its usage and default; groups
// without flags are left out; the rest go under "Other" and are returned.
func TestPrintGroups(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.String("http-addr", ":8080", "listen address")
	fs.Int("http-max", 3, "a limit")
	fs.Bool("tls-cert", false, "a certificate")
	fs.Duration("odd", 0, "an odd one")
	var out bytes.Buffer
	rest := PrintGroups(&out, fs, []Group{
		{Title: "HTTP", Flags: []string{"http-*"}},
		{Title: "Empty", Flags: []string{"nothing"}},
		{Title: "TLS", Flags: []string{"tls-cert", "http-max"}},
	})
	got := out.String()
	if !slices.Equal(rest, []string{"odd"}) {
		t.Errorf("ungrouped %v, want [odd]", rest)
	}
	for _, want := range []string{"HTTP:\n  -http-addr string\n    \tlisten address (default \":8080\")\n  -http-max int\n", "\nTLS:\n  -tls-cert\n", "\nOther:\n  -odd duration\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("help lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "Empty") || strings.Count(got, "-http-max") != 1 {
		t.Errorf("an empty group printed, or a flag twice:\n%s", got)
	}
	if h, tl, o := strings.Index(got, "HTTP:"), strings.Index(got, "TLS:"), strings.Index(got, "Other:"); !(h < tl && tl < o) {
		t.Errorf("sections out of order:\n%s", got)
	}
}
