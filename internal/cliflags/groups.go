package cliflags

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// Group is a section of a command's --help: a title and the flags it
// holds, each named in full or, ending in "*", by a prefix of its name.
type Group struct {
	Title string
	Flags []string
}

// holds reports whether g names the flag called name.
func (g Group) holds(name string) bool {
	for _, f := range g.Flags {
		if p, ok := strings.CutSuffix(f, "*"); ok && strings.HasPrefix(name, p) || f == name {
			return true
		}
	}
	return false
}

// PrintGroups prints fs's flags as PrintDefaults does, but section by
// section: each flag under the first group that names it, the groups in
// order, a group without flags of fs left out, and the flags no group
// names last under "Other". It returns those flags' names, so that a test
// can require that every flag has its place.
func PrintGroups(w io.Writer, fs *flag.FlagSet, groups []Group) (ungrouped []string) {
	sets := make([]*flag.FlagSet, len(groups)+1)
	for i := range sets {
		sets[i] = flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
		sets[i].SetOutput(w)
	}
	fs.VisitAll(func(f *flag.Flag) {
		i := len(groups)
		for j, g := range groups {
			if g.holds(f.Name) {
				i = j
				break
			}
		}
		if i == len(groups) {
			ungrouped = append(ungrouped, f.Name)
		}
		sets[i].Var(f.Value, f.Name, f.Usage)
		sets[i].Lookup(f.Name).DefValue = f.DefValue
	})
	titles := make([]string, len(sets))
	for i, g := range groups {
		titles[i] = g.Title
	}
	titles[len(groups)] = "Other"
	first := true
	for i, s := range sets {
		n := 0
		s.VisitAll(func(*flag.Flag) { n++ })
		if n == 0 {
			continue
		}
		if !first {
			fmt.Fprintln(w)
		}
		first = false
		fmt.Fprintf(w, "%s:\n", titles[i])
		s.PrintDefaults()
	}
	return ungrouped
}
