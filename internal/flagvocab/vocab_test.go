package flagvocab

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/repotest"
)

// TestFlagVocabulary: every name of the coordinator (and its subcommands)
// and of the two workers has one meaning (Check). loadtest's flag sets
// join them in loadtest's TestFlagVocabulary (package main).
func TestFlagVocabulary(t *testing.T) {
	var flags []Flag
	for cmd, help := range Servers() {
		fs := Parse(cmd, help)
		if len(fs) == 0 && cmd != "coordinator profiles" && cmd != "coordinator calibrate" {
			t.Errorf("%s --help lists no flags:\n%s", cmd, help)
		}
		flags = append(flags, fs...)
	}
	for _, p := range Check(flags, false) {
		t.Error(p)
	}
}

// TestFlagsRead: no flag of pdserve's binaries is accepted and read
// nowhere: each flag bound to a struct field has its field read (Unread).
func TestFlagsRead(t *testing.T) {
	root := repotest.Root(t)
	var dirs []string
	for _, d := range []string{"cmd", "pkg", "internal", "loadtest"} {
		dirs = append(dirs, filepath.Join(root, d))
	}
	unread, err := Unread(dirs...)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range unread {
		t.Error(u)
	}
}

// TestCheckFindsClashes: planted clashes, each a way a name gets a second
// meaning, fail Check; one flag with different defaults does not.
func TestCheckFindsClashes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []Flag
		want  string // substring of the one problem; "" for none
	}{
		{"two former names of two flags", []Flag{
			{Command: "coordinator", Name: "x-limit", Former: "max-admitted-requests", Usage: "value former name of --max-admitted-requests"},
			{Command: "prefill-worker", Name: "x-limit", Former: "max-live-prefills", Usage: "value former name of --max-live-prefills"}},
			"--x-limit carries 2 meanings: --max-admitted-requests (in coordinator); --max-live-prefills (in prefill-worker)"},
		{"a former name and another flag", []Flag{
			{Command: "coordinator plan", Name: "x-gbps", Usage: "float bandwidth between the pools"},
			{Command: "prefill-worker", Name: "x-gbps", Former: "pace-gbps", Usage: "value former name of --pace-gbps"}},
			"--x-gbps carries 2 meanings: --pace-gbps (in prefill-worker); --x-gbps (in coordinator plan)"},
		{"two registrations, no meaning said", []Flag{
			{Command: "coordinator plan", Name: "x-tokens", Usage: "int the step budget"},
			{Command: "prefill-worker", Name: "x-tokens", Usage: "int one sequence's chunk"}},
			"--x-tokens has 2 registrations with different usages"},
		{"one registration, two defaults", []Flag{
			{Command: "loadtest run", Name: "x-gpus", Usage: "int GPUs (default 3)"},
			{Command: "loadtest sweep", Name: "x-gpus", Usage: "int GPUs (default 1)"}},
			""},
		{"one meaning said", []Flag{
			{Command: "coordinator codecs", Name: "budget", Usage: "duration time the benchmark takes"},
			{Command: "coordinator profile", Name: "budget", Usage: "duration wall time the measurement may take"}},
			""},
	} {
		got := Check(tc.flags, false)
		switch {
		case tc.want == "" && len(got) > 0:
			t.Errorf("%s: %q, want no problem", tc.name, got)
		case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
			t.Errorf("%s: %q, want one problem with %q", tc.name, got, tc.want)
		}
	}
	// With every binary's flags, a table entry that no command needs is
	// a problem too.
	if got := Check([]Flag{{Command: "c", Name: "budget", Usage: "duration x"}}, true); !slices.ContainsFunc(got, func(p string) bool {
		return strings.Contains(p, "--budget is in Meanings but has one registration")
	}) {
		t.Errorf("stale Meanings entry not reported: %q", got)
	}
}

func TestParse(t *testing.T) {
	help := "Usage: tool [flags]\n\nGroup:\n  -max-batch-tokens int\n    \ttoken budget (default 2048)\n  -quiet\n    \tless output\n" +
		"\nDeprecated (former names, removed in the next release):\n  -chunk-tokens value\n    \tformer name of --max-batch-tokens, removed in the next release\n"
	want := []Flag{
		{Command: "tool", Name: "max-batch-tokens", Usage: "int token budget (default 2048)"},
		{Command: "tool", Name: "quiet", Usage: "less output"},
		{Command: "tool", Name: "chunk-tokens", Former: "max-batch-tokens", Usage: "value former name of --max-batch-tokens, removed in the next release"},
	}
	if got := Parse("tool", help); !slices.Equal(got, want) {
		t.Errorf("Parse = %+v, want %+v", got, want)
	}
}

// TestUnread: a flag bound to a field nothing reads is found; one whose
// field is read is not.
func TestUnread(t *testing.T) {
	dir := t.TempDir()
	src := `package p

import "flag"

type options struct{ Used, Ignored int }

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.Used, "used", 0, "")
	fs.IntVar(&o.Ignored, "ignored", 0, "")
}

func (o options) run() int { return o.Used }
`
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Unread(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !strings.HasSuffix(got[0], "p.go:9: --ignored sets .Ignored, which nothing reads") {
		t.Errorf("Unread = %q, want --ignored only", got)
	}
}
