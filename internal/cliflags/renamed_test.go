package cliflags

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

// renamedSet is a flag set with --limit (formerly --queue-limit) and
// --verbose (formerly --chatty, a boolean), beside --other.
func renamedSet() (fs *flag.FlagSet, limit *int, verbose *bool) {
	fs = flag.NewFlagSet("tool", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	limit = fs.Int("limit", 7, "a limit")
	verbose = fs.Bool("verbose", false, "talk")
	fs.Int("other", 0, "another")
	AddRenamed(fs, Renamed{Old: "queue-limit", New: "limit"}, Renamed{Old: "chatty", New: "verbose"})
	return fs, limit, verbose
}

// TestRenamed: a former name sets its flag, which then counts as given; a
// former name and its flag given the same value agree (as the flag prints
// it), different values are an error naming both; RenamedGiven lists the
// former names given.
func TestRenamed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		limit   int
		verbose bool
		given   []string // fs.Visit's names
		renamed []Renamed
		stderr  string // "": ok
	}{
		{"defaults", nil, 7, false, nil, nil, ""},
		{"new name", []string{"--limit=3"}, 3, false, []string{"limit"}, nil, ""},
		{"old name", []string{"--queue-limit", "3"}, 3, false, []string{"limit", "queue-limit"},
			[]Renamed{{"queue-limit", "limit"}}, ""},
		{"old name to 0", []string{"--queue-limit=0"}, 0, false, []string{"limit", "queue-limit"},
			[]Renamed{{"queue-limit", "limit"}}, ""},
		{"old boolean", []string{"--chatty"}, 7, true, []string{"chatty", "verbose"},
			[]Renamed{{"chatty", "verbose"}}, ""},
		{"both, same value", []string{"--limit=10", "--queue-limit=+10"}, 10, false, []string{"limit", "queue-limit"},
			[]Renamed{{"queue-limit", "limit"}}, ""},
		{"both, new last", []string{"--queue-limit=4", "--limit=3"}, 0, false, nil, nil,
			"tool: --queue-limit 4 and --limit 3: --queue-limit is the former name of --limit; give one\n"},
		{"both, old last", []string{"--limit=3", "--queue-limit=4"}, 0, false, nil, nil,
			"tool: --queue-limit 4 and --limit 3: --queue-limit is the former name of --limit; give one\n"},
		{"two conflicts", []string{"--limit=3", "--queue-limit=4", "--verbose=false", "--chatty"}, 0, false, nil, nil,
			"tool: --chatty true and --verbose false: --chatty is the former name of --verbose; give one\n" +
				"tool: --queue-limit 4 and --limit 3: --queue-limit is the former name of --limit; give one\n"},
		{"bad value under the old name", []string{"--queue-limit=x"}, 0, false, nil, nil,
			"tool: invalid value \"x\" for flag -queue-limit: parse error\nRun 'tool --help' for usage.\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, limit, verbose := renamedSet()
			var stdout, stderr strings.Builder
			code, ok := Parse(fs, tc.args, &stdout, &stderr)
			if tc.stderr != "" {
				if ok || code != 2 || stderr.String() != tc.stderr {
					t.Errorf("Parse(%q) = %d, %v, stderr %q; want 2, false, %q", tc.args, code, ok, stderr.String(), tc.stderr)
				}
				return
			}
			if !ok || stderr.Len() != 0 {
				t.Fatalf("Parse(%q) = %d, %v, stderr %q", tc.args, code, ok, stderr.String())
			}
			if *limit != tc.limit || *verbose != tc.verbose {
				t.Errorf("Parse(%q): limit %d, verbose %v; want %d, %v", tc.args, *limit, *verbose, tc.limit, tc.verbose)
			}
			var given []string
			fs.Visit(func(f *flag.Flag) { given = append(given, f.Name) })
			if !slices.Equal(given, tc.given) {
				t.Errorf("Parse(%q): given %v, want %v", tc.args, given, tc.given)
			}
			if got := RenamedGiven(fs); !slices.Equal(got, tc.renamed) {
				t.Errorf("RenamedGiven = %v, want %v", got, tc.renamed)
			}
		})
	}
}

func TestRenamedNames(t *testing.T) {
	fs, _, _ := renamedSet()
	for _, tc := range []struct {
		name, current string
		renamed       bool
	}{{"queue-limit", "limit", true}, {"limit", "limit", false}, {"other", "other", false}, {"nope", "nope", false}} {
		if c, r := CurrentName(fs, tc.name); c != tc.current || r != tc.renamed {
			t.Errorf("CurrentName(%q) = %q, %v; want %q, %v", tc.name, c, r, tc.current, tc.renamed)
		}
	}
	if got, want := (Renamed{"queue-limit", "limit"}).Deprecation(), "flag --queue-limit is deprecated, use --limit"; got != want {
		t.Errorf("Deprecation() = %q, want %q", got, want)
	}
}

// TestRenamedHelp: former names are listed under Deprecated, not Other,
// even where a group names them; a flag no group names is still Other.
func TestRenamedHelp(t *testing.T) {
	fs, _, _ := renamedSet()
	var out strings.Builder
	rest := PrintGroups(&out, fs, []Group{{Title: "Main", Flags: []string{"limit", "verbose", "queue-*"}}})
	got := out.String()
	if !slices.Equal(rest, []string{"other"}) {
		t.Errorf("ungrouped %v, want [other]", rest)
	}
	want := "Main:\n  -limit int\n    \ta limit (default 7)\n  -verbose\n    \ttalk\n\n" +
		"Deprecated (former names, removed in the next release):\n" +
		"  -chatty\n    \tformer name of --verbose, removed in the next release\n" +
		"  -queue-limit value\n    \tformer name of --limit, removed in the next release\n\n" +
		"Other:\n  -other int\n    \tanother\n"
	if got != want {
		t.Errorf("help:\n%s\nwant:\n%s", got, want)
	}
}

func TestAddRenamedUndefined(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("AddRenamed to an undefined flag did not panic")
		}
	}()
	AddRenamed(flag.NewFlagSet("x", flag.ContinueOnError), Renamed{Old: "a", New: "b"})
}
