package main

import (
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/flagvocab"
)

// TestFlagVocabulary: every flag name of loadtest's commands, the
// coordinator (and its subcommands) and the two workers has one meaning
// across them all (flagvocab.Check, whose tables say what each shared name
// means). Each flag set is the one the command builds, listed by its
// --help; nothing starts.
func TestFlagVocabulary(t *testing.T) {
	helps := flagvocab.Servers()
	for _, c := range []string{"run", "sweep", "compare", "regress", "check", "prefix-hits", "agentloop", "shift"} {
		helps["loadtest "+c] = flagvocab.Help(func(a []string, o, e *strings.Builder) int { return run(append([]string{c}, a...), o, e) })
	}
	var flags []flagvocab.Flag
	for cmd, help := range helps {
		fs := flagvocab.Parse(cmd, help)
		if len(fs) == 0 && cmd != "coordinator profiles" && cmd != "coordinator calibrate" {
			t.Errorf("%s --help lists no flags:\n%s", cmd, help)
		}
		flags = append(flags, fs...)
	}
	for _, p := range flagvocab.Check(flags, true) {
		t.Error(p)
	}
}
