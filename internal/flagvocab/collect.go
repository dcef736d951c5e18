package flagvocab

import (
	"bufio"
	"context"
	"regexp"
	"strings"

	"github.com/pdserve/pdserve/pkg/coordinatorrun"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// Flag is one flag of a command, as its --help lists it.
type Flag struct {
	Command string // "coordinator", "coordinator plan", "loadtest run", …
	Name    string // without dashes
	// Former is the flag this name stands for when it is a former name
	// (cliflags.AddRenamed: its usage reads "former name of --NEW"), else "".
	Former string
	// Usage is the flag's type word and usage text, as --help prints
	// them: one registration (the same AddFlags in several binaries)
	// prints the same in each.
	Usage string
}

var (
	flagLine   = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9_.-]*)(?: .*)?$`)
	formerLine = regexp.MustCompile(`^\s+former name of --([A-Za-z0-9_.-]+)`)
)

// Parse returns the flags of command from its --help text, as the flag
// package's PrintDefaults (and cliflags.PrintGroups) print them: each flag
// on a line "  -NAME [TYPE]", its usage on the lines below.
func Parse(command, help string) []Flag {
	var out []Flag
	first := false // the next usage line is the flag's first
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		line := sc.Text()
		if m := flagLine.FindStringSubmatch(line); m != nil {
			out = append(out, Flag{Command: command, Name: m[1], Usage: strings.TrimSpace(strings.TrimPrefix(line, "  -"+m[1]))})
			first = true
			continue
		}
		if len(out) == 0 || !strings.HasPrefix(line, "    ") {
			first = false
			continue
		}
		f := &out[len(out)-1]
		if m := formerLine.FindStringSubmatch(line); m != nil && first {
			f.Former = m[1]
		}
		first = false
		f.Usage = strings.TrimSpace(f.Usage + " " + strings.TrimSpace(line))
	}
	return out
}

// Help runs a command's entry point with --help, as its main would, and
// returns what it printed (stdout and stderr together). Nothing starts:
// --help prints the flag set the command built and returns.
func Help(main func(args []string, stdout, stderr *strings.Builder) int) string {
	var out strings.Builder
	main([]string{"--help"}, &out, &out)
	return out.String()
}

// Servers returns the --help texts of the coordinator, each of its
// subcommands ("coordinator plan", …), the prefill worker and the decode
// worker, by command.
func Servers() map[string]string {
	ctx := context.Background()
	h := map[string]string{
		"coordinator": Help(func(a []string, o, e *strings.Builder) int { return coordinatorrun.Main(ctx, a, o, e) }),
		"prefill-worker": Help(func(a []string, o, e *strings.Builder) int {
			return workerrun.Main(ctx, "prefill-worker", workerrun.NewPrefillOptions(), a, o, e)
		}),
		"decode-worker": Help(func(a []string, o, e *strings.Builder) int {
			return workerrun.Main(ctx, "decode-worker", workerrun.NewDecodeOptions(), a, o, e)
		}),
	}
	for _, s := range coordinatorrun.Subcommands() {
		h["coordinator "+s.Name] = Help(func(a []string, o, e *strings.Builder) int { return s.Run(ctx, a, o, e) })
	}
	return h
}
