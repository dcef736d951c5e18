// Package cliflags parses the command line of pdserve's binaries and
// subcommands the same way everywhere: -h prints the usage and exits 0, a
// bad flag or an argument after the flags exits 2 with a message.
package cliflags

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// Parse parses args into fs, a ContinueOnError flag set named after its
// command (the name starts error messages). ok reports whether the command
// goes on; otherwise code is its exit status: 0 after -h or --help (fs
// printed its usage), 2 after a bad flag (fs printed the error) or a
// positional argument (Parse prints "NAME: unexpected arguments [...]" to
// stderr).
func Parse(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return 2, false
	}
	return 0, true
}
