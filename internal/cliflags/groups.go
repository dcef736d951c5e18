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
// order, a group without flags of fs left out, then the former names of
// flags (AddRenamed) under "Deprecated", and the flags no group names
// last under "Other". It returns those flags' names, so that a test can
// require that every flag has its place.
func PrintGroups(w io.Writer, fs *flag.FlagSet, groups []Group) (ungrouped []string) {
	deprecated, other := len(groups), len(groups)+1
	sets := make([]*flag.FlagSet, len(groups)+2)
	for i := range sets {
		sets[i] = flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
		sets[i].SetOutput(w)
	}
	fs.VisitAll(func(f *flag.Flag) {
		i := other
		if isAlias(f) {
			i = deprecated
		} else {
			for j, g := range groups {
				if g.holds(f.Name) {
					i = j
					break
				}
			}
		}
		if i == other {
			ungrouped = append(ungrouped, f.Name)
		}
		v := f.Value
		if r, ok := v.(*recorded); ok {
			v = r.Value // the flag's own Value: its type name and zero value
		}
		sets[i].Var(v, f.Name, f.Usage)
		sets[i].Lookup(f.Name).DefValue = f.DefValue
	})
	titles := make([]string, len(sets))
	for i, g := range groups {
		titles[i] = g.Title
	}
	titles[deprecated] = "Deprecated (former names, removed in the next release)"
	titles[other] = "Other"
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
