package cliflags

import (
	"slices"
	"strings"
)

// Without returns args (flags as "--name value", "--name=value" or a bare
// "--name", one or two dashes) without the flags named in names, and
// without the value that follows a dropped "--name" when that value does
// not start with "-" (a boolean flag given bare before a positional
// argument would take it: give booleans as --name=true). It returns a new
// slice; args is not changed.
func Without(args, names []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		name, _, inline := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") || !slices.Contains(names, name) {
			out = append(out, args[i])
			continue
		}
		if !inline && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++ // its value
		}
	}
	return out
}
